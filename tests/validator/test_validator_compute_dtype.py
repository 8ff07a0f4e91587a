"""The network's compute dtype end to end: the coordinator prescribes bfloat16, a bfloat16
worker generates in it, and a validator left at its defaults prefills each job in the dtype its
task prescribes, with that dtype's thresholds, and accepts the honest work. (Before the dtype
travelled in the task, a default validator prefilled in float32 and rejected such work after it
was all done.) A validator that cannot run the network's dtype is refused at registration."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from swarm_testing import Ledger
from validator_testing import coordinator_config_for, request_tasks, start_trainer

from rollnet.reference.coordinator.server import start_coordinator
from rollnet.reference.testing import in_process_validator, in_process_worker
from rollnet.reference.validator import Validator, ValidatorConfig, ValidatorFatalError
from rollnet.sdk.identity import Identity
from rollnet.sdk.testing import NETWORK_ID, wait_until
from rollnet.sdk.worker import Backoff


@pytest.mark.timeout(180)
@pytest.mark.slow
async def test_bfloat16_work_is_validated_in_bfloat16_and_accepted(
    tmp_path: Path, sqlite_url: str, tiny_model: Path
) -> None:
    trainer, identity = Identity.generate(), Identity.generate()
    coordinator = await start_coordinator(
        coordinator_config_for(tmp_path, sqlite_url, trainer, identity, compute_dtype="bfloat16")
    )
    address = coordinator.address
    ledger = Ledger(sqlite_url)
    trainer_client = await start_trainer(address, trainer, tiny_model)
    worker, generator = in_process_worker(address, tmp_path / "worker", dtype="bfloat16")
    validator = in_process_validator(address, tmp_path / "validator", identity)
    working = asyncio.create_task(worker.run())
    validating = asyncio.create_task(validator.run())
    try:
        await request_tasks(trainer_client, 2)
        await wait_until(lambda: validator.verdicts_submitted == 2, within=120, what="two verdicts")
        verdicts = ledger.verdicts_by_node()[worker.node_id]
        assert [(accepted, reasons) for accepted, reasons, _ in verdicts] == [(True, ())] * 2
        assert ledger.balance(worker.node_id, "credit") > 0
    finally:
        worker.request_stop()
        validator.request_stop()
        await asyncio.wait_for(asyncio.gather(working, validating), 30)
        generator.close()
        await trainer_client.close()
        await coordinator.stop(grace=0.5)
        ledger.close()


@pytest.mark.timeout(60)
async def test_a_validator_that_cannot_run_the_networks_dtype_is_refused(
    tmp_path: Path, sqlite_url: str
) -> None:
    identity = Identity.generate()
    coordinator = await start_coordinator(
        coordinator_config_for(
            tmp_path, sqlite_url, Identity.generate(), identity, compute_dtype="bfloat16"
        )
    )
    config = ValidatorConfig(
        target=coordinator.address,
        data_dir=tmp_path / "validator",
        network_id=NETWORK_ID,
        dtypes=("float32",),
        backoff=Backoff(initial=0.1, maximum=0.5),
    )
    try:
        with pytest.raises(ValidatorFatalError, match="COMPUTE_DTYPE_UNSUPPORTED"):
            await asyncio.wait_for(Validator(config, identity).run(), 20)
    finally:
        await coordinator.stop(grace=0.5)
