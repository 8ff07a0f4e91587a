"""A worker never generates in a dtype its network does not prescribe: the compute dtype is in
the protocol (RegisterNodeResponse.compute_dtype, Task.compute_dtype), a worker that declares
other dtypes is refused at registration, and a task in a dtype the worker does not run is given
back before the generator sees it (FAIL_REASON_COMPUTE_DTYPE_UNSUPPORTED)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest
from swarm_testing import Ledger
from worker_testing import (
    coordinator_config_for,
    generator_without_backend,
    offline_lease,
    request_tasks,
    start_trainer,
    worker_config,
)

from rollnet.ledger.enums import TaskState
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.sdk.identity import Identity
from rollnet.sdk.testing import wait_until
from rollnet.sdk.worker import LeaseContext, LeaseLost, RolloutGenerator, Worker, WorkerFatalError
from rollnet.v1 import common_pb2, rollout_pb2, task_pb2, task_service_pb2


class RecordingGenerator(RolloutGenerator):
    """Fails the test if it is ever asked to generate."""

    def __init__(self) -> None:
        self.tasks: list[task_pb2.Task] = []

    async def generate(
        self, task: task_pb2.Task, lease: LeaseContext
    ) -> Sequence[rollout_pb2.Rollout]:
        self.tasks.append(task)
        raise AssertionError("generated a task in a dtype the worker does not run")


async def test_a_worker_declaring_other_dtypes_is_refused_at_registration(
    tmp_path: Path, sqlite_url: str, trainer_identity: Identity
) -> None:
    config = coordinator_config_for(
        tmp_path, sqlite_url, trainer_identity, compute_dtype="bfloat16"
    )
    coordinator = await start_coordinator(config)
    try:
        generator = RecordingGenerator()
        settings = worker_config(coordinator.address, tmp_path / "w", dtypes=("float32",))
        worker = Worker(settings, Identity.generate(), generator)
        with pytest.raises(WorkerFatalError, match=r"COMPUTE_DTYPE_UNSUPPORTED.*bfloat16"):
            await asyncio.wait_for(worker.run(), 20)
        assert generator.tasks == []
    finally:
        await coordinator.stop(grace=0.5)


@pytest.mark.timeout(180)
@pytest.mark.slow
async def test_a_task_made_before_the_dtype_changed_is_given_back_unread(
    tmp_path: Path,
    sqlite_url: str,
    trainer_identity: Identity,
    tiny_model: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Tasks keep the dtype they were created in; a float32 task left queued when the operator
    switches the network to bfloat16 goes back to the queue from a bfloat16 worker each time,
    without being generated, until its attempts run out; the worker itself carries on."""
    caplog.set_level(logging.INFO, logger="rollnet.worker")
    config = coordinator_config_for(tmp_path, sqlite_url, trainer_identity)
    coordinator = await start_coordinator(config)
    trainer = await start_trainer(coordinator.address, trainer_identity, tiny_model)
    (task_id,) = await request_tasks(trainer, 1)
    await trainer.close()
    await coordinator.stop(grace=0.5)

    coordinator = await start_coordinator(
        coordinator_config_for(tmp_path, sqlite_url, trainer_identity, compute_dtype="bfloat16")
    )
    ledger = Ledger(sqlite_url)
    generator = RecordingGenerator()
    settings = worker_config(coordinator.address, tmp_path / "w", dtypes=("bfloat16",))
    worker = Worker(settings, Identity.generate(), generator)
    running = asyncio.create_task(worker.run())
    try:
        await wait_until(
            lambda: ledger.task_states()[task_id][0] is TaskState.FAILED,
            within=60,
            what="the float32 task to use up its attempts",
        )
        assert generator.tasks == []
        refusals = [r for r in caplog.records if "task_dtype_unsupported" in r.getMessage()]
        assert len(refusals) == config.max_attempts
        assert "float32" in refusals[0].getMessage()
        assert not running.done(), "the worker carries on: the network is in its dtype"
        assert worker.compute_dtype == "bfloat16"
        worker.request_stop()
        await asyncio.wait_for(running, 20)
    finally:
        if not running.done():
            running.cancel()
        await coordinator.stop(grace=0.5)
        ledger.close()


async def test_the_reference_generator_refuses_another_dtype_before_any_work(
    tmp_path: Path,
) -> None:
    generator = generator_without_backend(tmp_path)
    lease = offline_lease(common_pb2.COMPUTE_DTYPE_BFLOAT16)
    try:
        with pytest.raises(LeaseLost, match="bfloat16"):
            await generator.generate(lease.task, lease)
        assert lease.give_back_reason == task_service_pb2.FAIL_REASON_COMPUTE_DTYPE_UNSUPPORTED
    finally:
        generator.close()
