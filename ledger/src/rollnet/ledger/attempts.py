"""The give-back history: every lease of a task that ended without credit, and why.

Sampling seeds derive from the network, the task and the rollout index alone
(``docs/verification.md``, *Binding*), so giving a task back, letting its lease expire or being
rejected never re-rolls them. Retrying still leaves a trace here — node, lease, outcome, reason,
time — for GetTask, the dashboard and the coordinator's metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from rollnet.ledger.enums import AttemptOutcome
from rollnet.ledger.models import TaskAttempt

#: Longest ``detail`` kept (a worker's FailTask message is free text).
DETAIL_CHARS = 200
#: Longest ``reason`` kept.
REASON_CHARS = 64


@dataclass(frozen=True, slots=True)
class EndedLease:
    """A task lease that ended: which task, who held it, under which lease."""

    task_id: str
    node_id: str
    lease_id: str
    fencing_token: int


def record_attempts(
    session: Session,
    ended: Sequence[EndedLease],
    *,
    outcome: AttemptOutcome,
    now: datetime,
    reason: str = "",
    detail: str = "",
) -> None:
    """Record that each lease in ``ended`` ended without credit, with ``outcome``."""
    if not ended:
        return
    session.execute(
        insert(TaskAttempt),
        [
            {
                "task_id": lease.task_id,
                "node_id": lease.node_id,
                "lease_id": lease.lease_id,
                "fencing_token": lease.fencing_token,
                "outcome": outcome,
                "reason": reason[:REASON_CHARS],
                "detail": detail[:DETAIL_CHARS],
                "ended_at": now,
            }
            for lease in ended
        ],
    )


def attempts_of_task(session: Session, task_id: str) -> list[TaskAttempt]:
    """The leases of ``task_id`` that ended without credit, oldest first."""
    return list(
        session.scalars(
            select(TaskAttempt)
            .where(TaskAttempt.task_id == task_id)
            .order_by(TaskAttempt.fencing_token, TaskAttempt.id)
        )
    )


def attempts_of_node(
    session: Session, node_id: str, *, since: datetime | None = None
) -> dict[AttemptOutcome, int]:
    """How many of ``node_id``'s leases ended without credit, by outcome (since ``since``)."""
    query = (
        select(TaskAttempt.outcome, func.count())
        .where(TaskAttempt.node_id == node_id)
        .group_by(TaskAttempt.outcome)
    )
    if since is not None:
        query = query.where(TaskAttempt.ended_at >= since)
    return {AttemptOutcome(outcome): int(count) for outcome, count in session.execute(query)}
