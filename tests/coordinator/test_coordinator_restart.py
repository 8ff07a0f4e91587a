"""SIGKILL and restart on the same database and data directory: nodes re-attach with their keys
(no re-registration), live leases are honoured until their deadline, expired ones are requeued,
and nothing that was acknowledged before the crash is lost.

The coordinator runs as a real ``rollnet coordinator`` process. One lease's deadline is moved
into the past while the process is dead — the clock-free way to say "this lease ran out during
the outage" — so the test does not wait for real time to pass.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from coordinator_testing import (
    judge_next_job,
    make_work,
    publish_checkpoint,
    pull,
    register,
    request_tasks,
    upload_and_commit,
)
from sqlalchemy import update

from rollnet.ledger import create_engine
from rollnet.ledger.engine import session_factory
from rollnet.ledger.models import Task
from rollnet.reference.cli import main as cli_main
from rollnet.sdk import ErrorReason, Identity, RollnetError
from rollnet.sdk.testing import NETWORK_ID, connect, wait_until
from rollnet.v1 import (
    commitment_pb2,
    commitment_service_pb2,
    common_pb2,
    node_pb2,
    node_service_pb2,
)

_LISTENING = re.compile(r"rollnet coordinator listening on (\S+)")


class CoordinatorProcess:
    """``python -m rollnet.reference.cli coordinator`` with its stderr in a file."""

    def __init__(self, data_dir: Path, db_url: str, config: Path, log: Path) -> None:
        self.log = log
        # Earlier runs wrote to the same file: this run's output starts here.
        self.start = log.stat().st_size if log.exists() else 0
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rollnet.reference.cli",
                "coordinator",
                "--data-dir",
                str(data_dir),
                "--db",
                db_url,
                "--listen",
                "127.0.0.1:0",
                "--config",
                str(config),
            ],
            stdout=subprocess.DEVNULL,
            stderr=log.open("ab"),
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    async def address(self) -> str:
        """Wait for the 'listening on' line of this run and return its address."""

        async def listening() -> str | None:
            if self.process.poll() is not None:
                raise AssertionError(f"coordinator exited early:\n{self.log.read_text()}")
            with self.log.open("rb") as output:
                output.seek(self.start)
                found = _LISTENING.search(output.read().decode(errors="replace"))
            return found.group(1) if found else None

        return await wait_until(listening, within=60, what="the coordinator to listen")

    def kill(self) -> None:
        """SIGKILL: no drain, no cleanup."""
        self.process.kill()
        self.process.wait(timeout=30)

    def terminate(self) -> int:
        """SIGTERM: drain and exit; returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


@pytest.fixture
def processes() -> Iterator[list[CoordinatorProcess]]:
    """Started coordinator processes, killed at the end whatever happened."""
    started: list[CoordinatorProcess] = []
    yield started
    for process in started:
        if process.process.poll() is None:
            process.kill()


def _expire_lease(db_url: str, lease_id: str) -> None:
    engine = create_engine(db_url)
    try:
        with session_factory(engine).begin() as session:
            moved = session.execute(
                update(Task)
                .where(Task.lease_id == lease_id)
                .values(lease_deadline=datetime.now(UTC) - timedelta(seconds=1))
            )
            assert moved.rowcount == 1  # type: ignore[attr-defined]
    finally:
        engine.dispose()


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_sigkill_and_restart_on_the_same_database(
    db_url: str,
    tmp_path: Path,
    trainer_identity: Identity,
    validator_identity: Identity,
    processes: list[CoordinatorProcess],
) -> None:
    config = tmp_path / "coordinator.toml"
    config.write_text(
        "\n".join(
            [
                f'network_id = "{NETWORK_ID}"',
                f'trainers = ["{trainer_identity.node_id}"]',
                f'validators = ["{validator_identity.node_id}"]',
                "heartbeat_interval = 0.5",
                "heartbeat_interval_min = 0.1",
                # Nodes stay ACTIVE across the outage: only leases are at stake here.
                "suspect_after_missed = 60",
                "offline_after_missed = 120",
                "lease_duration = 60",
                "sweep_interval = 0.1",
            ]
        )
    )
    data_dir, log = tmp_path / "data", tmp_path / "coordinator.log"
    worker, rescuer = Identity.generate(), Identity.generate()

    # ---- first life: a checkpoint, three tasks, two held leases and one commitment
    first = CoordinatorProcess(data_dir, db_url, config, log)
    processes.append(first)
    address = await first.address()
    trainer = connect(address, trainer_identity)
    client = connect(address, worker)
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        await register(client, worker, common_pb2.ROLE_WORKER)
        await client.nodes.heartbeat(node_service_pb2.HeartbeatRequest())
        await publish_checkpoint(trainer, trainer_identity, step=1)
        await request_tasks(trainer, 3)
        live, expiring, done = await pull(client), await pull(client), await pull(client)
        committed = await upload_and_commit(
            client, worker, make_work(worker, done.task, done.lease)
        )
    finally:
        await trainer.close()
        await client.close()
    first.kill()
    _expire_lease(db_url, expiring.lease.lease_id)

    # ---- second life on the same database and data directory
    second = CoordinatorProcess(data_dir, db_url, config, log)
    processes.append(second)
    address = await second.address()
    client = connect(address, worker)
    other = connect(address, rescuer)
    validator = connect(address, validator_identity)
    try:
        # The worker re-attaches with its key alone: no RegisterNode.
        beat = await client.nodes.heartbeat(
            node_service_pb2.HeartbeatRequest(
                held_lease_ids=[live.lease.lease_id, expiring.lease.lease_id], checkpoint_step=1
            )
        )
        assert beat.state == node_pb2.Node.STATE_ACTIVE
        assert [(s.lease_id, s.valid) for s in beat.leases] == [
            (live.lease.lease_id, True),
            (expiring.lease.lease_id, False),
        ]

        # The expired lease's task is requeued with attempt + 1; the live one is not handed out.
        await register(other, rescuer, common_pb2.ROLE_WORKER)
        requeued = await pull(other, wait=5)
        assert requeued.task.task_id == expiring.task.task_id
        assert requeued.lease.fencing_token == expiring.lease.fencing_token + 1
        assert not (await pull(other, wait=0)).HasField("task")

        # The live lease is honoured; the expired one is refused as stale.
        kept = await upload_and_commit(client, worker, make_work(worker, live.task, live.lease))
        assert kept.commitment.task_id == live.task.task_id
        with pytest.raises(RollnetError) as refused:
            await upload_and_commit(
                client, worker, make_work(worker, expiring.task, expiring.lease)
            )
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.reason == ErrorReason.FENCING_TOKEN_STALE

        # Nothing acknowledged before the crash is lost: the commitment, its blob, its job.
        before = await client.commitments.get_commitment(
            commitment_service_pb2.GetCommitmentRequest(
                commitment_id=committed.commitment.commitment_id
            )
        )
        assert before.commitment.state == commitment_pb2.Commitment.STATE_PENDING
        batch = await client.blobs.download(committed.commitment.rollout_batch.blake3)
        assert batch == make_work(worker, done.task, done.lease).batch
        await register(validator, validator_identity, common_pb2.ROLE_VALIDATOR)
        judged = {
            (await judge_next_job(validator, accept=True)).verdict.commitment_id for _ in range(2)
        }
        assert judged == {committed.commitment.commitment_id, kept.commitment.commitment_id}
    finally:
        for c in (client, other, validator):
            await c.close()
    assert second.terminate() == 0, "SIGTERM drains and exits cleanly"
    assert await asyncio.to_thread(cli_main, ["ledger", "verify", "--db", db_url]) == 0
