"""What must hold after any number of faults, checked against the database and the trainer.

Each check returns an :class:`Invariant`: its name, whether it holds and, when it does not, the
offending rows (the first few), so a failed chaos run says what was lost or doubled.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, func, select

from rollnet.ledger.enums import EntryKind, TaskState, ValidationJobState
from rollnet.ledger.models import Checkpoint, Commitment, LedgerEntry, Task, ValidationJob
from rollnet.reference.trainer.metrics import read_jsonl

__all__ = [
    "Invariant",
    "each_commitment_credited_once",
    "each_rollout_trained_once",
    "every_task_terminal_or_leased",
    "ledger_verifies",
]

_SHOWN = 5
#: A lease past its deadline is taken back by the coordinator's sweep (every second); one older
#: than this is one nobody will ever take back.
SWEEP_GRACE = timedelta(seconds=10)


@dataclass(frozen=True, slots=True)
class Invariant:
    """One invariant's outcome."""

    name: str
    holds: bool
    detail: str


def each_rollout_trained_once(trainer_dir: Path) -> Invariant:
    """No accepted rollout (stream sequence) is in two training steps; steps are 1, 2, ... once."""
    lines = read_jsonl(trainer_dir / "metrics.jsonl")
    steps = [int(line["step"]) for line in lines]
    seen: Counter[int] = Counter()
    for line in lines:
        seen.update(int(s) for s in line["sequences"])
    twice = sorted(s for s, n in seen.items() if n > 1)
    problems = []
    if steps != list(range(1, len(steps) + 1)):
        problems.append(f"steps {steps[:20]} are not 1..{len(steps)} once each")
    if twice:
        problems.append(f"{len(twice)} sequence(s) trained on twice: {twice[:_SHOWN]}")
    detail = "; ".join(problems) or f"{len(seen)} rollouts in {len(steps)} steps, each once"
    return Invariant("no accepted rollout trained on twice", not problems, detail)


def each_commitment_credited_once(engine: Engine) -> Invariant:
    """No commitment has two credit entries in the ledger."""
    with engine.connect() as connection:
        doubled = connection.execute(
            select(LedgerEntry.commitment_id, func.count())
            .where(LedgerEntry.kind == EntryKind.CREDIT)
            .group_by(LedgerEntry.commitment_id)
            .having(func.count() > 1)
        ).all()
        credits = connection.execute(
            select(func.count()).where(LedgerEntry.kind == EntryKind.CREDIT)
        ).scalar()
    detail = (
        f"{len(doubled)} commitment(s) credited more than once: {doubled[:_SHOWN]}"
        if doubled
        else f"{credits} credits, one per commitment"
    )
    return Invariant("no commitment credited twice", not doubled, detail)


def every_task_terminal_or_leased(
    engine: Engine, async_level: int = 2, now: datetime | None = None
) -> Invariant:
    """Every task is terminal, queued, or held by a lease that is live (or about to be swept);
    every submitted task's validation job is queued, done, or under such a lease.

    A queued task is stuck too when its checkpoint is more than ``async_level`` steps (the
    coordinator's bounded staleness) behind one published more than :data:`SWEEP_GRACE` ago: no
    worker may lease it, and the coordinator's sweep should have ended it as expired
    (docs/reliability.md, *Findings*)."""
    now = now or datetime.now(UTC)
    expired = now - SWEEP_GRACE
    with engine.connect() as connection:
        tasks = connection.execute(
            select(Task.id, Task.state, Task.lease_deadline, Task.lease_holder)
        ).all()
        jobs = connection.execute(
            select(
                ValidationJob.commitment_id,
                ValidationJob.state,
                ValidationJob.lease_deadline,
                Commitment.task_id,
            ).join(Commitment, Commitment.id == ValidationJob.commitment_id)
        ).all()
        # The newest checkpoint the sweep has had time to act on.
        swept = connection.execute(
            select(func.max(Checkpoint.step)).where(Checkpoint.published_at < expired)
        ).scalar()
        stale = connection.execute(
            select(Task.id, Task.checkpoint_step)
            .where(
                Task.state == TaskState.QUEUED,
                Task.checkpoint_step < (swept or 0) - async_level,
            )
            .order_by(Task.id)
        ).all()
    stuck: list[str] = []
    by_state: Counter[str] = Counter()
    for task_id, state, deadline, holder in tasks:
        by_state[str(state)] += 1
        if state == TaskState.LEASED and (holder is None or _aware(deadline) < expired):
            stuck.append(f"task {task_id} leased to {holder} past {deadline}")
    pending = {TaskState.SUBMITTED, TaskState.VALIDATING}
    states = {task_id: state for task_id, state, _, _ in tasks}
    for commitment_id, job_state, deadline, task_id in jobs:
        if states.get(task_id) not in pending:
            continue
        if job_state == ValidationJobState.LEASED and _aware(deadline) < expired:
            stuck.append(f"validation of {commitment_id} leased past {deadline}")
    stuck += [
        f"task {task_id} queued at checkpoint {step}, behind {swept} by more than {async_level}"
        for task_id, step in stale
    ]
    summary = ", ".join(f"{count} {state}" for state, count in sorted(by_state.items()))
    detail = f"{len(stuck)} stuck: {stuck[:_SHOWN]}" if stuck else f"tasks: {summary}"
    return Invariant("every task terminal or under a live lease", not stuck, detail)


def ledger_verifies(database_url: str) -> Invariant:
    """``rollnet ledger verify --db URL`` exits 0."""
    result = subprocess.run(
        [sys.executable, "-m", "rollnet.reference.cli", "ledger", "verify", "--db", database_url],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    said = (result.stdout + result.stderr).strip().splitlines()
    detail = said[-1] if said else f"exit {result.returncode}"
    return Invariant("rollnet ledger verify passes", result.returncode == 0, detail)


def _aware(moment: datetime | None) -> datetime:
    if moment is None:
        return datetime.min.replace(tzinfo=UTC)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
