"""Runtime behaviour with a model-free generator: retry-forever start, fatal refusals, and a
lease the coordinator declares invalid cancels its generation."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest
from swarm_testing import Ledger
from worker_testing import (
    EchoGenerator,
    coordinator_config_for,
    request_tasks,
    start_trainer,
    worker_config,
)

from rollnet.ledger.enums import NodeState, TaskState
from rollnet.reference.coordinator.config import CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.sdk.identity import Identity
from rollnet.sdk.testing import connect, free_port, wait_until
from rollnet.sdk.worker import LeaseContext, LeaseLost, RolloutGenerator, Worker, WorkerFatalError
from rollnet.v1 import rollout_pb2, task_pb2, task_service_pb2


@pytest.mark.timeout(180)
async def test_waits_for_an_unreachable_coordinator_then_works(
    tmp_path: Path,
    sqlite_url: str,
    trainer_identity: Identity,
    tiny_model: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="rollnet.worker")
    address = f"127.0.0.1:{free_port()}"
    config = coordinator_config_for(tmp_path, sqlite_url, trainer_identity, listen=address)
    worker = Worker(
        worker_config(address, tmp_path / "worker"), Identity.generate(), EchoGenerator()
    )
    running = asyncio.create_task(worker.run())
    coordinator = None
    ledger = Ledger(sqlite_url)
    try:
        await wait_until(
            lambda: sum("call_failed_retrying" in r.getMessage() for r in caplog.records) >= 3,
            within=40,
            what="the worker to retry registration",
        )
        assert not running.done()
        coordinator = await start_coordinator(config)
        # (gRPC shares one subchannel per address across channels: until the worker's
        # reconnect succeeds, a new client would fail fast too.)
        await wait_until(
            lambda: ledger.node_state(worker.node_id) is not None, within=40, what="registration"
        )
        trainer = await start_trainer(address, trainer_identity, tiny_model)
        await request_tasks(trainer, 1)
        await trainer.close()
        await wait_until(lambda: worker.receipts_kept == 1, within=60, what="a receipt")
        worker.request_stop()
        await asyncio.wait_for(running, 20)
    finally:
        if not running.done():
            running.cancel()
        if coordinator is not None:
            await coordinator.stop(grace=0.5)
        ledger.close()


async def test_wrong_network_is_fatal_with_a_clear_message(
    coordinator_config: CoordinatorConfig, tmp_path: Path
) -> None:
    coordinator = await start_coordinator(coordinator_config)
    try:
        settings = worker_config(coordinator.address, tmp_path / "w", network_id="another-net")
        worker = Worker(settings, Identity.generate(), EchoGenerator())
        with pytest.raises(WorkerFatalError, match="AUDIENCE_MISMATCH"):
            await asyncio.wait_for(worker.run(), 20)
    finally:
        await coordinator.stop(grace=0.5)


@pytest.mark.timeout(180)
async def test_lease_reported_invalid_cancels_the_generation(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    tiny_model: Path,
    tmp_path: Path,
    sqlite_url: str,
) -> None:
    coordinator = await start_coordinator(coordinator_config)
    ledger = Ledger(sqlite_url)
    trainer = await start_trainer(coordinator.address, trainer_identity, tiny_model)
    identity = Identity.generate()
    generator = EchoGenerator(hold_first=True)
    worker = Worker(worker_config(coordinator.address, tmp_path / "w"), identity, generator)
    running = asyncio.create_task(worker.run())
    try:
        (task_id,) = await request_tasks(trainer, 1)
        await wait_until(lambda: len(generator.leases) == 1, within=40, what="a lease")
        held = generator.leases[0]
        # The lease ends behind the worker's back (as when an operator revokes it).
        rogue = connect(coordinator.address, identity)
        await rogue.tasks.fail_task(
            task_service_pb2.FailTaskRequest(
                lease_id=held.lease_id,
                fencing_token=held.lease.fencing_token,
                reason=task_service_pb2.FAIL_REASON_BACKEND_ERROR,
            )
        )
        await rogue.close()
        await wait_until(lambda: held.cancelled, within=30, what="the heartbeat to cancel it")
        assert "no longer valid" in held.cancel_reason
        # The requeued task is leased again (attempt 2) and this time committed, once.
        await wait_until(lambda: worker.receipts_kept == 1, within=40, what="a receipt")
        assert ledger.commitments_per_task() == {task_id: [identity.node_id]}
        assert generator.leases[1].lease.fencing_token == 2
        worker.request_stop()
        await asyncio.wait_for(running, 20)
    finally:
        if not running.done():
            running.cancel()
        await trainer.close()
        await coordinator.stop(grace=0.5)
        ledger.close()


@pytest.mark.timeout(180)
async def test_stop_gives_back_a_task_that_does_not_finish_within_the_drain(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    tiny_model: Path,
    tmp_path: Path,
    sqlite_url: str,
) -> None:
    coordinator = await start_coordinator(coordinator_config)
    ledger = Ledger(sqlite_url)
    trainer = await start_trainer(coordinator.address, trainer_identity, tiny_model)
    identity = Identity.generate()
    generator = EchoGenerator(hold_first=True)
    settings = worker_config(coordinator.address, tmp_path / "w", drain_timeout=0.5)
    worker = Worker(settings, identity, generator)
    running = asyncio.create_task(worker.run())
    try:
        (task_id,) = await request_tasks(trainer, 1)
        await wait_until(lambda: len(generator.leases) == 1, within=40, what="a lease")
        worker.request_stop()
        await asyncio.wait_for(running, 20)
        assert generator.leases[0].cancel_reason == "the worker is draining"
        assert ledger.task_states()[task_id][0] is TaskState.QUEUED
        assert ledger.leased_by(identity.node_id) == []
        assert ledger.node_state(identity.node_id) is NodeState.DEREGISTERED
        assert ledger.commitment_count() == 0
    finally:
        if not running.done():
            running.cancel()
        await trainer.close()
        await coordinator.stop(grace=0.5)
        ledger.close()


class SlowGenerator(RolloutGenerator):
    """Reports one rollout of many done, then never progresses (until cancelled)."""

    def __init__(self) -> None:
        self.leases: list[LeaseContext] = []

    async def generate(
        self, task: task_pb2.Task, lease: LeaseContext
    ) -> Sequence[rollout_pb2.Rollout]:
        self.leases.append(lease)
        lease.report_progress(1, 1000)
        while not lease.cancelled:  # noqa: ASYNC110 - the flag is set from another thread
            await asyncio.sleep(0.02)
        raise LeaseLost(lease.cancel_reason)


@pytest.mark.timeout(180)
@pytest.mark.slow
async def test_a_task_that_cannot_finish_before_its_deadline_is_abandoned(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    tiny_model: Path,
    tmp_path: Path,
) -> None:
    coordinator = await start_coordinator(coordinator_config)
    trainer = await start_trainer(coordinator.address, trainer_identity, tiny_model)
    generator = SlowGenerator()
    settings = worker_config(coordinator.address, tmp_path / "w", deregister_timeout=0.5)
    worker = Worker(settings, Identity.generate(), generator)
    running = asyncio.create_task(worker.run())
    try:
        await request_tasks(trainer, 1)
        await trainer.close()
        await wait_until(lambda: len(generator.leases) == 1, within=40, what="a lease")
        # Heartbeats stop getting through, so the lease will not be extended: at 1 rollout per
        # several seconds, 999 more cannot be done before the deadline.
        await coordinator.stop(grace=0)
        lease = generator.leases[0]
        await wait_until(lambda: lease.cancelled, within=40, what="the task to be abandoned")
        assert lease.cancel_reason == "cannot finish before the lease deadline"
        assert lease.give_back_reason == task_service_pb2.FAIL_REASON_DEADLINE
        worker.request_stop()
        await asyncio.wait_for(running, 30)
    finally:
        if not running.done():
            running.cancel()


@pytest.mark.timeout(180)
@pytest.mark.slow
async def test_an_upload_over_the_quota_is_dropped_and_the_worker_carries_on(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    tiny_model: Path,
    tmp_path: Path,
) -> None:
    # A quota smaller than any batch: every upload is refused from its header.
    coordinator = await start_coordinator(with_overrides(coordinator_config, upload_quota_bytes=16))
    trainer = await start_trainer(coordinator.address, trainer_identity, tiny_model)
    generator = EchoGenerator()
    worker = Worker(
        worker_config(coordinator.address, tmp_path / "w"), Identity.generate(), generator
    )
    running = asyncio.create_task(worker.run())
    try:
        await request_tasks(trainer, 2)
        await wait_until(lambda: len(worker.outbox.dropped()) == 2, within=60, what="two drops")
        reasons = [reason for _, reason in worker.outbox.dropped()]
        assert all("UPLOAD_QUOTA_EXCEEDED" in reason for reason in reasons), reasons
        assert not running.done(), "a refused upload is not fatal"
        assert worker.receipts_kept == 0
        worker.request_stop()
        await asyncio.wait_for(running, 20)
    finally:
        if not running.done():
            running.cancel()
        await trainer.close()
        await coordinator.stop(grace=0.5)


@pytest.mark.timeout(180)
async def test_a_receipt_whose_signature_fails_is_not_stored(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    tiny_model: Path,
    tmp_path: Path,
) -> None:
    """Receipts signed by another key than the coordinator's of registration prove nothing:
    the submission is dropped with that reason, no receipt is kept."""
    coordinator = await start_coordinator(coordinator_config)
    trainer = await start_trainer(coordinator.address, trainer_identity, tiny_model)
    worker = Worker(
        worker_config(coordinator.address, tmp_path / "w"), Identity.generate(), EchoGenerator()
    )
    running = asyncio.create_task(worker.run())
    try:
        await wait_until(lambda: bool(worker.coordinator_public_key), within=30, what="registered")
        coordinator.ctx.identity = Identity.generate()  # receipts signed by a key nobody named
        await request_tasks(trainer, 1)
        await wait_until(lambda: len(worker.outbox.dropped()) == 1, within=60, what="a drop")
        [(_, reason)] = worker.outbox.dropped()
        assert "receipt's signature does not verify" in reason
        assert worker.receipts_invalid == 1
        assert worker.receipts_kept == 0
        assert worker.outbox.receipts() == []
        worker.request_stop()
        await asyncio.wait_for(running, 20)
    finally:
        if not running.done():
            running.cancel()
        await trainer.close()
        await coordinator.stop(grace=0.5)
