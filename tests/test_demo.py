"""`rollnet demo` (what `make demo` runs) works end to end on this machine.

Two trainer steps with the trainer, one honest worker, one validator and one cheating worker,
all real processes: the trainer trains on validated groups and publishes, honest work is
accepted and credited, the cheat is rejected and slashed, the ledger verifies, the per-step
metrics and the reward curve are written.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_swarm_accepts_honest_work_and_rejects_the_cheat(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollnet.reference.cli",
            "demo",
            "--data-dir",
            str(tmp_path / "demo"),
            "--workers",
            "1",
            "--steps",
            "2",
            "--prompts",
            "4",
            "--samples",
            "4",
            "--prompts-per-task",
            "1",
            "--warm-start-steps",
            "50",
            "--cheat",
            "token_altered",
        ],
        capture_output=True,
        text=True,
        timeout=580,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "step   1: task reward" in output, output
    assert "step   2: task reward" in output, output
    assert "reward: " in output, output
    assert (tmp_path / "demo" / "reward.png").read_bytes().startswith(b"\x89PNG")
    assert len((tmp_path / "demo" / "trainer" / "metrics.jsonl").read_text().splitlines()) == 2
    assert re.search(r"^  credit +[0-9,]+ entries$", output, re.M), output
    assert "rejected:" in output, output
    assert re.search(r"^  slash +[0-9,]+ entries$", output, re.M), output
    assert "entries verified" in output, output
    assert "dashboard: http://127.0.0.1:" in output, output
    assert "swarm: step " in output, output  # the view's plain lines (stdout is no terminal)
    export = tmp_path / "demo" / "ledger.jsonl"
    assert "ledger export: " in output, output
    assert str(export) in output, output
    assert export.stat().st_size > 0
    balances = [line for line in output.splitlines() if line.strip().startswith("balance")]
    cheat = [line for line in balances if "cheat-token_altered" in line]
    assert cheat, balances
    assert cheat[0].split(":")[-1].strip().startswith("-"), balances


def test_a_new_run_starts_from_a_fresh_ledger_and_keeps_the_model_and_keys(
    tmp_path: Path,
) -> None:
    """A second `make demo` must not count the first run's accepted rollouts as its own."""
    from rollnet.reference.demo import clear_previous_run

    assert not clear_previous_run(tmp_path)  # nothing yet: nothing to say
    kept = [tmp_path / "keys" / "trainer.key", tmp_path / "model" / "config.json"]
    gone = [
        tmp_path / "coordinator" / "rollnet.db",
        tmp_path / "logs" / "worker-0.log",
        tmp_path / "worker-0" / "cache" / "x",
        tmp_path / "validator-0" / "x",
        tmp_path / "cheat-token_altered" / "x",
        tmp_path / "trainer" / "state.json",
    ]
    for path in kept + gone:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    assert clear_previous_run(tmp_path)
    assert all(path.exists() for path in kept)
    assert not any(path.exists() for path in gone)
