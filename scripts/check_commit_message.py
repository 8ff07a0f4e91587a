"""The commit-message rule of this repository (pre-commit's ``commit-msg`` hook runs it): a
subject of at most 72 characters, and any detail in a body below a blank line.

    python scripts/check_commit_message.py .git/COMMIT_EDITMSG
"""

from __future__ import annotations

import sys
from pathlib import Path

MAX_SUBJECT = 72


def problems(message: str) -> list[str]:
    """What is wrong with ``message`` (git's comment lines left out); empty when nothing."""
    lines = [line for line in message.splitlines() if not line.startswith("#")]
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines or not lines[0].strip():
        return ["the subject line is empty"]
    found = []
    if len(lines[0]) > MAX_SUBJECT:
        found.append(
            f"the subject has {len(lines[0])} characters (at most {MAX_SUBJECT}): "
            "put the detail in the body"
        )
    if len(lines) > 1 and lines[1].strip():
        found.append("the second line must be blank: the body starts on the third")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: check_commit_message.py MESSAGE_FILE", file=sys.stderr)
        return 2
    found = problems(Path(argv[0]).read_text(encoding="utf-8"))
    for problem in found:
        print(f"commit message: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
