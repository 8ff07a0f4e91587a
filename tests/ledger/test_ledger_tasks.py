"""Task leasing with fencing tokens, on both engines; concurrency and SKIP LOCKED."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from ledger_testing import record_checkpoints
from sqlalchemy import Select, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from rollnet.ledger import (
    LeaseClaim,
    LeaseOutcome,
    NewTask,
    TaskState,
    lease_next_task,
    submit_task,
)
from rollnet.ledger.artifacts import latest_checkpoint_step
from rollnet.ledger.attempts import attempts_of_node, attempts_of_task
from rollnet.ledger.enums import AttemptOutcome
from rollnet.ledger.leases import extend_leases
from rollnet.ledger.tasks import (
    _CANDIDATES,
    LeaseRequest,
    count_tasks_by_state,
    enqueue_tasks,
    expire_stale_tasks,
    get_task,
    give_back_task,
    lease_tasks,
    oldest_leasable_step,
    requeue_expired_leases,
    requeue_leases_of_node,
    transition_task,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=60)
AddNodes = Callable[..., list[str]]


#: SKIP LOCKED is PostgreSQL's (SQLite has a single writer instead): these run there alone.
postgres_only = pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


def _tasks(count: int, environment: str = "arithmetic", step: int = 0) -> list[NewTask]:
    return [
        NewTask(
            task_id=f"{environment}-{step}-{i:05d}",
            environment=environment,
            checkpoint_step=step,
            prompt_ids=[f"p{i}", f"p{i + 1}"],
            seed=1000 + i,
            sampling={"temperature": 1.0, "max_tokens": 64},
        )
        for i in range(count)
    ]


def test_leases_oldest_matching_task_with_a_fresh_fencing_token(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (worker,) = add_nodes(1)
    with sessions.begin() as session:
        enqueue_tasks(session, _tasks(2, "math", step=3), now=T0)
        enqueue_tasks(session, _tasks(2), now=T0 + timedelta(seconds=1))
    with sessions.begin() as session:
        leased = lease_next_task(
            session, node_id=worker, now=T0, lease_duration=LEASE, environments=["arithmetic"]
        )
    assert leased is not None
    assert leased.task_id == "arithmetic-0-00000"
    assert (leased.fencing_token, leased.seed) == (1, 1000)
    assert leased.prompt_ids == ["p0", "p1"]
    assert leased.sampling == {"temperature": 1.0, "max_tokens": 64}
    assert leased.lease_deadline == T0 + LEASE
    with sessions.begin() as session:
        math = lease_next_task(
            session, node_id=worker, now=T0, lease_duration=LEASE, min_checkpoint_step=3
        )
        assert math is not None
        assert math.task_id == "math-3-00000"
        assert (
            lease_next_task(
                session,
                node_id=worker,
                now=T0,
                lease_duration=LEASE,
                environments=["code"],
            )
            is None
        )
        task = get_task(session, leased.task_id)
        assert task is not None
        assert (task.state, task.lease_holder, task.attempt) == (TaskState.LEASED, worker, 1)


def test_stale_fencing_token_is_refused_after_expiry_and_release(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    slow, fast = add_nodes(2)
    with sessions.begin() as session:
        enqueue_tasks(session, _tasks(1), now=T0)
        first = lease_next_task(session, node_id=slow, now=T0, lease_duration=LEASE)
    assert first is not None
    late = T0 + LEASE + timedelta(seconds=1)
    with sessions.begin() as session:
        # Expired but not yet requeued: the holder is told its lease expired.
        outcome = submit_task(
            session,
            LeaseClaim(first.task_id, first.lease_id, first.fencing_token, slow, late),
        )
        assert outcome is LeaseOutcome.LEASE_EXPIRED
        assert requeue_expired_leases(session, now=late, max_attempts=3).requeued == [first.task_id]
        second = lease_next_task(session, node_id=fast, now=late, lease_duration=LEASE)
    assert second is not None
    assert second.task_id == first.task_id
    assert second.fencing_token == first.fencing_token + 1
    with sessions.begin() as session:
        stale = submit_task(
            session,
            LeaseClaim(first.task_id, first.lease_id, first.fencing_token, slow, late),
        )
        assert stale is LeaseOutcome.STALE_LEASE
        thief = submit_task(
            session,
            LeaseClaim(second.task_id, second.lease_id, second.fencing_token, slow, late),
        )
        assert thief is LeaseOutcome.WRONG_HOLDER
        unknown = submit_task(
            session,
            LeaseClaim("nope", second.lease_id, 1, fast, late),
        )
        assert unknown is LeaseOutcome.UNKNOWN
        ok = submit_task(
            session,
            LeaseClaim(second.task_id, second.lease_id, second.fencing_token, fast, late),
        )
        assert ok is LeaseOutcome.OK
        duplicate = submit_task(
            session,
            LeaseClaim(second.task_id, second.lease_id, second.fencing_token, fast, late),
        )
        assert duplicate is LeaseOutcome.ALREADY_SUBMITTED
        task = get_task(session, first.task_id)
        assert task is not None
        assert task.state is TaskState.SUBMITTED


def test_expired_leases_fail_after_the_attempt_cap(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (worker,) = add_nodes(1)
    with sessions.begin() as session:
        enqueue_tasks(session, _tasks(1), now=T0)
    now = T0
    for attempt in (1, 2):
        with sessions.begin() as session:
            leased = lease_next_task(session, node_id=worker, now=now, lease_duration=LEASE)
            assert leased is not None
            assert leased.fencing_token == attempt
            now += LEASE
            result = requeue_expired_leases(session, now=now, max_attempts=2)
        if attempt == 1:
            assert (len(result.requeued), result.failed) == (1, [])
        else:
            assert (result.requeued, len(result.failed)) == ([], 1)
    with sessions.begin() as session:
        assert count_tasks_by_state(session) == {TaskState.FAILED: 1}
        assert lease_next_task(session, node_id=worker, now=now, lease_duration=LEASE) is None


def test_per_node_lease_cap(sessions: sessionmaker[Session], add_nodes: AddNodes) -> None:
    worker, other = add_nodes(2)
    with sessions.begin() as session:
        enqueue_tasks(session, _tasks(5), now=T0)
    with sessions.begin() as session:
        for _ in range(2):
            assert lease_next_task(
                session, node_id=worker, now=T0, lease_duration=LEASE, max_leases_per_node=2
            )
        assert (
            lease_next_task(
                session, node_id=worker, now=T0, lease_duration=LEASE, max_leases_per_node=2
            )
            is None
        )
        assert lease_next_task(
            session, node_id=other, now=T0, lease_duration=LEASE, max_leases_per_node=2
        )


def test_one_call_leases_for_many_requests_in_order(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    """lease_tasks: per filter, the oldest tasks go to the earliest requests; caps count within
    the call, in order."""
    a, b, c = add_nodes(3)
    with sessions.begin() as session:
        enqueue_tasks(session, _tasks(3), now=T0)
        enqueue_tasks(session, _tasks(2, "math"), now=T0 + timedelta(seconds=1))
        enqueue_tasks(session, _tasks(1, "code", step=1), now=T0 + timedelta(seconds=2))
        held = lease_next_task(session, node_id=a, now=T0, lease_duration=LEASE)
    assert held is not None
    assert held.task_id == "arithmetic-0-00000"
    requests = [
        LeaseRequest(a, max_leases=2),  # a holds one: this takes its second
        LeaseRequest(a, max_leases=2),  # at the cap (counting the one above): nothing
        LeaseRequest(b, ("math",)),
        LeaseRequest(c, max_leases=1),  # not skipped because a was refused before it
        LeaseRequest(b, ("math", "other")),  # math ran out: the ("math",) requests came first
        LeaseRequest(c, ("math",)),  # no cap on this request
        LeaseRequest(b, ("code",)),
    ]
    with sessions.begin() as session:
        leased = lease_tasks(session, requests, now=T0, lease_duration=LEASE)
    ids = [None if task is None else task.task_id for task in leased]
    assert ids == [
        "arithmetic-0-00001",
        None,
        "math-0-00000",
        "arithmetic-0-00002",
        None,
        "math-0-00001",
        "code-1-00000",
    ]
    holders = {
        task.task_id: request.node_id
        for task, request in zip(leased, requests, strict=True)
        if task
    }
    with sessions.begin() as session:
        for task_id, node_id in holders.items():
            row = get_task(session, task_id)
            assert row is not None
            assert (row.state, row.lease_holder, row.fencing_token) == (
                TaskState.LEASED,
                node_id,
                1,
            )
        # The minimum step filters every request of the call.
        enqueue_tasks(session, _tasks(2, "late", step=5), now=T0 + timedelta(seconds=3))
        enqueue_tasks(session, _tasks(1, "early", step=1), now=T0 + timedelta(seconds=4))
        stepped = lease_tasks(
            session,
            [LeaseRequest(b), LeaseRequest(c)],
            now=T0,
            lease_duration=LEASE,
            min_checkpoint_step=5,
        )
    assert [task.task_id if task else None for task in stepped] == [
        "late-5-00000",
        "late-5-00001",
    ]
    with sessions.begin() as session:
        assert lease_tasks(session, [], now=T0, lease_duration=LEASE) == []


def test_extend_give_back_and_transitions(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (worker,) = add_nodes(1)
    with sessions.begin() as session:
        enqueue_tasks(session, _tasks(2), now=T0)
        leased = lease_next_task(session, node_id=worker, now=T0, lease_duration=LEASE)
        assert leased is not None
        later = T0 + timedelta(seconds=50)
        claim = LeaseClaim(leased.task_id, leased.lease_id, leased.fencing_token, worker, later)
        assert extend_leases(
            session, [(leased.lease_id, worker)], now=later, lease_duration=LEASE
        ) == {leased.lease_id}
        task = get_task(session, leased.task_id)
        assert task is not None
        session.refresh(task)
        assert task.lease_deadline == later + LEASE
        assert give_back_task(session, claim, max_attempts=3) is LeaseOutcome.OK
        assert give_back_task(session, claim, max_attempts=3) is (LeaseOutcome.NOT_LEASED)
        again = lease_next_task(session, node_id=worker, now=later, lease_duration=LEASE)
        assert again is not None
        assert again.fencing_token == 2
        # A node that goes offline loses its leases.
        assert requeue_leases_of_node(session, worker, now=later, max_attempts=3).requeued == [
            again.task_id
        ]
        final = lease_next_task(session, node_id=worker, now=later, lease_duration=LEASE)
        assert final is not None
        assert (
            submit_task(
                session,
                LeaseClaim(final.task_id, final.lease_id, final.fencing_token, worker, later),
            )
            is LeaseOutcome.OK
        )
        assert transition_task(
            session,
            final.task_id,
            from_state=TaskState.SUBMITTED,
            to_state=TaskState.VALIDATING,
            now=later,
        )
        assert not transition_task(
            session,
            final.task_id,
            from_state=TaskState.SUBMITTED,
            to_state=TaskState.ACCEPTED,
            now=later,
        )
        with pytest.raises(ValueError, match="lease_next_task"):
            transition_task(
                session,
                final.task_id,
                from_state=TaskState.VALIDATING,
                to_state=TaskState.QUEUED,
                now=later,
            )


def test_concurrent_workers_lease_every_task_exactly_once(
    migrated_engine: Engine, sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    workers = add_nodes(6)
    total = 240
    with sessions.begin() as session:
        enqueue_tasks(session, _tasks(total), now=T0)
    barrier = threading.Barrier(len(workers))
    leased: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(node_id: str) -> None:
        try:
            barrier.wait(timeout=30)
            while True:
                with sessions.begin() as session:
                    task = lease_next_task(session, node_id=node_id, now=T0, lease_duration=LEASE)
                if task is None:
                    return
                with lock:
                    leased.append(task.task_id)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(node,)) for node in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    counts = Counter(leased)
    assert len(counts) == total
    assert set(counts.values()) == {1}
    with sessions.begin() as session:
        assert count_tasks_by_state(session) == {TaskState.LEASED: total}


@postgres_only
def test_skip_locked_lets_a_second_replica_lease_past_an_open_transaction(
    migrated_engine: Engine, sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    """On PostgreSQL a replica never waits on (or re-leases) a task another one is leasing."""
    first_worker, second_worker = add_nodes(2)
    with sessions.begin() as session:
        enqueue_tasks(session, _tasks(2), now=T0)
    with sessions.begin() as replica_a:
        held = lease_next_task(replica_a, node_id=first_worker, now=T0, lease_duration=LEASE)
        assert held is not None
        # Replica A has not committed; replica B must skip its row, not block on it.
        with sessions.begin() as replica_b:
            replica_b.connection().exec_driver_sql("SET LOCAL lock_timeout = '2s'")
            other = lease_next_task(replica_b, node_id=second_worker, now=T0, lease_duration=LEASE)
            assert other is not None
            assert other.task_id != held.task_id


def test_a_large_demand_leaves_postgres_leasing_by_index(
    migrated_engine: Engine, sessions: sessionmaker[Session]
) -> None:
    """Stale statistics after a bulk enqueue made PostgreSQL sort every queued task per lease."""
    if migrated_engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL's planner statistics; SQLite plans this query by index anyway")
    with sessions.begin() as session:
        enqueue_tasks(session, _tasks(3000), now=T0)
    statement = _CANDIDATES[(True, True)].statement
    assert isinstance(statement, Select)
    candidate = statement.params(environments=["arithmetic"], min_step=0, limit=1)
    sql = candidate.compile(migrated_engine, compile_kwargs={"literal_binds": True})
    with sessions.begin() as session:
        plan = "\n".join(row[0] for row in session.execute(text(f"EXPLAIN {sql}")))
    assert "Index Scan using ix_tasks_state_created_at_id" in plan, plan
    assert "Sort" not in plan, plan


def test_every_lease_that_ends_without_credit_is_recorded(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    worker, other = add_nodes(2)
    with sessions.begin() as session:
        enqueue_tasks(session, _tasks(1), now=T0)
        first = lease_next_task(session, node_id=worker, now=T0, lease_duration=LEASE)
        assert first is not None
        assert (
            give_back_task(
                session,
                LeaseClaim(first.task_id, first.lease_id, first.fencing_token, worker, T0),
                max_attempts=5,
                reason="FAIL_REASON_DEADLINE",
                detail="x" * 500,
            )
            is LeaseOutcome.OK
        )
        second = lease_next_task(session, node_id=other, now=T0, lease_duration=LEASE)
        assert second is not None
        late = T0 + 2 * LEASE
        expired = requeue_expired_leases(session, now=late, max_attempts=5)
        assert [e.lease_id for e in expired.ended] == [second.lease_id]
        third = lease_next_task(session, node_id=worker, now=late, lease_duration=LEASE)
        assert third is not None
        taken = requeue_leases_of_node(session, worker, now=late, max_attempts=5)
        assert [(e.node_id, e.fencing_token) for e in taken.ended] == [(worker, 3)]
        # A failed give-back (the lease is gone) records nothing.
        assert (
            give_back_task(
                session,
                LeaseClaim(third.task_id, third.lease_id, third.fencing_token, worker, late),
                max_attempts=5,
            )
            is not LeaseOutcome.OK
        )
        rows = [
            (a.node_id, a.lease_id, a.fencing_token, a.outcome, a.reason, len(a.detail), a.ended_at)
            for a in attempts_of_task(session, first.task_id)
        ]
        assert rows == [
            (worker, first.lease_id, 1, AttemptOutcome.GIVEN_BACK, "FAIL_REASON_DEADLINE", 200, T0),
            (other, second.lease_id, 2, AttemptOutcome.EXPIRED, "", 0, late),
            (worker, third.lease_id, 3, AttemptOutcome.TAKEN_BACK, "", 0, late),
        ]
        assert attempts_of_node(session, worker) == {
            AttemptOutcome.GIVEN_BACK: 1,
            AttemptOutcome.TAKEN_BACK: 1,
        }
        assert attempts_of_node(session, worker, since=late) == {AttemptOutcome.TAKEN_BACK: 1}


def test_the_staleness_floor_follows_the_newest_checkpoint() -> None:
    assert oldest_leasable_step(None, 2) is None
    assert oldest_leasable_step(1, 2) == 0
    assert oldest_leasable_step(5, 2) == 3
    assert oldest_leasable_step(5, 0) == 5


def test_stale_queued_tasks_expire_in_batches_and_fresh_or_leased_ones_stay(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (worker,) = add_nodes(1)
    with sessions.begin() as session:
        enqueue_tasks(session, _tasks(4, step=0), now=T0)
        enqueue_tasks(session, _tasks(1, step=1), now=T0 + timedelta(seconds=1))
        enqueue_tasks(session, _tasks(1, step=3), now=T0 + timedelta(seconds=2))
        record_checkpoints(session, range(4), now=T0)
    with sessions.begin() as session:
        held = lease_next_task(session, node_id=worker, now=T0, lease_duration=LEASE)
        assert held is not None
        assert held.task_id == "arithmetic-0-00000"
    now = T0 + timedelta(seconds=5)
    with sessions.begin() as session:
        floor = oldest_leasable_step(latest_checkpoint_step(session), 2)
        assert floor == 1
        # Oldest first, at most ``limit`` per call.
        first = expire_stale_tasks(session, min_checkpoint_step=floor, now=now, limit=2)
        assert first == ["arithmetic-0-00001", "arithmetic-0-00002"]
    with sessions.begin() as session:
        rest = expire_stale_tasks(session, min_checkpoint_step=floor, now=now)
        assert rest == ["arithmetic-0-00003"]
        # Nothing left: a second sweep (or replica) ends nothing twice.
        assert expire_stale_tasks(session, min_checkpoint_step=floor, now=now) == []
    with sessions.begin() as session:
        assert count_tasks_by_state(session) == {
            TaskState.EXPIRED: 3,
            TaskState.LEASED: 1,
            TaskState.QUEUED: 2,
        }
        expired = get_task(session, "arithmetic-0-00001")
        assert expired is not None
        assert (expired.state, expired.attempt, expired.updated_at) == (TaskState.EXPIRED, 0, now)
        leased = get_task(session, held.task_id)
        assert leased is not None
        assert leased.state is TaskState.LEASED
        # The fresh ones are still leased, oldest first.
        fresh = lease_next_task(
            session, node_id=worker, now=now, lease_duration=LEASE, min_checkpoint_step=floor
        )
        assert fresh is not None
        assert fresh.task_id == "arithmetic-1-00000"
    with sessions.begin() as session, pytest.raises(ValueError, match="limit"):
        expire_stale_tasks(session, min_checkpoint_step=floor, now=now, limit=0)


def test_a_requeued_stale_task_expires_and_its_history_stays(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (worker,) = add_nodes(1)
    with sessions.begin() as session:
        enqueue_tasks(session, _tasks(1, step=0), now=T0)
        assert lease_next_task(session, node_id=worker, now=T0, lease_duration=LEASE)
    later = T0 + 2 * LEASE
    with sessions.begin() as session:
        # Left alone while leased, even past its deadline: only the lease sweep takes it back.
        assert expire_stale_tasks(session, min_checkpoint_step=3, now=later) == []
        assert requeue_expired_leases(session, now=later, max_attempts=3).requeued
        assert expire_stale_tasks(session, min_checkpoint_step=3, now=later) == [
            "arithmetic-0-00000"
        ]
    with sessions.begin() as session:
        task = get_task(session, "arithmetic-0-00000")
        assert task is not None
        assert (task.state, task.attempt) == (TaskState.EXPIRED, 1)
        assert [a.outcome for a in attempts_of_task(session, task.id)] == [AttemptOutcome.EXPIRED]


@postgres_only
def test_two_replicas_expire_disjoint_tasks_without_waiting(
    migrated_engine: Engine, sessions: sessionmaker[Session]
) -> None:
    """On PostgreSQL a replica skips the stale tasks another one is ending, never waits."""
    with sessions.begin() as session:
        enqueue_tasks(session, _tasks(3, step=0), now=T0)
    ended: list[str] = []
    with sessions.begin() as replica_a:
        ended += expire_stale_tasks(replica_a, min_checkpoint_step=1, now=T0, limit=2)
        with sessions.begin() as replica_b:
            replica_b.connection().exec_driver_sql("SET LOCAL lock_timeout = '2s'")
            ended += expire_stale_tasks(replica_b, min_checkpoint_step=1, now=T0)
    assert sorted(ended) == [f"arithmetic-0-{i:05d}" for i in range(3)]
    with sessions.begin() as session:
        assert count_tasks_by_state(session) == {TaskState.EXPIRED: 3}
