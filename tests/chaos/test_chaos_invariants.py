"""The chaos invariants catch what they exist for: a rollout trained twice, a step repeated,
a task held under a lease nobody will take back — on both databases."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy.engine import Engine

from rollnet.ledger import NewTask, NodeRole, lease_next_task, session_factory
from rollnet.ledger.nodes import register_node
from rollnet.ledger.tasks import enqueue_tasks
from rollnet.reference.chaos.invariants import (
    each_commitment_credited_once,
    each_rollout_trained_once,
    every_task_terminal_or_leased,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


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


def _leased_task(engine: Engine, deadline_from: datetime) -> None:
    with session_factory(engine).begin() as session:
        register_node(
            session,
            node_id="a" * 32,
            public_key=bytes(32),
            role=NodeRole.WORKER,
            protocol_version="1.0",
            software_version="test",
            capabilities=[],
            hardware={},
            pool=None,
            now=deadline_from,
        )
        enqueue_tasks(session, [NewTask("task-1", "arithmetic", 0, ["p"], seed=1)], now=NOW)
        leased = lease_next_task(
            session, node_id="a" * 32, now=deadline_from, lease_duration=timedelta(seconds=30)
        )
        assert leased is not None


def test_a_task_under_a_live_lease_holds(migrated_engine: Engine) -> None:
    _leased_task(migrated_engine, NOW)
    outcome = every_task_terminal_or_leased(migrated_engine, now=NOW + timedelta(seconds=5))
    assert outcome.holds, outcome.detail
    assert "1 leased" in outcome.detail


def test_a_task_leased_past_its_deadline_is_stuck(migrated_engine: Engine) -> None:
    _leased_task(migrated_engine, NOW)
    outcome = every_task_terminal_or_leased(migrated_engine, now=NOW + timedelta(minutes=5))
    assert not outcome.holds
    assert "task-1" in outcome.detail


def test_no_credit_is_no_double_credit(migrated_engine: Engine) -> None:
    outcome = each_commitment_credited_once(migrated_engine)
    assert outcome.holds, outcome.detail
    assert outcome.detail == "0 credits, one per commitment"
