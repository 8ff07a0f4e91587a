"""A swarm with some history for the dashboard's tests and screenshot: nodes of every role,
accepted and rejected work, a published checkpoint and heartbeats reporting it."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from coordinator_testing import (
    judge_next_job,
    publish_checkpoint,
    pull_and_commit,
    register,
    request_tasks,
)

from rollnet.sdk import Identity, RollnetClient
from rollnet.sdk.testing import connect
from rollnet.v1 import common_pb2, node_service_pb2

CHROMIUM = Path(os.environ.get("ROLLNET_CHROMIUM", "/usr/bin/chromium"))
#: What playwright passes to Debian's chromium (its own browser download is not used).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def need_chromium() -> Path:
    """The browser, or a skip outside CI (in CI, ``make dev`` installed it: a failure)."""
    if CHROMIUM.is_file() and shutil.which(str(CHROMIUM)):
        return CHROMIUM
    if os.environ.get("CI"):
        pytest.fail(f"{CHROMIUM} is missing: 'make dev' installs Debian's chromium")
    pytest.skip(f"{CHROMIUM} is missing (make browser installs it)")


@dataclass
class Swarm:
    """Clients of the nodes that made the history (closed by :meth:`close`)."""

    worker: Identity
    worker_client: RollnetClient
    validator_client: RollnetClient
    trainer_client: RollnetClient

    async def close(self) -> None:
        for client in (self.worker_client, self.validator_client, self.trainer_client):
            await client.close()

    async def accept_one_more(self) -> None:
        """One more task, committed by the worker and accepted."""
        await request_tasks(self.trainer_client, 1, samples_per_prompt=2, step=2)
        await pull_and_commit(self.worker_client, self.worker)
        await judge_next_job(self.validator_client, accept=True)


async def make_history(address: str, trainer: Identity, validator: Identity) -> Swarm:
    """Register a worker, the validator and the trainer; publish checkpoint 1; commit three
    tasks and the rejected one's copy (three accepted, one rejected EXPONENT_MISMATCH);
    heartbeat: the worker at step 1, the validator at step 0."""
    worker = Identity.generate()
    worker_client = connect(address, worker)
    validator_client = connect(address, validator)
    trainer_client = connect(address, trainer)
    await register(worker_client, worker, common_pb2.ROLE_WORKER)
    await register(validator_client, validator, common_pb2.ROLE_VALIDATOR)
    await register(trainer_client, trainer, common_pb2.ROLE_TRAINER)
    await publish_checkpoint(trainer_client, trainer, step=1)
    await request_tasks(trainer_client, 3, samples_per_prompt=2, step=1)
    for verdict in (True, False, True, True):
        await pull_and_commit(worker_client, worker)
        await judge_next_job(validator_client, accept=verdict)
    await worker_client.nodes.heartbeat(node_service_pb2.HeartbeatRequest(checkpoint_step=1))
    await validator_client.nodes.heartbeat(node_service_pb2.HeartbeatRequest(checkpoint_step=0))
    return Swarm(worker, worker_client, validator_client, trainer_client)
