"""A validator SIGKILLed mid-job loses nothing: the job's lease expires, the coordinator requeues
it, the restarted validator (same key, same data dir) completes it, and the commitment gets
exactly one verdict. SIGTERM drains: the validator deregisters and exits 0."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from swarm_testing import Ledger
from validator_testing import (
    coordinator_config_for,
    request_tasks,
    rollnet,
    spawn,
    start_trainer,
    stop,
)

from rollnet.ledger.enums import NodeState, ValidationJobState
from rollnet.ledger.models import ValidationJob
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.reference.testing import in_process_validator, in_process_worker
from rollnet.sdk.identity import Identity
from rollnet.sdk.testing import NETWORK_ID, wait_until


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
    worker, generator = in_process_worker(address, tmp_path / "worker")
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
        NETWORK_ID,
        "--pull-wait",
        "1",
    )
    first = second = None
    try:
        await request_tasks(trainer_client, 1)
        await wait_until(lambda: worker.receipts_kept == 1, within=60, what="a commitment")
        worker.request_stop()
        await asyncio.wait_for(running, 30)
        [commitment_id] = ledger.commitment_ids()

        first = spawn(command, tmp_path / "validator-1.log")
        await wait_until(
            lambda: ledger.jobs_in(ValidationJobState.LEASED) == 1,
            within=60,
            what="the validator leasing the job",
        )
        # Mid-job: the process has the lease and is fetching the blob and checkpoint.
        first.send_signal(signal.SIGKILL)
        assert await asyncio.to_thread(first.wait, 10) == -signal.SIGKILL
        assert ledger.verdicts_per_commitment() == {}, "the verdict landed before the kill"

        second = spawn(command, tmp_path / "validator-2.log")
        await wait_until(
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
        generator.close()
        await trainer_client.close()
        await coordinator.stop(grace=0.5)
        ledger.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_job_the_validator_cannot_check_is_abandoned_not_fatal(
    tmp_path: Path, sqlite_url: str, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fault on the validator's side (here: its reward sandbox cannot build the environment)
    # gives no verdict and does not stop the validator: the lease expires, the job is leased
    # again, and the commitment gets exactly one verdict.
    from rollnet.reference.envs import SandboxError
    from rollnet.reference.validator import node as validator_node
    from rollnet.reference.validator.pipeline import validate_job as real

    calls = 0

    def flaky(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise SandboxError("environment 'arithmetic': the reward sandbox cannot build it")
        return real(*args)

    monkeypatch.setattr(validator_node, "validate_job", flaky)
    trainer, identity = Identity.generate(), Identity.generate()
    coordinator = await start_coordinator(
        coordinator_config_for(tmp_path, sqlite_url, trainer, identity)
    )
    address = coordinator.address
    ledger = Ledger(sqlite_url)
    trainer_client = await start_trainer(address, trainer, tiny_model)
    worker, generator = in_process_worker(address, tmp_path / "worker")
    validator = in_process_validator(address, tmp_path / "validator", identity)
    working = asyncio.create_task(worker.run())
    validating = asyncio.create_task(validator.run())
    try:
        await request_tasks(trainer_client, 1)
        await wait_until(lambda: worker.receipts_kept == 1, within=60, what="a commitment")
        [commitment_id] = ledger.commitment_ids()
        await wait_until(
            lambda: ledger.verdicts_per_commitment() == {commitment_id: 1},
            within=60,
            what="the verdict after the abandoned attempt",
        )
        assert calls == 2
        assert validator.metrics.abandoned.labels("reward_sandbox")._value.get() == 1
        assert not validating.done()
        with ledger.engine.connect() as conn:
            state, attempt = conn.execute(select(ValidationJob.state, ValidationJob.attempt)).one()
        assert (state, attempt) == (ValidationJobState.DONE, 2)
    finally:
        worker.request_stop()
        validator.request_stop()
        await asyncio.wait_for(asyncio.gather(working, validating), 30)
        generator.close()
        await trainer_client.close()
        await coordinator.stop(grace=0.5)
        ledger.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_stop_does_not_wait_forever_for_a_jobs_inputs(
    tmp_path: Path, sqlite_url: str, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A coordinator that stops answering while the validator fetches a job's blob: on stop the
    # validator waits drain_timeout for it, then drops the job (its lease expires) and exits.
    from dataclasses import replace

    from rollnet.sdk.client import BlobClient

    trainer, identity = Identity.generate(), Identity.generate()
    coordinator = await start_coordinator(
        coordinator_config_for(tmp_path, sqlite_url, trainer, identity)
    )
    address = coordinator.address
    ledger = Ledger(sqlite_url)
    trainer_client = await start_trainer(address, trainer, tiny_model)
    worker, generator = in_process_worker(address, tmp_path / "worker")
    working = asyncio.create_task(worker.run())
    validator = None
    try:
        await request_tasks(trainer_client, 1)
        await wait_until(lambda: worker.receipts_kept == 1, within=60, what="a commitment")
        worker.request_stop()
        await asyncio.wait_for(working, 30)
        fetching = asyncio.Event()

        async def never(*_: Any, **__: Any) -> bytes:
            fetching.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        monkeypatch.setattr(BlobClient, "download", never)
        validator = in_process_validator(address, tmp_path / "validator", identity)
        validator.config = replace(validator.config, drain_timeout=1.0)
        running = asyncio.create_task(validator.run())
        await asyncio.wait_for(fetching.wait(), 60)
        validator.request_stop()
        await asyncio.wait_for(running, 30)  # returns: not stuck on the blob
        assert validator.metrics.abandoned.labels("gave_up")._value.get() == 1
        assert ledger.verdicts_per_commitment() == {}
    finally:
        worker.request_stop()
        if validator is not None:
            validator.request_stop()
        generator.close()
        await trainer_client.close()
        await coordinator.stop(grace=0.5)
        ledger.close()
