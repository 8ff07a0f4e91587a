"""docs/conformance.md lists every case of both suites, in order, as the suites say what they
check (so the page cannot fall behind the code)."""

from __future__ import annotations

import re
from pathlib import Path

from rollnet.reference.conformance.worker import WORKER_CASES
from rollnet.sdk.conformance import CASES

DOC = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
ROW = re.compile(r"^\| `([a-z_]+\.[a-z_0-9]+)` \| (.+) \|$")


def _table(after: str) -> list[tuple[str, ...]]:
    text = DOC.read_text()
    start = text.index("| Case | Checks |", text.index(after))
    end = text.index("\n\n", start)
    return [m.groups() for m in map(ROW.match, text[start:end].splitlines()) if m]


def test_the_case_tables_are_the_suites() -> None:
    assert _table("## What a case checks") == [(case.name, case.summary) for case in CASES]
    assert _table("## The worker suite") == [(c.name, c.summary) for c in WORKER_CASES]
