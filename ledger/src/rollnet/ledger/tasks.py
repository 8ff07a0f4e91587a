"""Task repository: queueing, atomic leasing with fencing tokens, submission and requeueing.

Leasing is one transaction that cannot hand the same task to two callers: on PostgreSQL the
candidate row is taken with ``SELECT … FOR UPDATE SKIP LOCKED`` (concurrent replicas skip each
other's candidates instead of waiting), then updated in the same transaction; on SQLite every
transaction holds the single write lock from ``BEGIN IMMEDIATE``.

``attempt`` counts the leases granted; a lease's fencing token equals the attempt that created it,
so a worker whose lease expired and was re-granted holds a stale token and its late submit is
refused.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Integer, bindparam, case, func, select, text, update
from sqlalchemy.orm import Session

from rollnet.ledger.attempts import EndedLease, record_attempts
from rollnet.ledger.engine import is_postgresql
from rollnet.ledger.enums import AttemptOutcome, TaskState
from rollnet.ledger.leases import (
    LeaseClaim,
    LeaseOutcome,
    claim_outcome,
    deadline_outcome,
    new_lease_id,
)
from rollnet.ledger.models import Node, Task, table_of
from rollnet.ledger.prepared import Prepared


@dataclass(frozen=True, slots=True)
class NewTask:
    """A task to enqueue."""

    task_id: str
    environment: str
    checkpoint_step: int
    prompt_ids: Sequence[str]
    seed: int
    sampling: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LeasedTask:
    """A task handed to a worker, with its lease."""

    task_id: str
    environment: str
    checkpoint_step: int
    prompt_ids: list[str]
    seed: int
    sampling: dict[str, Any]
    lease_id: str
    fencing_token: int
    lease_deadline: datetime


@dataclass(frozen=True, slots=True)
class RequeueResult:
    """Tasks whose leases were taken back: requeued, or failed after the attempt cap."""

    requeued: list[str]
    failed: list[str]
    #: The leases taken back (recorded in ``task_attempts``).
    ended: list[EndedLease] = field(default_factory=list)


#: On PostgreSQL, queueing at least this many tasks at once refreshes the table's statistics.
ANALYZE_AFTER = 500


def enqueue_tasks(session: Session, tasks: Sequence[NewTask], *, now: datetime) -> None:
    """Queue ``tasks`` (one multi-row insert).

    On PostgreSQL a large demand also refreshes the planner's statistics of ``tasks`` (ANALYZE
    counts the transaction's own new rows). Until autovacuum gets to it, stale statistics make
    the planner expect a handful of queued tasks, so it sorts every queued row for each lease
    instead of reading the first one off the (state, created_at, id) index: 18 ms instead of
    0.4 ms per lease with 11,000 queued, measured.
    """
    if not tasks:
        return
    session.execute(
        _TASKS.insert(),
        [
            {
                "id": task.task_id,
                "environment": task.environment,
                "checkpoint_step": task.checkpoint_step,
                "prompt_ids": list(task.prompt_ids),
                "seed": task.seed,
                "sampling": dict(task.sampling),
                "state": TaskState.QUEUED,
                "attempt": 0,
                "fencing_token": 0,
                "created_at": now,
                "updated_at": now,
            }
            for task in tasks
        ],
    )
    if len(tasks) >= ANALYZE_AFTER and is_postgresql(session):
        session.execute(text("ANALYZE tasks"))


def get_task(session: Session, task_id: str) -> Task | None:
    """The task with ``task_id``, if any."""
    return session.get(Task, task_id)


@dataclass(frozen=True, slots=True)
class TaskTerms:
    """What a task asks for, read with one prebuilt statement (the commitment path's read)."""

    id: str
    environment: str
    checkpoint_step: int
    prompt_ids: list[str]
    seed: int
    sampling: dict[str, Any]
    state: TaskState


def get_terms(session: Session, task_id: str) -> TaskTerms | None:
    """The terms of the task with ``task_id``, if any (no ORM object is built)."""
    return _terms_of(_TERMS.one_or_none(session, {"task_id": task_id}))


def submit_and_get_terms(session: Session, claim: LeaseClaim) -> TaskTerms | None:
    """:func:`submit_task` that returns the task's terms, in one statement; ``None`` when the
    lease does not allow it (nothing changed then: :func:`why_not_submitted` says why)."""
    row = _SUBMIT_RETURNING.one_or_none(
        session,
        {
            "task_id": claim.work_id,
            "lease": claim.lease_id,
            "token": claim.fencing_token,
            "holder": claim.node_id,
            "now": claim.now,
        },
    )
    return _terms_of(row)


def why_not_submitted(session: Session, claim: LeaseClaim) -> LeaseOutcome:
    """Why a submission under this lease is refused (read after the UPDATE matched nothing)."""
    return _refusal(session, claim)


def submission_outcome(session: Session, claim: LeaseClaim) -> LeaseOutcome:
    """``OK`` when this lease may submit the task now, else why not. A read, for refusing early
    (before a rollout blob is read); the submission itself checks again in its UPDATE."""
    return _lease_outcome(session, claim)


def _terms_of(row: tuple[Any, ...] | None) -> TaskTerms | None:
    if row is None:
        return None
    found_id, environment, checkpoint_step, prompt_ids, seed, sampling, state = row
    return TaskTerms(
        id=found_id,
        environment=environment,
        checkpoint_step=checkpoint_step,
        prompt_ids=list(prompt_ids),
        seed=seed,
        sampling=dict(sampling),
        state=TaskState(state),
    )


@dataclass(frozen=True, slots=True)
class LeaseRequest:
    """One pull's ask: a task for ``node_id``, among ``environments`` (``None``: any), while the
    node holds fewer than ``max_leases`` leases (``None``: no cap)."""

    node_id: str
    environments: tuple[str, ...] | None = None
    max_leases: int | None = None


def lease_next_task(
    session: Session,
    *,
    node_id: str,
    now: datetime,
    lease_duration: timedelta,
    environments: Collection[str] | None = None,
    min_checkpoint_step: int | None = None,
    max_leases_per_node: int | None = None,
) -> LeasedTask | None:
    """Lease the oldest queued task matching the filters to ``node_id``, atomically.

    Returns ``None`` when nothing matches or the node already holds ``max_leases_per_node``
    leases. One request of :func:`lease_tasks`.
    """
    request = LeaseRequest(
        node_id,
        None if environments is None else tuple(sorted(environments)),
        max_leases_per_node,
    )
    return lease_tasks(
        session,
        [request],
        now=now,
        lease_duration=lease_duration,
        min_checkpoint_step=min_checkpoint_step,
    )[0]


def lease_tasks(
    session: Session,
    requests: Sequence[LeaseRequest],
    *,
    now: datetime,
    lease_duration: timedelta,
    min_checkpoint_step: int | None = None,
) -> list[LeasedTask | None]:
    """Lease at most one queued task to each request.

    Requests are served per environment filter, in the order each filter first appears; within
    a filter the oldest tasks go to the earliest requests.

    The answer is aligned with ``requests`` (``None``: nothing matched, or the node is at its
    cap; requests of one node in the same call count against its cap in order). The statements
    are shared by the whole call: one read of the capped nodes' held leases, one candidate
    query per distinct environment filter, then one conditional UPDATE per lease. The capped
    nodes' rows are locked first (on PostgreSQL, in id order) so caps hold across replicas.
    """
    capped = sorted({r.node_id for r in requests if r.max_leases is not None})
    held: dict[str, int] = {}
    if capped:
        if is_postgresql(session):
            session.execute(_LOCK_NODES, {"ids": capped})
        held = dict(_HELD_BY_NODE.rows(session, {"ids": capped}))
    groups: dict[tuple[str, ...] | None, list[int]] = {}
    for index, request in enumerate(requests):
        groups.setdefault(request.environments, []).append(index)
    leased: list[LeasedTask | None] = [None] * len(requests)
    deadline = now + lease_duration
    for environments, members in groups.items():
        # Requests of this filter that their node's cap allows, counting the leases the earlier
        # ones would take: candidates go to them in order, so the count is exact up to the
        # point where candidates run out (and no later one gets any).
        eligible = []
        planned = dict(held)
        for index in members:
            request = requests[index]
            if request.max_leases is not None:
                if planned.get(request.node_id, 0) >= request.max_leases:
                    continue
                planned[request.node_id] = planned.get(request.node_id, 0) + 1
            eligible.append(index)
        if not eligible:
            continue
        params: dict[str, Any] = {"limit": len(eligible)}
        if environments is not None:
            params["environments"] = list(environments)
        if min_checkpoint_step is not None:
            params["min_step"] = min_checkpoint_step
        candidates = _CANDIDATES[(environments is not None, min_checkpoint_step is not None)]
        for index, (task_id,) in zip(eligible, candidates.rows(session, params), strict=False):
            node_id = requests[index].node_id
            task = _lease(session, task_id, node_id, now, deadline)
            if task is not None:
                leased[index] = task
                held[node_id] = held.get(node_id, 0) + 1
    return leased


def _lease(
    session: Session, task_id: str, node_id: str, now: datetime, deadline: datetime
) -> LeasedTask | None:
    lease_id = new_lease_id()
    row = _LEASE.one_or_none(
        session,
        {
            "task_id": task_id,
            "new_lease_id": lease_id,
            "holder": node_id,
            "deadline": deadline,
            "now": now,
        },
    )
    if row is None:  # pragma: no cover - the row is locked (PostgreSQL) or we are the writer
        return None
    leased_id, environment, checkpoint_step, prompt_ids, seed, sampling, fencing_token = row
    return LeasedTask(
        task_id=leased_id,
        environment=environment,
        checkpoint_step=checkpoint_step,
        prompt_ids=list(prompt_ids),
        seed=seed,
        sampling=dict(sampling),
        lease_id=lease_id,
        fencing_token=fencing_token,
        lease_deadline=deadline,
    )


def _lease_matches(claim: LeaseClaim) -> Any:
    return (
        (Task.id == claim.work_id)
        & (Task.state == TaskState.LEASED)
        & (Task.lease_id == claim.lease_id)
        & (Task.fencing_token == claim.fencing_token)
        & (Task.lease_holder == claim.node_id)
    )


def submit_task(session: Session, claim: LeaseClaim) -> LeaseOutcome:
    """Move a leased task to SUBMITTED if the caller holds its current, unexpired lease.

    One conditional UPDATE decides; on refusal the task is read to say why.
    """
    if submit_and_get_terms(session, claim) is not None:
        return LeaseOutcome.OK
    return _refusal(session, claim)


def _refusal(session: Session, claim: LeaseClaim) -> LeaseOutcome:
    """Why an UPDATE conditioned on this lease matched nothing (read right after it)."""
    outcome = _lease_outcome(session, claim)
    # OK here means the UPDATE would have matched: only a race gets here.
    return LeaseOutcome.NOT_LEASED if outcome is LeaseOutcome.OK else outcome


def _lease_outcome(session: Session, claim: LeaseClaim) -> LeaseOutcome:
    task = session.get(Task, claim.work_id, populate_existing=True)
    if task is None:
        return LeaseOutcome.UNKNOWN
    return claim_outcome(
        claim,
        task,
        handed_in=task.state in _HANDED_IN,
        leased=task.state == TaskState.LEASED,
    )


#: States of a task whose lease holder submitted it.
_HANDED_IN = frozenset(
    {TaskState.SUBMITTED, TaskState.VALIDATING, TaskState.ACCEPTED, TaskState.REJECTED}
)


def lease_state_outcome(
    state: TaskState | str, lease_deadline: datetime | None, now: datetime
) -> LeaseOutcome:
    """The outcome of using a task's current lease, given the task's state and the lease's
    deadline (:func:`~rollnet.ledger.leases.deadline_outcome`)."""
    return deadline_outcome(TaskState(state) is TaskState.LEASED, lease_deadline, now)


def give_back_task(
    session: Session,
    claim: LeaseClaim,
    *,
    max_attempts: int,
    reason: str = "",
    detail: str = "",
    outcome: AttemptOutcome = AttemptOutcome.GIVEN_BACK,
) -> LeaseOutcome:
    """The holder gives its lease back (FailTask): requeue, or fail once ``max_attempts`` used.

    The lease is recorded in ``task_attempts`` with ``outcome``, ``reason`` (the FailReason
    name) and ``detail`` (the worker's message).
    """
    now = claim.now
    result = session.execute(
        update(Task)
        .where(_lease_matches(claim))
        .values(state=_requeue_state(max_attempts), updated_at=now)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount == 1:  # type: ignore[attr-defined]
        ended = EndedLease(claim.work_id, claim.node_id, claim.lease_id, claim.fencing_token)
        record_attempts(session, [ended], outcome=outcome, now=now, reason=reason, detail=detail)
        return LeaseOutcome.OK
    return _refusal(session, claim)


def _requeue_state(max_attempts: int) -> Any:
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    return case(
        (Task.attempt >= max_attempts, TaskState.FAILED.value), else_=TaskState.QUEUED.value
    )


def requeue_expired_leases(session: Session, *, now: datetime, max_attempts: int) -> RequeueResult:
    """Take back every lease whose deadline has passed: requeue, or fail after the cap."""
    result = _requeue_where(session, Task.lease_deadline <= now, now=now, max_attempts=max_attempts)
    record_attempts(session, result.ended, outcome=AttemptOutcome.EXPIRED, now=now)
    return result


def requeue_leases_of_node(
    session: Session, node_id: str, *, now: datetime, max_attempts: int
) -> RequeueResult:
    """Take back every lease ``node_id`` holds (it went offline or was ejected)."""
    result = _requeue_where(
        session, Task.lease_holder == node_id, now=now, max_attempts=max_attempts
    )
    record_attempts(session, result.ended, outcome=AttemptOutcome.TAKEN_BACK, now=now)
    return result


def _requeue_where(
    session: Session, condition: Any, *, now: datetime, max_attempts: int
) -> RequeueResult:
    rows = session.execute(
        update(Task)
        .where(Task.state == TaskState.LEASED, condition)
        .values(state=_requeue_state(max_attempts), updated_at=now)
        .returning(Task.id, Task.state, Task.lease_holder, Task.lease_id, Task.fencing_token)
        .execution_options(synchronize_session=False)
    ).all()
    requeued = sorted(row.id for row in rows if row.state is TaskState.QUEUED)
    failed = sorted(row.id for row in rows if row.state is TaskState.FAILED)
    # The lease columns are left as they were (a requeue only changes the state): they name
    # the lease that ended.
    ended = [
        EndedLease(row.id, row.lease_holder, row.lease_id, int(row.fencing_token))
        for row in sorted(rows, key=lambda row: str(row.id))
    ]
    return RequeueResult(requeued=requeued, failed=failed, ended=ended)


def transition_task(
    session: Session,
    task_id: str,
    *,
    from_state: TaskState,
    to_state: TaskState,
    now: datetime,
) -> bool:
    """Move a task from ``from_state`` to ``to_state`` (e.g. submitted → validating → accepted).

    Conditional: returns False, changing nothing, if the task is not in ``from_state``.
    """
    if to_state in (TaskState.QUEUED, TaskState.LEASED):
        raise ValueError("use lease_next_task / requeue functions to (re)lease tasks")
    result = session.execute(
        update(Task)
        .where(Task.id == task_id, Task.state == from_state)
        .values(state=to_state, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def oldest_leasable_step(latest_checkpoint_step: int | None, async_level: int) -> int | None:
    """The oldest checkpoint step a task may have to be leased, given the newest checkpoint and
    the coordinator's bounded staleness (``async_level``); ``None``: no bound (no checkpoint)."""
    if latest_checkpoint_step is None:
        return None
    return max(0, latest_checkpoint_step - async_level)


#: Tasks ended per statement by :func:`expire_stale_tasks`.
EXPIRE_BATCH = 500


def expire_stale_tasks(
    session: Session, *, min_checkpoint_step: int, now: datetime, limit: int = EXPIRE_BATCH
) -> list[str]:
    """End at most ``limit`` queued tasks whose checkpoint is older than ``min_checkpoint_step``
    (no lease may take them: see :func:`oldest_leasable_step`) as EXPIRED, oldest first; returns
    their ids.

    Only QUEUED tasks move, leased ones never. On PostgreSQL the rows are taken with ``SKIP
    LOCKED``, so two replicas sweeping at once end disjoint tasks and neither waits on a task
    the other is leasing or ending; the UPDATE is conditioned on the state again, so a task is
    ended once.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    ids = [
        task_id
        for (task_id,) in _STALE_CANDIDATES.rows(
            session, {"min_step": min_checkpoint_step, "limit": limit}
        )
    ]
    if not ids:
        return []
    rows = session.execute(_EXPIRE, {"ids": ids, "now": now}).all()
    return sorted(str(task_id) for (task_id,) in rows)


def count_tasks_by_state(session: Session) -> dict[TaskState, int]:
    """How many tasks are in each state (states with none are omitted)."""
    rows = session.execute(select(Task.state, func.count()).group_by(Task.state))
    return {TaskState(state): int(count) for state, count in rows}


_TASKS = table_of(Task)
_T = _TASKS.c

# The leasing statements, built once (see lease_next_task).
_NODE_ID = table_of(Node).c.id
_LOCK_NODES = (
    select(_NODE_ID)
    .where(_NODE_ID.in_(bindparam("ids", expanding=True)))
    .order_by(_NODE_ID)
    .with_for_update()
)
_HELD_BY_NODE = Prepared(
    select(_T.lease_holder, func.count())
    .where(_T.lease_holder.in_(bindparam("ids", expanding=True)), _T.state == TaskState.LEASED)
    .group_by(_T.lease_holder)
)


def _candidate(by_environment: bool, by_step: bool) -> Any:
    query = select(_T.id).where(_T.state == TaskState.QUEUED)
    if by_environment:
        query = query.where(_T.environment.in_(bindparam("environments", expanding=True)))
    if by_step:
        query = query.where(_T.checkpoint_step >= bindparam("min_step"))
    return (
        query.order_by(_T.created_at, _T.id)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
    )


_CANDIDATES = {(e, m): Prepared(_candidate(e, m)) for e in (False, True) for m in (False, True)}
_LEASE = Prepared(
    update(_TASKS)
    .where(_T.id == bindparam("task_id"), _T.state == TaskState.QUEUED)
    .values(
        state=TaskState.LEASED,
        attempt=_T.attempt + 1,
        fencing_token=_T.attempt + 1,
        lease_id=bindparam("new_lease_id"),
        lease_holder=bindparam("holder"),
        lease_deadline=bindparam("deadline"),
        updated_at=bindparam("now"),
    )
    .returning(
        _T.id,
        _T.environment,
        _T.checkpoint_step,
        _T.prompt_ids,
        _T.seed,
        _T.sampling,
        _T.fencing_token,
    )
)
_STALE_CANDIDATES = Prepared(
    select(_T.id)
    .where(_T.state == TaskState.QUEUED, _T.checkpoint_step < bindparam("min_step"))
    .order_by(_T.created_at, _T.id)
    .limit(bindparam("limit", type_=Integer))
    .with_for_update(skip_locked=True)
)
_EXPIRE = (
    update(_TASKS)
    .where(_T.id.in_(bindparam("ids", expanding=True)), _T.state == TaskState.QUEUED)
    .values(state=TaskState.EXPIRED, updated_at=bindparam("now"))
    .returning(_T.id)
)
_SUBMIT_STATEMENT = (
    update(_TASKS)
    .where(
        _T.id == bindparam("task_id"),
        _T.state == TaskState.LEASED,
        _T.lease_id == bindparam("lease"),
        _T.fencing_token == bindparam("token"),
        _T.lease_holder == bindparam("holder"),
        _T.lease_deadline > bindparam("now"),
    )
    .values(state=TaskState.SUBMITTED, updated_at=bindparam("now"))
)
_TERMS_COLUMNS = (
    _T.id,
    _T.environment,
    _T.checkpoint_step,
    _T.prompt_ids,
    _T.seed,
    _T.sampling,
    _T.state,
)
_SUBMIT_RETURNING = Prepared(_SUBMIT_STATEMENT.returning(*_TERMS_COLUMNS))
_TERMS = Prepared(select(*_TERMS_COLUMNS).where(_T.id == bindparam("task_id")))


def find_by_lease(session: Session, lease_id: str) -> Task | None:
    """The task whose current lease id is ``lease_id``, if any."""
    return session.scalars(select(Task).where(Task.lease_id == lease_id).limit(1)).first()


def requeue_copy(session: Session, task_id: str, *, new_task_id: str, now: datetime) -> None:
    """Queue a fresh task with the same prompts and settings as ``task_id`` (after a reject)."""
    task = session.get(Task, task_id)
    if task is None:
        raise ValueError(f"no task {task_id}")
    enqueue_tasks(
        session,
        [
            NewTask(
                task_id=new_task_id,
                environment=task.environment,
                checkpoint_step=task.checkpoint_step,
                prompt_ids=list(task.prompt_ids),
                seed=task.seed,
                sampling=dict(task.sampling),
            )
        ],
        now=now,
    )


def has_queued_task(
    session: Session,
    *,
    environments: Collection[str] | None = None,
    min_checkpoint_step: int | None = None,
) -> bool:
    """Whether a queued task matches (a cheap read before trying to lease one)."""
    query = select(Task.id).where(Task.state == TaskState.QUEUED)
    if environments is not None:
        query = query.where(Task.environment.in_(sorted(environments)))
    if min_checkpoint_step is not None:
        query = query.where(Task.checkpoint_step >= min_checkpoint_step)
    return session.scalar(query.limit(1)) is not None
