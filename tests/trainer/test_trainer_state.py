"""The trainer's files: the committed state, the metrics lines, checkpoint retention, gauges."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from prometheus_client import generate_latest

from rollnet.reference.trainer.intake import IntakeState
from rollnet.reference.trainer.metrics import TrainerMetrics, append_jsonl, read_jsonl
from rollnet.reference.trainer.publish import prune_checkpoints
from rollnet.reference.trainer.state import (
    TrainerState,
    commit,
    load_master,
    load_state,
    master_path,
    save_master,
)


def test_a_committed_state_round_trips_and_drops_older_masters(tmp_path: Path) -> None:
    assert load_state(tmp_path) is None
    for step in (1, 2):
        save_master(tmp_path, step, {"w": torch.full((2,), float(step))}, {"state": {}})
    intake = IntakeState(after_sequence=7, settled_above=[9], seen_through=12, outstanding={2: 3})
    commit(tmp_path, TrainerState(step=2, intake=intake, last_metrics={"step": 2}))
    loaded = load_state(tmp_path)
    assert loaded is not None
    assert loaded.step == 2
    assert loaded.intake == intake
    assert loaded.last_metrics == {"step": 2}
    assert not master_path(tmp_path, 1).exists()
    assert load_master(tmp_path, 2)["model"]["w"].tolist() == [2.0, 2.0]


def test_a_state_this_version_cannot_resume_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(json.dumps({"version": 99, "step": 1}))
    with pytest.raises(ValueError, match="state version 99"):
        load_state(tmp_path)
    (tmp_path / "state.json").write_text(json.dumps({"version": 1, "step": 3, "intake": {}}))
    with pytest.raises(ValueError, match="can resume"):
        load_state(tmp_path)
    commit(tmp_path, TrainerState(step=3))
    with pytest.raises(ValueError, match="missing"):
        load_master(tmp_path, 3)


def test_a_metrics_line_torn_by_a_crash_is_cut_off(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    append_jsonl(path, {"step": 1})
    with open(path, "a") as handle:
        handle.write('{"step": 2, "rew')  # the crash
    assert [line["step"] for line in read_jsonl(path)] == [1]
    append_jsonl(path, {"step": 2})
    assert [line["step"] for line in read_jsonl(path)] == [1, 2]
    assert path.read_text().count("\n") == 2


def test_only_the_checkpoints_a_rollout_may_come_from_are_kept(tmp_path: Path) -> None:
    for step in range(6):
        (tmp_path / "checkpoints" / f"step-{step}").mkdir(parents=True)
    assert prune_checkpoints(tmp_path, newest=5, keep=3) == [0, 1, 2]
    remaining = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert remaining == ["step-3", "step-4", "step-5"]


def test_gauges_follow_the_metrics_line() -> None:
    metrics = TrainerMetrics()
    line = {
        "step": 4,
        "reward": 0.5,
        "task_reward": 0.6,
        "length_penalty": 0.1,
        "grad_norm": 0.25,
        "idle_fraction": 0.75,
        "samples": 32,
        "loss_tokens": 200,
        "idle_seconds": 3.0,
        "busy_seconds": 1.0,
        "staleness": {"0": 4},
    }
    metrics.record(line)
    metrics.count_groups("dropped_stale", 2)
    text = generate_latest(metrics.registry).decode()
    assert "rollnet_trainer_step 4.0" in text
    assert 'rollnet_trainer_reward{part="task_reward"} 0.6' in text
    assert 'rollnet_trainer_step_value{name="grad_norm"} 0.25' in text
    assert "rollnet_trainer_samples_total 32.0" in text
    assert "rollnet_trainer_idle_seconds_total 3.0" in text
    assert 'rollnet_trainer_groups_total{outcome="dropped_stale"} 2.0' in text
