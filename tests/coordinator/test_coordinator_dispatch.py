"""Dispatch: per-node concurrency caps, lease expiry with attempt+1 up to max_attempts then
FAILED, stale fencing tokens refused, FailTask requeues, long polls wake when work arrives."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import grpc
import pytest
from coordinator_testing import (
    connect,
    make_work,
    publish_checkpoint,
    pull,
    register,
    request_tasks,
    upload_and_commit,
    wait_until,
)
from sqlalchemy import select
from sqlalchemy.orm import Session

from rollnet.ledger import tasks as task_repo
from rollnet.ledger.enums import TaskState
from rollnet.ledger.models import Task
from rollnet.reference.coordinator.config import CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.server import Coordinator, start_coordinator
from rollnet.sdk import ErrorReason, Identity, RollnetClient, RollnetError
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
        assert refused.value.reason == ErrorReason.LEASE_CLOSED  # the task is FAILED
    finally:
        for c in (trainer, slow, other):
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

    async def recording(work: Callable[[Session], Any]) -> Any:
        transactions.append(work.__qualname__)
        return await run_in_transaction(work)

    try:
        await register(client, worker, common_pb2.ROLE_WORKER)
        await request_tasks(trainer, 2)
        request = task_service_pb2.PullTaskRequest(request_id="pull-1")
        monkeypatch.setattr(coordinator.ctx, "run_in_transaction", recording)
        first = await client.tasks.pull_task(request)
        monkeypatch.undo()
        assert first.HasField("lease")
        # The lease and the record of its answer are one transaction (no second one to store).
        assert [name for name in transactions if "sweep" not in name] == [
            "Dispatcher.pull.<locals>.work"
        ]
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


async def _all_task_ids(coordinator: Coordinator) -> list[str]:
    def read(session: Session) -> list[str]:
        return list(session.scalars(select(Task.id)))

    return await coordinator.ctx.run_read(read)
