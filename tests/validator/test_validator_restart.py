"""A validator SIGKILLed mid-job loses nothing: the job's lease expires, the coordinator requeues
it, the restarted validator (same key, same data dir) completes it, and the commitment gets
exactly one verdict. SIGTERM drains: the validator deregisters and exits 0."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from sqlalchemy import select
from validator_testing import (
    NETWORK,
    Ledger,
    coordinator_config_for,
    eventually,
    request_tasks,
    rollnet,
    spawn,
    start_trainer,
    stop,
)

from rollnet.ledger.enums import NodeState, ValidationJobState
from rollnet.ledger.models import ValidationJob
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.reference.worker import InferenceGenerator, make_backend
from rollnet.sdk.checkpoints import CheckpointStore
from rollnet.sdk.identity import Identity
from rollnet.sdk.worker import Backoff, Worker, WorkerConfig


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_sigkilled_validator_job_completes_on_restart(
    tmp_path: Path, sqlite_url: str, tiny_model: Path
) -> None:
    trainer, validator = Identity.generate(), Identity.generate()
    coordinator = await start_coordinator(
        coordinator_config_for(tmp_path, sqlite_url, trainer, validator)
    )
    address = coordinator.address
    ledger = Ledger(sqlite_url)
    trainer_client = await start_trainer(address, trainer, tiny_model)
    # An honest worker in this process commits one task, then stops.
    store = CheckpointStore(tmp_path / "worker" / "checkpoints", network_id=NETWORK)
    worker = Worker(
        WorkerConfig(
            target=address,
            data_dir=tmp_path / "worker",
            network_id=NETWORK,
            pull_wait=1.0,
            backoff=Backoff(initial=0.1, maximum=1.0),
        ),
        Identity.generate(),
        InferenceGenerator(lambda: make_backend("torch"), store),
    )
    running = asyncio.create_task(worker.run())
    key = tmp_path / "validator.key"
    validator.save(key)
    command = rollnet(
        "validator",
        "--coordinator",
        address,
        "--key",
        str(key),
        "--data-dir",
        str(tmp_path / "validator"),
        "--network-id",
        NETWORK,
        "--pull-wait",
        "1",
    )
    first = second = None
    try:
        await request_tasks(trainer_client, 1)
        await eventually(lambda: worker.receipts_received == 1, within=60, what="a commitment")
        worker.request_stop()
        await asyncio.wait_for(running, 30)
        [commitment_id] = ledger.commitment_ids()

        first = spawn(command, tmp_path / "validator-1.log")
        await eventually(
            lambda: ledger.jobs_in(ValidationJobState.LEASED) == 1,
            within=60,
            what="the validator leasing the job",
        )
        # Mid-job: the process has the lease and is fetching the blob and checkpoint.
        first.send_signal(signal.SIGKILL)
        assert await asyncio.to_thread(first.wait, 10) == -signal.SIGKILL
        assert ledger.verdicts_per_commitment() == {}, "the verdict landed before the kill"

        second = spawn(command, tmp_path / "validator-2.log")
        await eventually(
            lambda: ledger.verdicts_per_commitment() == {commitment_id: 1},
            within=90,
            what="the restarted validator's verdict",
        )
        with ledger.engine.connect() as conn:
            state, attempt = conn.execute(select(ValidationJob.state, ValidationJob.attempt)).one()
        assert state is ValidationJobState.DONE
        assert attempt == 2  # leased once by the killed process, once after the restart

        assert await asyncio.to_thread(stop, second) == 0
        second = None
        assert ledger.verdicts_per_commitment() == {commitment_id: 1}
        assert ledger.node_state(validator.node_id) is NodeState.DEREGISTERED
    finally:
        worker.request_stop()
        for process in (first, second):
            if process is not None:
                await asyncio.to_thread(stop, process, timeout=10)
        if not running.done():
            running.cancel()
        await trainer_client.close()
        await coordinator.stop(grace=0.5)
        ledger.close()
