"""``scripts/check_commit_message.py``: short subjects, the detail in a body below a blank line."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from script_testing import ROOT, load_file


def _module() -> ModuleType:
    return load_file(ROOT / "scripts/check_commit_message.py")


def test_a_short_subject_with_a_body_below_a_blank_line_passes() -> None:
    check = _module()
    message = "Ledger: one claim outcome\n\nThe detail, as long as it needs.\n# a git comment\n"
    assert check.problems(message) == []
    assert check.problems("Docs: a subject alone\n\n") == []


def test_a_long_subject_a_missing_blank_line_and_an_empty_message_are_named(
    tmp_path: Path,
) -> None:
    check = _module()
    (long,) = check.problems("x" * 73)
    assert "73 characters (at most 72)" in long
    (glued,) = check.problems("Subject\nbody right below it\n")
    assert "second line must be blank" in glued
    assert check.problems("# only a comment\n\n") == ["the subject line is empty"]
    message = tmp_path / "COMMIT_EDITMSG"
    message.write_text("y" * 80 + "\n")
    assert check.main([str(message)]) == 1
    message.write_text("Short\n")
    assert check.main([str(message)]) == 0
