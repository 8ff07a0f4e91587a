"""The chaos invariants catch what they exist for: a rollout trained twice, a step repeated,
a task held under a lease nobody will take back, a task queued behind the staleness bound —
on both databases."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ledger_testing import record_checkpoints
from sqlalchemy.engine import Engine

from rollnet.ledger import NewTask, NodeRole, lease_next_task, session_factory
from rollnet.ledger.nodes import register_node
from rollnet.ledger.tasks import enqueue_tasks, expire_stale_tasks
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


def _queued_at(engine: Engine, checkpoints: int, published_at: datetime) -> None:
    """Tasks queued at checkpoints 0 and 1; checkpoints 0..``checkpoints``-1 published."""
    with session_factory(engine).begin() as session:
        enqueue_tasks(
            session,
            [NewTask(f"task-{s}", "arithmetic", s, ["p"], seed=1) for s in (0, 1)],
            now=NOW,
        )
        record_checkpoints(session, range(checkpoints), now=published_at)


def test_a_task_queued_behind_the_staleness_bound_is_stuck(migrated_engine: Engine) -> None:
    _queued_at(migrated_engine, 4, NOW)  # newest 3: a task at 0 is more than 2 behind
    outcome = every_task_terminal_or_leased(migrated_engine, now=NOW + timedelta(minutes=5))
    assert not outcome.holds
    assert "1 stuck" in outcome.detail
    assert "task-0 queued at checkpoint 0, behind 3" in outcome.detail


def test_a_checkpoint_too_new_for_the_sweep_to_have_acted_leaves_the_task_queued(
    migrated_engine: Engine,
) -> None:
    _queued_at(migrated_engine, 3, NOW)
    with session_factory(migrated_engine).begin() as session:
        record_checkpoints(session, [3], now=NOW + timedelta(minutes=5))
    outcome = every_task_terminal_or_leased(migrated_engine, now=NOW + timedelta(minutes=5))
    assert outcome.holds, outcome.detail
    assert "2 queued" in outcome.detail


def test_an_expired_stale_task_holds(migrated_engine: Engine) -> None:
    _queued_at(migrated_engine, 4, NOW)
    with session_factory(migrated_engine).begin() as session:
        assert expire_stale_tasks(session, min_checkpoint_step=1, now=NOW) == ["task-0"]
    outcome = every_task_terminal_or_leased(migrated_engine, now=NOW + timedelta(minutes=5))
    assert outcome.holds, outcome.detail
    assert outcome.detail == "tasks: 1 expired, 1 queued"
