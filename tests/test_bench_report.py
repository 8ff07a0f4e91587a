"""``scripts/bench_report.py --update``: a re-run benchmark replaces its section, the rest stay."""

from __future__ import annotations

from types import ModuleType

from script_testing import ROOT, load_file


def _module() -> ModuleType:
    return load_file(ROOT / "scripts/bench_report.py")


def test_an_updated_report_keeps_what_was_not_run_and_says_from_when() -> None:
    report = _module()
    machine = [("date", "2026-12-01 10:00 UTC"), ("commit", "aaaaaaa")]
    first = report.render(
        machine,
        [
            report.Outcome(
                "alpha", ["python", "bench/alpha.py"], "ok", 12.0, "speed 2.50x\n", "", True
            ),
            report.Outcome(
                "beta", ["python", "bench/beta.py"], "failed (exit 1)", 3.0, "", "boom", True
            ),
        ],
        "0.1",
        [],
    )
    kept = report.earlier(first)
    assert set(kept) == {"alpha", "beta"}
    assert kept["alpha"].carried == "aaaaaaa, 2026-12-01 10:00 UTC"
    assert kept["beta"].status == "failed (exit 1)"
    assert "speed 2.50x" in kept["alpha"].stdout

    rerun = report.Outcome(
        "beta", ["python", "bench/beta.py"], "ok", 4.0, "fixed 1.10x\n", "", True
    )
    second = report.render(
        [("date", "2026-12-02 10:00 UTC"), ("commit", "bbbbbbb")], [kept["alpha"], rerun], "0.2", []
    )
    assert (
        "| [alpha](#alpha) | ok (kept from aaaaaaa, 2026-12-01 10:00 UTC) | 12 | speed 2.50x |"
        in second
    )
    assert "| [beta](#beta) | ok | 4 | fixed 1.10x |" in second
    assert "Kept from the run of aaaaaaa, 2026-12-01 10:00 UTC." in second
    assert "boom" not in second

    # Kept twice: still the first run's commit, and its section once.
    third = report.earlier(second)
    assert third["alpha"].carried == "aaaaaaa, 2026-12-01 10:00 UTC"
    assert third["beta"].carried == "bbbbbbb, 2026-12-02 10:00 UTC"
    again = report.render([("commit", "ccccccc")], [third["alpha"], third["beta"]], "0.3", [])
    assert again.count("Kept from the run of aaaaaaa") == 1
    assert again.count("speed 2.50x") == 2  # the summary row and the section
