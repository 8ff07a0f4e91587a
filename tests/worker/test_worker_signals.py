"""``rollnet worker`` as a real process: SIGKILL mid-lease (the task is requeued after the
deadline and finished by another worker) and SIGTERM (a clean drain: exit 0, deregistered)."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import BinaryIO

import pytest
from swarm_testing import Ledger
from worker_testing import request_tasks, start_trainer, worker_config

from rollnet.ledger.enums import NodeState, TaskState
from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.reference.worker import InferenceGenerator, make_backend
from rollnet.sdk.checkpoints import CheckpointStore
from rollnet.sdk.identity import Identity
from rollnet.sdk.testing import NETWORK_ID, wait_until
from rollnet.sdk.worker import Worker


def prepare(directory: Path) -> tuple[Identity, BinaryIO]:
    """A fresh key file in ``directory`` and an open log file for the process."""
    directory.mkdir(parents=True)
    identity = Identity.generate()
    identity.save(directory / "worker.key")
    return identity, open(directory / "worker.log", "wb")


# These start `rollnet worker` processes.
pytestmark = pytest.mark.slow


async def spawn_worker(address: str, directory: Path) -> tuple[asyncio.subprocess.Process, str]:
    """Start ``rollnet worker`` with a fresh key; returns the process and its node id."""
    identity, log = prepare(directory)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rollnet.reference.cli",
        "worker",
        "--coordinator",
        address,
        "--key",
        str(directory / "worker.key"),
        "--data-dir",
        str(directory / "data"),
        "--network-id",
        NETWORK_ID,
        "--pull-wait",
        "1",
        "--drain-timeout",
        "20",
        stdout=log,
        stderr=log,
    )
    log.close()
    return process, identity.node_id


def log_of(directory: Path) -> str:
    return (directory / "worker.log").read_text(errors="replace")[-4000:]


@pytest.mark.timeout(180)
async def test_sigkilled_worker_lease_is_requeued_and_finished_by_another(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    tiny_model: Path,
    tmp_path: Path,
    sqlite_url: str,
) -> None:
    coordinator = await start_coordinator(coordinator_config)
    ledger = Ledger(sqlite_url)
    trainer = await start_trainer(coordinator.address, trainer_identity, tiny_model)
    victim_dir = tmp_path / "victim"
    process, victim = await spawn_worker(coordinator.address, victim_dir)
    survivor: Worker | None = None
    running: asyncio.Task[None] | None = None
    try:
        # Big enough tasks that the victim spends most of its time inside a lease.
        task_ids = await request_tasks(trainer, 3, prompts_per_task=4, samples=4, max_new_tokens=48)
        stolen: list[str] = []
        for _ in range(20):
            await wait_until(
                lambda: bool(ledger.leased_by(victim)) or process.returncode is not None,
                within=90,
                what=f"the victim to lease a task\n{log_of(victim_dir)}",
            )
            # Freeze it first, so that it cannot finish between our look and the kill.
            process.send_signal(signal.SIGSTOP)
            stolen = ledger.leased_by(victim)
            if stolen:
                break
            process.send_signal(signal.SIGCONT)
        assert stolen, "the victim never held a lease long enough to be caught"
        process.kill()
        await process.wait()

        store = CheckpointStore(tmp_path / "survivor" / "checkpoints", network_id=NETWORK_ID)
        survivor = Worker(
            worker_config(coordinator.address, tmp_path / "survivor"),
            Identity.generate(),
            InferenceGenerator(lambda: make_backend("torch"), store),
        )
        running = asyncio.create_task(survivor.run())
        node = survivor.node_id

        def all_submitted() -> bool:
            states = ledger.task_states()
            return all(states[t][0] is not TaskState.QUEUED for t in task_ids) and not any(
                states[t][0] is TaskState.LEASED for t in task_ids
            )

        await wait_until(all_submitted, within=90, what="every task to be committed")
        committed = ledger.commitments_per_task()
        # The stolen task was finished by the survivor, once, after the victim's lease expired.
        assert committed[stolen[0]] == [node]
        assert sorted(committed) == sorted(task_ids)
        assert all(len(nodes) == 1 for nodes in committed.values())
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        if survivor is not None and running is not None:
            survivor.request_stop()
            await asyncio.wait_for(running, 30)
        await trainer.close()
        await coordinator.stop(grace=0.5)
        ledger.close()


@pytest.mark.timeout(180)
async def test_sigterm_drains_cleanly(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    tiny_model: Path,
    tmp_path: Path,
    sqlite_url: str,
) -> None:
    coordinator = await start_coordinator(coordinator_config)
    ledger = Ledger(sqlite_url)
    trainer = await start_trainer(coordinator.address, trainer_identity, tiny_model)
    directory = tmp_path / "worker"
    process, node = await spawn_worker(coordinator.address, directory)
    try:
        task_ids = await request_tasks(trainer, 3)
        await wait_until(
            lambda: bool(ledger.leased_by(node)) or process.returncode is not None,
            within=90,
            what=f"the worker to lease a task\n{log_of(directory)}",
        )
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 40)
        assert code == 0, log_of(directory)
        assert ledger.node_state(node) is NodeState.DEREGISTERED
        assert ledger.leased_by(node) == []
        states = ledger.task_states()
        committed = ledger.commitments_per_task()
        # Every task is either committed by the worker (the one in progress at SIGTERM, finished
        # during the drain) or back in the queue (never pulled, or given back after the drain
        # timeout on a slow machine); none is stuck on the departed node.
        for task_id in task_ids:
            state, _ = states[task_id]
            assert state is TaskState.QUEUED or committed.get(task_id) == [node], (state, task_id)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await trainer.close()
        await coordinator.stop(grace=0.5)
        ledger.close()
