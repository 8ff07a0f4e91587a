"""The chaos invariants catch what they exist for: a rollout trained twice, a step repeated."""

from __future__ import annotations

import json
from pathlib import Path

from rollnet.reference.chaos.invariants import each_rollout_trained_once


def _metrics(path: Path, lines: list[tuple[int, list[int]]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps({"step": s, "sequences": q}) + "\n" for s, q in lines)
    (path / "metrics.jsonl").write_text(text)
    return path


def test_distinct_rollouts_in_consecutive_steps_hold(tmp_path: Path) -> None:
    outcome = each_rollout_trained_once(_metrics(tmp_path, [(1, [1, 2]), (2, [3, 5])]))
    assert outcome.holds, outcome.detail
    assert "4 rollouts in 2 steps" in outcome.detail


def test_a_rollout_in_two_steps_is_caught(tmp_path: Path) -> None:
    outcome = each_rollout_trained_once(_metrics(tmp_path, [(1, [1, 2]), (2, [2, 3])]))
    assert not outcome.holds
    assert "[2]" in outcome.detail


def test_a_step_trained_twice_is_caught(tmp_path: Path) -> None:
    outcome = each_rollout_trained_once(_metrics(tmp_path, [(1, [1]), (1, [2])]))
    assert not outcome.holds
    assert "not 1..2" in outcome.detail
