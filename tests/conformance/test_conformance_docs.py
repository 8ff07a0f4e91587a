"""docs/conformance.md lists every case of the coordinator suite, in order, as the suite says
what it checks (so the page cannot fall behind the code)."""

from __future__ import annotations

import re
from pathlib import Path

from rollnet.sdk.conformance import CASES

DOC = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
ROW = re.compile(r"^\| `([a-z_]+\.[a-z_0-9]+)` \| (.+) \|$")


def test_the_case_table_is_the_suite() -> None:
    text = DOC.read_text()
    table = text[text.index("| Case | Checks |") :]
    rows = [m.groups() for m in map(ROW.match, table.splitlines()) if m]
    assert rows == [(case.name, case.summary) for case in CASES]
