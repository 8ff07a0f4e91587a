"""Dispatch: per-node concurrency caps, lease expiry with attempt+1 up to max_attempts then
FAILED, stale fencing tokens refused, FailTask requeues, long polls wake when work arrives."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import grpc
import pytest
from coordinator_testing import (
    make_work,
    publish_checkpoint,
    pull,
    register,
    request_tasks,
    sqlite_only,
    upload_and_commit,
)
from google.protobuf.duration_pb2 import Duration
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rollnet.ledger import idempotency, overview
from rollnet.ledger import tasks as task_repo
from rollnet.ledger.enums import NodeState, TaskState
from rollnet.ledger.group_commit import GroupCommitWriter
from rollnet.ledger.models import Node, Task
from rollnet.reference.coordinator.config import CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.server import Coordinator, start_coordinator, sweep_once
from rollnet.sdk import ErrorReason, Identity, RollnetClient, RollnetError
from rollnet.sdk.identity import node_id_from_public_key
from rollnet.sdk.testing import connect, wait_until
from rollnet.v1 import common_pb2, node_pb2, task_pb2, task_service_pb2


@pytest.fixture
async def short_leases(coordinator_config: CoordinatorConfig) -> AsyncIterator[Coordinator]:
    """Leases of 0.6 s, two attempts per task, a sweeper every 50 ms."""
    config = with_overrides(
        coordinator_config,
        heartbeat_interval=timedelta(seconds=0.2),
        heartbeat_interval_min=timedelta(seconds=0.05),
        lease_duration=timedelta(seconds=0.6),
        max_attempts=2,
        sweep_interval=timedelta(seconds=0.05),
    )
    running = await start_coordinator(config)
    try:
        yield running
    finally:
        await running.stop(grace=0.1)


async def _task_state(coordinator: Coordinator, task_id: str) -> TaskState:
    def read(session: Session) -> TaskState:
        row = task_repo.get_task(session, task_id)
        assert row is not None
        return TaskState(row.state)

    return await coordinator.ctx.run_in_transaction(read)


async def _trainer(coordinator: Coordinator, identity: Identity) -> RollnetClient:
    trainer = connect(coordinator.address, identity)
    await register(trainer, identity, common_pb2.ROLE_TRAINER)
    await publish_checkpoint(trainer, identity, step=1)
    return trainer


async def test_concurrency_caps(
    coordinator_config: CoordinatorConfig, trainer_identity: Identity
) -> None:
    # Leases last long enough here that none runs out and frees a slot during the test.
    coordinator = await start_coordinator(with_overrides(coordinator_config, max_leases_per_node=2))
    trainer = await _trainer(coordinator, trainer_identity)
    greedy, modest = Identity.generate(), Identity.generate()
    first = connect(coordinator.address, greedy)
    second = connect(coordinator.address, modest)
    try:
        await register(first, greedy, common_pb2.ROLE_WORKER)
        # The node may ask for fewer leases than the coordinator's cap, never for more.
        await register(
            second,
            modest,
            common_pb2.ROLE_WORKER,
            capabilities=node_pb2.Capabilities(
                environments=["arithmetic"], max_concurrent_leases=1
            ),
        )
        await request_tasks(trainer, 5)
        leases = [await pull(first, wait=0), await pull(first, wait=0)]
        assert all(p.HasField("task") for p in leases)
        capped = await pull(first, wait=0.2)
        assert not capped.HasField("task"), "the coordinator's cap is 2 leases per node"
        assert capped.retry_after.ToTimedelta() > timedelta(0)
        assert (await pull(second, wait=0)).HasField("task")
        assert not (await pull(second, wait=0)).HasField("task"), "the node asked for 1 lease"
        # Giving one back frees a slot.
        given_back = await first.tasks.fail_task(
            task_service_pb2.FailTaskRequest(
                lease_id=leases[0].lease.lease_id,
                fencing_token=leases[0].lease.fencing_token,
                reason=task_service_pb2.FAIL_REASON_DEADLINE,
            )
        )
        assert given_back.requeued
        assert (await pull(first, wait=0)).HasField("task")
    finally:
        for c in (trainer, first, second):
            await c.close()
        await coordinator.stop(grace=0.1)


async def test_expiry_requeues_then_fails_and_stale_submits_are_refused(
    short_leases: Coordinator, trainer_identity: Identity
) -> None:
    trainer = await _trainer(short_leases, trainer_identity)
    worker, rescuer = Identity.generate(), Identity.generate()
    slow = connect(short_leases.address, worker)
    other = connect(short_leases.address, rescuer)
    try:
        await register(slow, worker, common_pb2.ROLE_WORKER)
        await register(other, rescuer, common_pb2.ROLE_WORKER)
        [task_id] = await request_tasks(trainer, 1)
        first = await pull(slow)
        assert (first.task.task_id, first.task.attempt, first.lease.fencing_token) == (
            task_id,
            1,
            1,
        )
        # The lease runs out: the sweeper requeues the task and someone else gets attempt 2.
        second = await pull(other, wait=5)
        assert (second.task.task_id, second.lease.fencing_token) == (task_id, 2)
        assert second.lease.lease_id != first.lease.lease_id

        # The slow worker finishes late: its fencing token is stale and the submit is refused.
        late = make_work(worker, first.task, first.lease)
        with pytest.raises(RollnetError) as refused:
            await upload_and_commit(slow, worker, late)
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.reason == ErrorReason.FENCING_TOKEN_STALE
        # Progress reports name a lease id that no longer exists.
        with pytest.raises(RollnetError) as refused:
            await slow.tasks.report_progress(
                task_service_pb2.ReportProgressRequest(
                    lease_id=first.lease.lease_id, fencing_token=first.lease.fencing_token
                )
            )
        assert refused.value.reason == ErrorReason.LEASE_NOT_FOUND

        # The second lease runs out too: max_attempts = 2, so the task is FAILED, not requeued.
        async def failed() -> bool:
            return await _task_state(short_leases, task_id) is TaskState.FAILED

        await wait_until(failed, within=10, what="task FAILED after max_attempts")
        assert not (await pull(other, wait=0.2)).HasField("task")
        with pytest.raises(RollnetError) as refused:
            await upload_and_commit(other, rescuer, make_work(rescuer, second.task, second.lease))
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        # The task is FAILED because its lease ran out: expired, as before the sweep.
        assert refused.value.reason == ErrorReason.LEASE_EXPIRED
    finally:
        for c in (trainer, slow, other):
            await c.close()


async def test_the_sweep_expires_tasks_queued_behind_the_staleness_bound(
    coordinator: Coordinator, trainer_identity: Identity
) -> None:
    """Tasks no worker may lease any more (checkpoint more than async_level = 2 behind) end as
    EXPIRED; the leased one and the fresh one are left alone; sweeping again changes nothing."""
    trainer = await _trainer(coordinator, trainer_identity)
    worker = Identity.generate()
    client = connect(coordinator.address, worker)
    try:
        await register(client, worker, common_pb2.ROLE_WORKER)
        old = await request_tasks(trainer, 3)
        held = (await pull(client, wait=0)).task.task_id
        stale = sorted(set(old) - {held})
        for step in (2, 3, 4):
            await publish_checkpoint(trainer, trainer_identity, step=step)
        [fresh] = await request_tasks(trainer, 1, step=4)
        for _ in range(2):
            await sweep_once(coordinator.ctx)
            states = {t: await _task_state(coordinator, t) for t in [*old, fresh]}
            assert states == {
                held: TaskState.LEASED,
                stale[0]: TaskState.EXPIRED,
                stale[1]: TaskState.EXPIRED,
                fresh: TaskState.QUEUED,
            }
        assert coordinator.ctx.metrics.tasks_expired._value.get() == 2
        work = await coordinator.ctx.run_in_transaction(overview.open_work)
        assert (work.expired_tasks, work.tasks[TaskState.QUEUED]) == (2, 1)
        pulled = await pull(client, wait=0)
        assert pulled.task.task_id == fresh
    finally:
        for c in (trainer, client):
            await c.close()


async def test_fail_task_requeues_at_once_and_long_poll_wakes_on_new_work(
    coordinator: Coordinator, trainer_identity: Identity
) -> None:
    trainer = await _trainer(coordinator, trainer_identity)
    worker = Identity.generate()
    client = connect(coordinator.address, worker)
    try:
        await register(client, worker, common_pb2.ROLE_WORKER)
        # A long poll on an empty queue is answered as soon as a task is created.
        waiting = asyncio.create_task(pull(client, wait=20))
        assert not waiting.done()
        [task_id] = await request_tasks(trainer, 1)
        woke = await asyncio.wait_for(waiting, timeout=15)
        assert woke.task.task_id == task_id, "the long poll returned the new task, not a timeout"

        given_back = await client.tasks.fail_task(
            task_service_pb2.FailTaskRequest(
                lease_id=woke.lease.lease_id,
                fencing_token=woke.lease.fencing_token,
                reason=task_service_pb2.FAIL_REASON_BACKEND_ERROR,
            )
        )
        assert given_back.requeued
        again = await pull(client, wait=0)
        assert (again.task.task_id, again.lease.fencing_token) == (task_id, 2)
        assert again.task.state == task_pb2.Task.STATE_LEASED
        # Giving back a lease that is not yours is refused.
        with pytest.raises(RollnetError) as refused:
            await client.tasks.fail_task(
                task_service_pb2.FailTaskRequest(lease_id="no-such-lease", fencing_token=1)
            )
        assert refused.value.reason == ErrorReason.LEASE_NOT_FOUND
    finally:
        await trainer.close()
        await client.close()


async def test_a_repeated_pull_request_id_returns_the_same_lease(
    coordinator: Coordinator, trainer_identity: Identity, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = await _trainer(coordinator, trainer_identity)
    worker = Identity.generate()
    client = connect(coordinator.address, worker)
    transactions: list[str] = []
    run_in_transaction = coordinator.ctx.run_in_transaction

    async def recording(work: Callable[[Session], Any], **options: Any) -> Any:
        transactions.append(getattr(work, "func", work).__qualname__)
        return await run_in_transaction(work, **options)

    try:
        await register(client, worker, common_pb2.ROLE_WORKER)
        await request_tasks(trainer, 2)
        request = task_service_pb2.PullTaskRequest(request_id="pull-1")
        monkeypatch.setattr(coordinator.ctx, "run_in_transaction", recording)
        first = await client.tasks.pull_task(request)
        monkeypatch.undo()
        assert first.HasField("lease")
        # The lease and the record of its answer are one transaction (no second one to store).
        assert [name for name in transactions if "sweep" not in name] == ["PullBatcher._work"]
        # The answer was lost, say: the retry gets the same lease, and leases nothing more.
        repeat = await client.tasks.pull_task(request)
        assert repeat == first
        leased = [
            task_id
            for task_id in await _all_task_ids(coordinator)
            if await _task_state(coordinator, task_id) == TaskState.LEASED
        ]
        assert leased == [first.task.task_id]
        # The id reused for a different request is refused, and leases nothing either.
        with pytest.raises(RollnetError) as refused:
            await client.tasks.pull_task(
                task_service_pb2.PullTaskRequest(request_id="pull-1", environments=["arithmetic"])
            )
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.reason == ErrorReason.REQUEST_ID_REUSED
        second = await pull(client, wait=0)
        assert second.task.task_id not in ("", first.task.task_id)
    finally:
        await trainer.close()
        await client.close()


async def test_pulls_that_queue_together_lease_in_one_transaction(
    coordinator: Coordinator, trainer_identity: Identity
) -> None:
    """Pulls waiting on the writer go together; each still gets its own answer."""
    trainer = await _trainer(coordinator, trainer_identity)
    identities = [Identity.generate() for _ in range(4)]
    clients = [connect(coordinator.address, identity) for identity in identities]
    eager, other, ejected, repeat = clients
    writer = coordinator.ctx.group_commit
    released = threading.Event()
    try:
        for client, identity in zip(clients, identities, strict=True):
            await register(client, identity, common_pb2.ROLE_WORKER)
        await request_tasks(trainer, 3)
        ejected_id = node_id_from_public_key(identities[2].public_key)

        def eject(session: Session) -> None:
            session.execute(
                update(Node).where(Node.id == ejected_id).values(state=NodeState.EJECTED)
            )

        await coordinator.ctx.run_in_transaction(eject)
        leases = coordinator.dispatcher.leases
        before = (leases.batches, leases.pulls)
        if writer is not None:
            # Hold the writer so that the pulls below queue up behind it.
            blocker = await _hold(writer, released)
        same = task_service_pb2.PullTaskRequest(request_id="same-id", wait=Duration(seconds=0))
        calls = [
            asyncio.ensure_future(pull(eager, wait=0)),
            asyncio.ensure_future(pull(other, wait=0)),
            asyncio.ensure_future(pull(ejected, wait=0)),
            asyncio.ensure_future(repeat.tasks.pull_task(same)),
            asyncio.ensure_future(repeat.tasks.pull_task(same)),
        ]
        if writer is not None:

            def arrived() -> int:
                # Sent to the writer (the first batch: one pull, or two that came together)
                # or queued for the next batch.
                return leases.pulls - before[1] + leases._queue.qsize()

            await wait_until(lambda: _true(arrived() == 5), what="five pulls with the batcher")
            # The same id on another request, after the first two: told apart, leases nothing.
            reused = task_service_pb2.PullTaskRequest(
                request_id="same-id", wait=Duration(seconds=0), environments=["arithmetic"]
            )
            calls.append(asyncio.ensure_future(repeat.tasks.pull_task(reused)))
            await wait_until(lambda: _true(arrived() == 6), what="six pulls with the batcher")
            released.set()
            await blocker
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        first, second, refused, once, again = outcomes[:5]
        if writer is not None:
            assert isinstance(outcomes[5], RollnetError)
            assert outcomes[5].reason == ErrorReason.REQUEST_ID_REUSED
        assert isinstance(refused, RollnetError)
        assert refused.reason == ErrorReason.NODE_EJECTED
        assert isinstance(first, task_service_pb2.PullTaskResponse)
        assert isinstance(second, task_service_pb2.PullTaskResponse)
        assert isinstance(once, task_service_pb2.PullTaskResponse)
        if writer is not None:
            # The repeated request id within one batch is answered with the same lease, once.
            assert again == once
        else:
            # PostgreSQL: the two race; the loser is answered with the winner's lease, or, when
            # it waited on the node's row and found its cap reached, with no lease at all.
            assert isinstance(again, task_service_pb2.PullTaskResponse)
            if not once.HasField("lease"):
                once, again = again, once
            assert again == once or not again.HasField("lease")
        leased = {first.task.task_id, second.task.task_id, once.task.task_id}
        assert len(leased) == 3
        assert "" not in leased
        states = {task_id: await _task_state(coordinator, task_id) for task_id in leased}
        assert all(state == TaskState.LEASED for state in states.values())
        # Nothing else was leased: one lease per node that was answered with one.
        assert {
            task_id
            for task_id in await _all_task_ids(coordinator)
            if await _task_state(coordinator, task_id) == TaskState.LEASED
        } == leased
        batches, pulls = leases.batches - before[0], leases.pulls - before[1]
        if writer is not None:
            # One batch went to the held writer, one more for all the pulls queued behind it.
            assert (batches, pulls) == (2, 6)
        else:
            assert batches == pulls == 5  # PostgreSQL: a transaction per pull
    finally:
        released.set()
        await trainer.close()
        for client in clients:
            await client.close()


# PostgreSQL leases each pull in a transaction of its own: no batches to test there.
@sqlite_only
async def test_a_pull_cancelled_while_it_waits_for_a_batch_leases_nothing(
    coordinator: Coordinator, trainer_identity: Identity
) -> None:
    writer = coordinator.ctx.group_commit
    assert writer is not None
    trainer = await _trainer(coordinator, trainer_identity)
    staying, leaving = Identity.generate(), Identity.generate()
    stays, leaves = connect(coordinator.address, staying), connect(coordinator.address, leaving)
    released = threading.Event()
    try:
        await register(stays, staying, common_pb2.ROLE_WORKER)
        await register(leaves, leaving, common_pb2.ROLE_WORKER)
        await request_tasks(trainer, 2)
        leases = coordinator.dispatcher.leases
        blocker = await _hold(writer, released)
        kept = asyncio.ensure_future(pull(stays, wait=0))
        # The first pull's batch waits behind the blocker in the writer's queue.
        await wait_until(lambda: _true(writer.backlog == 1), what="the first pull with the writer")
        cancelled = asyncio.ensure_future(pull(leaves, wait=0))
        await wait_until(lambda: _true(leases._queue.qsize() >= 1), what="the pull queued")
        queued = list(leases._queue._queue)  # type: ignore[attr-defined]
        cancelled.cancel()
        # The server hears of the cancellation and cancels the handler waiting on the batch.
        await wait_until(
            lambda: _true(all(p.future is not None and p.future.done() for p in queued)),
            what="the queued pull cancelled on the server",
        )
        pulls_before = leases.pulls
        released.set()
        await blocker
        answer = await kept
        assert answer.HasField("lease")
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        leased = [
            task_id
            for task_id in await _all_task_ids(coordinator)
            if await _task_state(coordinator, task_id) == TaskState.LEASED
        ]
        assert leased == [answer.task.task_id]
        assert leases.pulls == pulls_before  # the cancelled pull never reached the writer
    finally:
        released.set()
        await trainer.close()
        await stays.close()
        await leaves.close()


async def test_a_request_id_repeated_across_long_polls_leases_once_and_spares_the_others(
    coordinator: Coordinator, trainer_identity: Identity
) -> None:
    """Two long polls with one request id wake with work: one lease for both, and every other
    pull of their batch leases too (found in review: a batch failed for all its pulls)."""
    trainer = await _trainer(coordinator, trainer_identity)
    identities = [Identity.generate() for _ in range(6)]
    clients = [connect(coordinator.address, identity) for identity in identities]
    try:
        for client, identity in zip(clients, identities, strict=True):
            await register(client, identity, common_pb2.ROLE_WORKER)
        hostile = clients[0]
        same = task_service_pb2.PullTaskRequest(request_id="twice", wait=Duration(seconds=10))
        calls = [asyncio.ensure_future(hostile.tasks.pull_task(same)) for _ in range(2)]
        calls += [asyncio.ensure_future(pull(client, wait=10)) for client in clients[1:]]
        waiters = coordinator.ctx.signals.work_available._waiters
        # Every pull found no work and long-polls: their request ids were looked up once.
        await wait_until(lambda: _true(len(waiters) == len(calls)), what="every pull waiting")
        await request_tasks(trainer, 10)
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        responses: list[task_service_pb2.PullTaskResponse] = []
        for outcome in outcomes:
            assert isinstance(outcome, task_service_pb2.PullTaskResponse), outcome
            assert outcome.HasField("lease")
            responses.append(outcome)
        first, second, *others = responses
        assert first == second
        assert coordinator.dispatcher.leases.retried == 0  # no batch failed on the way
        leased = {response.task.task_id for response in [first, *others]}
        assert len(leased) == len(clients)
        assert {
            task_id
            for task_id in await _all_task_ids(coordinator)
            if await _task_state(coordinator, task_id) == TaskState.LEASED
        } == leased
    finally:
        await trainer.close()
        for client in clients:
            await client.close()


# PostgreSQL leases each pull in a transaction of its own: no batches to test there.
@sqlite_only
async def test_a_batch_that_fails_is_retried_pull_by_pull(
    coordinator: Coordinator, trainer_identity: Identity, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One pull's failure inside a batch's transaction reaches that pull's caller only; a pull
    whose caller left while the batch was being written is not tried again."""
    writer = coordinator.ctx.group_commit
    assert writer is not None
    trainer = await _trainer(coordinator, trainer_identity)
    identities = [Identity.generate() for _ in range(5)]
    clients = [connect(coordinator.address, identity) for identity in identities]
    broken, leaving = (node_id_from_public_key(i.public_key) for i in identities[1:3])
    store = idempotency.store
    reached, proceed = threading.Event(), threading.Event()

    def failing_store(session: Session, caller_id: str, *args: Any, **kwargs: Any) -> None:
        if caller_id == broken:
            reached.set()
            proceed.wait(10)
            raise IntegrityError("INSERT", {}, Exception("injected"))
        store(session, caller_id, *args, **kwargs)

    released = threading.Event()
    leases = coordinator.dispatcher.leases
    batches: list[list[Any]] = []
    lease_batch = leases._lease_batch

    async def recording(batch: list[Any]) -> list[Any]:
        batches.append(list(batch))
        return await lease_batch(batch)

    try:
        for client, identity in zip(clients, identities, strict=True):
            await register(client, identity, common_pb2.ROLE_WORKER)
        await request_tasks(trainer, 5)
        monkeypatch.setattr(idempotency, "store", failing_store)
        monkeypatch.setattr(leases, "_lease_batch", recording)
        blocker = await _hold(writer, released)
        first = asyncio.ensure_future(pull(clients[0], wait=0))
        await wait_until(lambda: _true(writer.backlog == 1), what="a pull with the writer")
        before = (leases.batches, leases.pulls, leases.retried)
        calls = [
            asyncio.ensure_future(
                client.tasks.pull_task(
                    task_service_pb2.PullTaskRequest(request_id=f"r{n}", wait=Duration())
                )
            )
            for n, client in enumerate(clients[1:])
        ]
        await wait_until(lambda: _true(leases._queue.qsize() == 4), what="four pulls queued")
        released.set()
        await blocker
        assert (await first).HasField("lease")
        # The batch of four is being written; one of its callers leaves now.
        await wait_until(lambda: _true(reached.is_set()), what="the batch in the writer")
        calls[1].cancel()
        await wait_until(
            lambda: _true(
                any(p.caller.node_id == leaving and p.future.done() for p in batches[-1])
            ),
            what="the server to hear of the cancellation",
        )
        proceed.set()
        failed, gone, *fine = await asyncio.gather(*calls, return_exceptions=True)
        assert isinstance(failed, RollnetError)
        assert isinstance(gone, asyncio.CancelledError)
        for outcome in fine:
            assert isinstance(outcome, task_service_pb2.PullTaskResponse)
            assert outcome.HasField("lease")
        # The batch of four, then each of the three still there alone.
        assert (
            leases.batches - before[0],
            leases.pulls - before[1],
            leases.retried - before[2],
        ) == (4, 7, 3)
        holders = {
            await _lease_holder(coordinator, task_id)
            for task_id in await _all_task_ids(coordinator)
            if await _task_state(coordinator, task_id) == TaskState.LEASED
        }
        # The failed pull's lease was rolled back with it; the one who left holds none.
        assert len(holders) == 3
        assert broken not in holders
        assert leaving not in holders
    finally:
        released.set()
        proceed.set()
        await trainer.close()
        for client in clients:
            await client.close()


async def _lease_holder(coordinator: Coordinator, task_id: str) -> str | None:
    def read(session: Session) -> str | None:
        row = task_repo.get_task(session, task_id)
        assert row is not None
        return row.lease_holder

    return await coordinator.ctx.run_read(read)


@pytest.mark.parametrize(
    ("environments", "field"),
    [
        (["arithmetic"] * 65, "environments"),
        ([""], "environments[0]"),
        (["x" * 65], "environments[0]"),
    ],
    ids=["too-many", "empty-name", "long-name"],
)
async def test_a_pull_with_an_absurd_environment_filter_is_refused(
    coordinator: Coordinator, environments: list[str], field: str
) -> None:
    """A pull's filter is bounded like registered capabilities (it shares a batch's query)."""
    worker = Identity.generate()
    client = connect(coordinator.address, worker)
    try:
        await register(client, worker, common_pb2.ROLE_WORKER)
        with pytest.raises(RollnetError) as refused:
            await client.tasks.pull_task(
                task_service_pb2.PullTaskRequest(environments=environments, wait=Duration())
            )
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert [v.field for v in refused.value.field_violations] == [field]
        fine = await client.tasks.pull_task(
            task_service_pb2.PullTaskRequest(environments=["arithmetic"] * 64, wait=Duration())
        )
        assert not fine.HasField("lease")
    finally:
        await client.close()


async def _hold(writer: GroupCommitWriter, released: threading.Event) -> asyncio.Future[Any]:
    """Occupy the writer thread until ``released`` is set; returns once it is occupied."""
    started = threading.Event()

    def hold(_session: Session) -> None:
        started.set()
        released.wait(10)

    held = writer.submit(hold)
    await wait_until(lambda: _true(started.is_set()), what="the writer held")
    return held


async def _true(value: bool) -> bool:
    return value


async def _all_task_ids(coordinator: Coordinator) -> list[str]:
    def read(session: Session) -> list[str]:
        return list(session.scalars(select(Task.id)))

    return await coordinator.ctx.run_read(read)
