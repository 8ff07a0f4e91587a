"""The coordinator prescribes its network's compute dtype (``compute_dtype``, float32 by
default): RegisterNodeResponse and every Task carry it, a task keeps the dtype it was created in
(also in its validation job), and a node whose capabilities name dtypes without it is refused
FAILED_PRECONDITION / COMPUTE_DTYPE_UNSUPPORTED, naming the dtype."""

from __future__ import annotations

import grpc
import pytest
from coordinator_testing import (
    publish_checkpoint,
    pull,
    pull_and_commit,
    register,
    request_tasks,
    sqlite_only,
)

from rollnet.reference.coordinator.config import CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.sdk import Identity, RollnetError
from rollnet.sdk.testing import connect
from rollnet.v1 import common_pb2, node_pb2, validation_service_pb2


@sqlite_only
@pytest.mark.parametrize(
    ("configured", "wire"),
    [(None, common_pb2.COMPUTE_DTYPE_FLOAT32), ("bfloat16", common_pb2.COMPUTE_DTYPE_BFLOAT16)],
)
async def test_the_dtype_is_announced_and_carried_by_tasks_and_jobs(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    validator_identity: Identity,
    configured: str | None,
    wire: int,
) -> None:
    if configured is not None:
        coordinator_config = with_overrides(coordinator_config, compute_dtype=configured)
    coordinator = await start_coordinator(coordinator_config)
    worker_identity = Identity.generate()
    trainer = connect(coordinator.address, trainer_identity)
    worker = connect(coordinator.address, worker_identity)
    validator = connect(coordinator.address, validator_identity)
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        registered = await register(worker, worker_identity, common_pb2.ROLE_WORKER)
        assert registered.compute_dtype == wire
        await register(validator, validator_identity, common_pb2.ROLE_VALIDATOR)
        await publish_checkpoint(trainer, trainer_identity, step=1)
        await request_tasks(trainer, 1)
        await pull_and_commit(worker, worker_identity)
        job = await validator.validation.pull_validation_job(
            validation_service_pb2.PullValidationJobRequest()
        )
        assert job.job.task.compute_dtype == wire
        await request_tasks(trainer, 1)
        pulled = await pull(worker)
        assert pulled.task.compute_dtype == wire
    finally:
        for client in (trainer, worker, validator):
            await client.close()
        await coordinator.stop(grace=0.5)


@sqlite_only
async def test_a_node_that_does_not_run_the_networks_dtype_is_refused(
    coordinator_config: CoordinatorConfig,
) -> None:
    coordinator = await start_coordinator(
        with_overrides(coordinator_config, compute_dtype="bfloat16")
    )
    identity = Identity.generate()
    client = connect(coordinator.address, identity)
    try:
        with pytest.raises(RollnetError) as refused:
            await register(
                client,
                identity,
                common_pb2.ROLE_WORKER,
                capabilities=node_pb2.Capabilities(dtypes=["float32", "float16"]),
            )
        assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.reason == "COMPUTE_DTYPE_UNSUPPORTED"
        assert refused.value.metadata == {"compute_dtype": "bfloat16"}
        assert "bfloat16" in refused.value.message
        # Listing it (among others), or declaring nothing, is admitted.
        for dtypes in (["float32", "bfloat16"], []):
            response = await register(
                client,
                identity,
                common_pb2.ROLE_WORKER,
                capabilities=node_pb2.Capabilities(dtypes=dtypes),
            )
            assert response.compute_dtype == common_pb2.COMPUTE_DTYPE_BFLOAT16
    finally:
        await client.close()
        await coordinator.stop(grace=0.5)


@sqlite_only
async def test_queued_tasks_keep_the_dtype_they_were_created_in(
    coordinator_config: CoordinatorConfig, trainer_identity: Identity
) -> None:
    coordinator = await start_coordinator(coordinator_config)
    trainer = connect(coordinator.address, trainer_identity)
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        await publish_checkpoint(trainer, trainer_identity, step=1)
        await request_tasks(trainer, 1)
    finally:
        await trainer.close()
        await coordinator.stop(grace=0.5)
    coordinator = await start_coordinator(
        with_overrides(coordinator_config, compute_dtype="bfloat16")
    )
    identity = Identity.generate()
    worker = connect(coordinator.address, identity)
    try:
        await register(worker, identity, common_pb2.ROLE_WORKER)
        pulled = await pull(worker)
        assert pulled.task.compute_dtype == common_pb2.COMPUTE_DTYPE_FLOAT32
    finally:
        await worker.close()
        await coordinator.stop(grace=0.5)
