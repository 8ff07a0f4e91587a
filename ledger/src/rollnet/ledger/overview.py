"""The swarm at a glance: the reads behind the operator dashboard, and the per-step reward sums
it shows, kept up to date by accepting verdicts.

Every read here is bounded by what is live, not by history: counts by state use the state
indexes and only the open (non-terminal) states, which hold the work in flight; totals that grow
with history (credits, slashes, rejects by reason, throughput) are read from the ledger
incrementally, by sequence number, through :func:`entries_after`; the reward curve is one row
per trainer step (:class:`~rollnet.ledger.models.StepRewards`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from rollnet.ledger.engine import is_postgresql
from rollnet.ledger.enums import EntryKind, NodeRole, NodeState, TaskState, ValidationJobState
from rollnet.ledger.models import (
    Commitment,
    LedgerEntry,
    Node,
    StepRewards,
    Task,
    ValidationJob,
    table_of,
)

#: Task and validation-job states that hold work in flight (terminal ones only grow; they are
#: counted from the ledger instead).
OPEN_TASK_STATES = (
    TaskState.QUEUED,
    TaskState.LEASED,
    TaskState.SUBMITTED,
    TaskState.VALIDATING,
)
OPEN_JOB_STATES = (ValidationJobState.QUEUED, ValidationJobState.LEASED)


def record_step_rewards(
    session: Session,
    rollout_step: int,
    rewards: Sequence[tuple[float, float, float]],
    *,
    now: datetime,
) -> None:
    """Add accepted rollouts' validated rewards ``(task_reward, length_penalty, total)`` to
    their trainer step's sums (one upsert, in the verdict's transaction)."""
    if not rewards:
        return
    values = {
        "rollout_step": rollout_step,
        "rollouts": len(rewards),
        "task_reward_sum": float(sum(r[0] for r in rewards)),
        "total_reward_sum": float(sum(r[2] for r in rewards)),
        "updated_at": now,
    }
    if is_postgresql(session):
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
    table = table_of(StepRewards)
    statement = insert(table).values(**values)
    excluded = statement.excluded
    session.execute(
        statement.on_conflict_do_update(
            index_elements=[table.c.rollout_step],
            set_={
                "rollouts": table.c.rollouts + excluded.rollouts,
                "task_reward_sum": table.c.task_reward_sum + excluded.task_reward_sum,
                "total_reward_sum": table.c.total_reward_sum + excluded.total_reward_sum,
                "updated_at": excluded.updated_at,
            },
        )
    )


@dataclass(frozen=True, slots=True)
class StepReward:
    """The mean validated reward of one trainer step's accepted rollouts."""

    rollout_step: int
    rollouts: int
    mean_task_reward: float
    mean_total_reward: float


def step_rewards(session: Session, *, limit: int = 1000) -> list[StepReward]:
    """The last ``limit`` trainer steps' mean rewards, oldest first."""
    rows = session.execute(
        select(
            StepRewards.rollout_step,
            StepRewards.rollouts,
            StepRewards.task_reward_sum,
            StepRewards.total_reward_sum,
        )
        .order_by(StepRewards.rollout_step.desc())
        .limit(limit)
    ).all()
    return [
        StepReward(step, count, task / count if count else 0.0, total / count if count else 0.0)
        for step, count, task, total in reversed(rows)
    ]


def node_counts(session: Session) -> dict[tuple[NodeRole, NodeState], int]:
    """Registered nodes by role and state (a pass over the nodes table)."""
    return {
        (NodeRole(role), NodeState(state)): int(count)
        for role, state, count in session.execute(
            select(Node.role, Node.state, func.count()).group_by(Node.role, Node.state)
        )
    }


@dataclass(frozen=True, slots=True)
class OpenWork:
    """The work in flight by state (and nodes by role and state, when asked)."""

    nodes: dict[tuple[NodeRole, NodeState], int]
    tasks: dict[TaskState, int]
    jobs: dict[ValidationJobState, int]
    failed_tasks: int
    failed_jobs: int
    #: Tasks ended unleased, behind the staleness bound.
    expired_tasks: int


def open_work(session: Session, *, with_nodes: bool = True) -> OpenWork:
    """Counts of open tasks and open validation jobs (by state), of failed ones, and (with
    ``with_nodes``) of nodes by role and state. Tasks and jobs are counted through their
    ``(state, ...)`` indexes, in the open states only, so the cost follows the work in flight."""
    nodes = node_counts(session) if with_nodes else {}
    tasks = {
        TaskState(state): count
        for state, count in session.execute(
            select(Task.state, func.count())
            .where(Task.state.in_([*OPEN_TASK_STATES, TaskState.FAILED, TaskState.EXPIRED]))
            .group_by(Task.state)
        )
    }
    jobs = {
        ValidationJobState(state): count
        for state, count in session.execute(
            select(ValidationJob.state, func.count())
            .where(ValidationJob.state.in_([*OPEN_JOB_STATES, ValidationJobState.FAILED]))
            .group_by(ValidationJob.state)
        )
    }
    return OpenWork(
        nodes=nodes,
        tasks={s: tasks.get(s, 0) for s in OPEN_TASK_STATES},
        jobs={s: jobs.get(s, 0) for s in OPEN_JOB_STATES},
        failed_tasks=tasks.get(TaskState.FAILED, 0),
        failed_jobs=jobs.get(ValidationJobState.FAILED, 0),
        expired_tasks=tasks.get(TaskState.EXPIRED, 0),
    )


@dataclass(frozen=True, slots=True)
class NodeRow:
    """One node as the dashboard lists it."""

    node_id: str
    role: NodeRole
    state: NodeState
    state_reason: str
    last_heartbeat_at: datetime
    checkpoint_step: int | None
    software_version: str


def node_page(
    session: Session,
    *,
    after_id: str = "",
    limit: int = 50,
    state: NodeState | None = None,
    role: NodeRole | None = None,
) -> list[NodeRow]:
    """A page of nodes in id order after ``after_id`` (keyset pagination on the primary key)."""
    query = (
        select(
            Node.id,
            Node.role,
            Node.state,
            Node.state_reason,
            Node.last_heartbeat_at,
            Node.checkpoint_step,
            Node.software_version,
        )
        .where(Node.id > after_id)
        .order_by(Node.id)
        .limit(limit)
    )
    if state is not None:
        query = query.where(Node.state == state)
    if role is not None:
        query = query.where(Node.role == role)
    return [
        NodeRow(node_id, NodeRole(r), NodeState(s), reason or "", heard, step, software)
        for node_id, r, s, reason, heard, step, software in session.execute(query)
    ]


def checkpoint_steps(session: Session) -> dict[int | None, int]:
    """How many live workers and validators (active or suspect) report each checkpoint step."""
    rows = session.execute(
        select(Node.checkpoint_step, func.count())
        .where(
            Node.state.in_([NodeState.ACTIVE, NodeState.SUSPECT]),
            Node.role.in_([NodeRole.WORKER, NodeRole.VALIDATOR]),
        )
        .group_by(Node.checkpoint_step)
    )
    return {step: int(count) for step, count in rows}


@dataclass(frozen=True, slots=True)
class EntrySummary:
    """A ledger entry with what the dashboard derives from it."""

    sequence: int
    recorded_at: datetime
    node_id: str
    kind: EntryKind
    amount: int
    memo: str
    #: The commitment's tokens (prefill + decode, as the coordinator counted them), for credits.
    tokens: int
    #: Rollouts the credited commitment holds (prompts x samples), for credits.
    rollouts: int
    #: Whether a validator's verdict stands behind the entry (credits: validated or spot check
    #: skipped).
    validated: bool


def entries_after(
    session: Session, after_sequence: int, *, limit: int = 5000
) -> list[EntrySummary]:
    """Ledger entries after ``after_sequence`` in order, with their commitment's tokens and
    rollout count (a primary-key range read, joined on primary keys)."""
    rows = session.execute(
        select(
            LedgerEntry.sequence,
            LedgerEntry.recorded_at,
            LedgerEntry.node_id,
            LedgerEntry.kind,
            LedgerEntry.amount,
            LedgerEntry.memo,
            LedgerEntry.verdict_id,
            Commitment.claimed_work,
            Task.prompt_ids,
            Task.sampling,
        )
        .outerjoin(Commitment, Commitment.id == LedgerEntry.commitment_id)
        .outerjoin(Task, Task.id == Commitment.task_id)
        .where(LedgerEntry.sequence > after_sequence)
        .order_by(LedgerEntry.sequence)
        .limit(limit)
    ).all()
    return [_summary(row) for row in rows]


def _summary(row: Any) -> EntrySummary:
    sequence, recorded_at, node_id, kind, amount, memo, verdict_id, tokens, prompts, sampling = row
    kind = EntryKind(kind)
    credited = kind is EntryKind.CREDIT
    rollouts = len(prompts or []) * int((sampling or {}).get("samples_per_prompt", 0))
    return EntrySummary(
        sequence=sequence,
        recorded_at=recorded_at,
        node_id=node_id,
        kind=kind,
        amount=amount,
        memo=memo or "",
        tokens=int(tokens or 0) if credited else 0,
        rollouts=rollouts if credited else 0,
        validated=verdict_id is not None,
    )


@dataclass(frozen=True, slots=True)
class LedgerTotals:
    """Totals of the ledger up to a sequence number: per node, per kind, and rejects by
    reason (the slash entries' memo holds the validator's reject reason)."""

    up_to_sequence: int
    node_balances: dict[str, int]
    node_credited: dict[str, int]
    kind_amounts: dict[EntryKind, int]
    kind_counts: dict[EntryKind, int]
    rejects_by_reason: dict[str, int]
    credits_validated: int


def ledger_totals(session: Session, up_to_sequence: int) -> LedgerTotals:
    """Every total :class:`LedgerTotals` holds, up to ``up_to_sequence``, in three grouped
    reads. A pass over the ledger: taken once, then kept up to date from
    :func:`entries_after`."""
    upto = LedgerEntry.sequence <= up_to_sequence
    balances: dict[str, int] = {}
    credited: dict[str, int] = {}
    kind_amounts: dict[EntryKind, int] = {}
    kind_counts: dict[EntryKind, int] = {}
    for node_id, kind, total, count in session.execute(
        select(LedgerEntry.node_id, LedgerEntry.kind, func.sum(LedgerEntry.amount), func.count())
        .where(upto)
        .group_by(LedgerEntry.node_id, LedgerEntry.kind)
    ):
        kind = EntryKind(kind)
        balances[node_id] = balances.get(node_id, 0) + int(total)
        if kind in (EntryKind.CREDIT, EntryKind.VALIDATOR_REWARD):
            credited[node_id] = credited.get(node_id, 0) + int(total)
        kind_amounts[kind] = kind_amounts.get(kind, 0) + int(total)
        kind_counts[kind] = kind_counts.get(kind, 0) + int(count)
    reasons = {
        memo or "": int(count)
        for memo, count in session.execute(
            select(LedgerEntry.memo, func.count())
            .where(upto, LedgerEntry.kind == EntryKind.SLASH)
            .group_by(LedgerEntry.memo)
        )
    }
    validated = session.scalar(
        select(func.count())
        .select_from(LedgerEntry)
        .where(upto, LedgerEntry.kind == EntryKind.CREDIT, LedgerEntry.verdict_id.is_not(None))
    )
    return LedgerTotals(
        up_to_sequence=up_to_sequence,
        node_balances=balances,
        node_credited=credited,
        kind_amounts=kind_amounts,
        kind_counts=kind_counts,
        rejects_by_reason=reasons,
        credits_validated=int(validated or 0),
    )
