"""The coordinator dies mid-run and comes back; the worker resumes and loses nothing. A worker
restarted with unsubmitted work in its outbox resubmits it idempotently: nothing is committed
(or credited) twice."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from swarm_testing import Ledger
from worker_testing import (
    CoordinatorProcess,
    coordinator_config_for,
    request_tasks,
    start_trainer,
    worker_config,
)

from rollnet.reference.cli import main as cli_main
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.reference.worker import InferenceGenerator, make_backend
from rollnet.sdk.checkpoints import CheckpointStore
from rollnet.sdk.identity import Identity
from rollnet.sdk.testing import NETWORK_ID, connect, free_port, wait_until
from rollnet.sdk.worker import PROTOCOL_VERSION, LeaseContext, Worker
from rollnet.v1 import common_pb2, node_pb2, node_service_pb2, rollout_pb2, task_pb2


class GatedGenerator(InferenceGenerator):
    """Generates for real, then holds the result until the test opens the gate."""

    def __init__(self, data_dir: Path) -> None:
        store = CheckpointStore(data_dir / "checkpoints", network_id=NETWORK_ID)
        super().__init__(lambda: make_backend("torch"), store)
        self.generated = asyncio.Event()
        self.gate = asyncio.Event()
        self.holding = True

    async def generate(
        self, task: task_pb2.Task, lease: LeaseContext
    ) -> Sequence[rollout_pb2.Rollout]:
        rollouts = await super().generate(task, lease)
        if self.holding:
            self.generated.set()
            await self.gate.wait()
            self.generated.clear()
            self.gate.clear()
        return rollouts


@pytest.mark.timeout(180)
@pytest.mark.slow
async def test_coordinator_restart_and_worker_restart_lose_nothing(
    tmp_path: Path, sqlite_url: str, trainer_identity: Identity, tiny_model: Path
) -> None:
    # Long lease and liveness windows: the outages below must not expire anything.
    config = coordinator_config_for(
        tmp_path,
        sqlite_url,
        trainer_identity,
        listen=f"127.0.0.1:{free_port()}",
        lease_duration=timedelta(seconds=60),
        suspect_after_missed=30.0,
        offline_after_missed=60.0,
    )
    coordinator = await start_coordinator(config)
    address = coordinator.address
    ledger = Ledger(sqlite_url)
    identity = Identity.generate()
    data_dir = tmp_path / "worker"
    trainer = await start_trainer(address, trainer_identity, tiny_model)
    generator = GatedGenerator(data_dir)
    settings = worker_config(address, data_dir, drain_timeout=1.0, deregister_timeout=1.0)
    worker = Worker(settings, identity, generator)
    running = asyncio.create_task(worker.run())
    try:
        # 1. The coordinator dies while a task is being generated; the same worker resumes.
        first, second = await request_tasks(trainer, 2)
        await asyncio.wait_for(generator.generated.wait(), 60)
        await trainer.close()
        await coordinator.stop(grace=0)
        generator.gate.set()
        await wait_until(lambda: len(worker.outbox.pending()) == 1, within=30, what="outbox")
        kept = worker.outbox.pending()[0]
        coordinator = await start_coordinator(config)
        await wait_until(lambda: worker.receipts_kept == 1, within=60, what="receipt 1")

        # 2. It dies again mid-task; this time the worker is stopped with the work unsubmitted.
        await asyncio.wait_for(generator.generated.wait(), 60)
        await coordinator.stop(grace=0)
        generator.gate.set()
        await wait_until(lambda: len(worker.outbox.pending()) == 1, within=30, what="outbox 2")
        worker.request_stop()
        await asyncio.wait_for(running, 30)

        # 3. Coordinator back; a new worker process (same key and data dir) resubmits.
        coordinator = await start_coordinator(config)
        restarted = Worker(settings, identity, GatedGenerator(data_dir))
        running = asyncio.create_task(restarted.run())
        await wait_until(lambda: restarted.receipts_kept == 1, within=60, what="resubmit")
        restarted.request_stop()
        await asyncio.wait_for(running, 30)

        committed = ledger.commitments_per_task()
        assert committed == {first: [identity.node_id], second: [identity.node_id]}

        # A third submission of the first batch, same request id: the original receipt again.
        client = connect(address, identity)
        try:
            await client.nodes.register_node(
                node_service_pb2.RegisterNodeRequest(
                    public_key=identity.public_key,
                    role=common_pb2.ROLE_WORKER,
                    protocol_version=PROTOCOL_VERSION,
                    hardware=node_pb2.HardwareReport(cpu_cores=2, memory_bytes=1 << 30),
                )
            )
            replay = await client.commitments.submit_commitment(kept.request())
        finally:
            await client.close()
        from rollnet.sdk.worker import Outbox

        outbox = Outbox(data_dir)
        receipts = {r.commitment.task_id: r for r in outbox.receipts()}
        assert outbox.pending() == []
        outbox.close()
        assert replay.commitment.commitment_id == receipts[kept.task_id].commitment.commitment_id
        assert replay.receipt == receipts[kept.task_id].receipt
        assert ledger.commitment_count() == 2
    finally:
        if not running.done():
            running.cancel()
        await coordinator.stop(grace=0.5)
        ledger.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_coordinator_process_sigkilled_mid_run(
    tmp_path: Path, sqlite_url: str, trainer_identity: Identity, tiny_model: Path
) -> None:
    """A real coordinator process dies (SIGKILL) while a task is generated and comes back on
    the same database: the worker carries on, every task is committed exactly once, and the
    ledger still verifies."""
    address = f"127.0.0.1:{free_port()}"
    coordinator = CoordinatorProcess(
        tmp_path / "coordinator", sqlite_url, address, trainer_identity
    )
    coordinator.start()
    ledger = Ledger(sqlite_url)
    identity = Identity.generate()
    generator = GatedGenerator(tmp_path / "worker")
    worker = Worker(worker_config(address, tmp_path / "worker"), identity, generator)
    running: asyncio.Task[None] | None = None
    try:
        await coordinator.wait_listening()
        trainer = await start_trainer(address, trainer_identity, tiny_model)
        task_ids = await request_tasks(trainer, 3)
        await trainer.close()
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(generator.generated.wait(), 90)
        generator.gate.set()
        await wait_until(lambda: worker.receipts_kept == 1, within=60, what="receipt 1")
        # The second task is generated and held: kill the coordinator, then let it go.
        await asyncio.wait_for(generator.generated.wait(), 90)
        coordinator.kill()
        generator.holding = False
        generator.gate.set()
        await wait_until(lambda: len(worker.outbox.pending()) == 1, within=30, what="outbox")
        coordinator.start()
        await coordinator.wait_listening()
        await wait_until(lambda: worker.receipts_kept == 3, within=90, what="all receipts")
        worker.request_stop()
        await asyncio.wait_for(running, 30)
        assert ledger.commitments_per_task() == {t: [identity.node_id] for t in task_ids}
        coordinator.kill()
        assert cli_main(["ledger", "verify", "--db", sqlite_url]) == 0
    finally:
        if running is not None and not running.done():
            running.cancel()
        coordinator.kill()
        ledger.close()
