"""Helpers for worker tests: a coordinator that ticks fast, a trainer that publishes the tiny
model and asks for rollouts, database probes, and waiting on conditions with a deadline."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import swarm_testing
from sqlalchemy import create_engine, func, select
from swarm_testing import NETWORK as NETWORK
from swarm_testing import connect as connect
from swarm_testing import eventually as eventually
from swarm_testing import free_port as free_port

from rollnet.ledger.enums import NodeState, TaskState
from rollnet.ledger.models import Commitment, Node, Task
from rollnet.reference.coordinator.config import CoordinatorConfig, load_config, with_overrides
from rollnet.sdk import Identity
from rollnet.sdk.worker import Backoff, WorkerConfig

# Shared swarm helpers, with this directory's defaults.
start_trainer = functools.partial(swarm_testing.start_trainer, shard_size=128 * 1024)
request_tasks = functools.partial(swarm_testing.request_tasks, prompts_per_task=2, max_new_tokens=8)


def coordinator_config_for(
    tmp_path: Path, database_url: str, trainer: Identity, **changes: Any
) -> CoordinatorConfig:
    """Seconds-scale timings so leases expire and nodes go offline within a test."""
    base = load_config(tmp_path / "coordinator")
    settings: dict[str, Any] = {
        "database_url": database_url,
        "listen": "127.0.0.1:0",
        "network_id": NETWORK,
        "trainers": frozenset({trainer.node_id}),
        "heartbeat_interval": timedelta(seconds=1),
        "lease_duration": timedelta(seconds=4),
        "sweep_interval": timedelta(seconds=0.2),
        "retry_after": timedelta(seconds=0.2),
        "pull_wait_max": timedelta(seconds=2),
        "suspect_after_missed": 3.0,
        "offline_after_missed": 6.0,
    }
    settings.update(changes)
    return with_overrides(base, **settings)


def worker_config(address: str, data_dir: Path, **changes: Any) -> WorkerConfig:
    """A worker config with fast back-off, for tests."""
    settings: dict[str, Any] = {
        "target": address,
        "data_dir": data_dir,
        "network_id": NETWORK,
        "backends": ("torch",),
        "pull_wait": 1.0,
        "call_timeout": 5.0,
        "backoff": Backoff(initial=0.1, maximum=0.5),
        "drain_timeout": 20.0,
        "deregister_timeout": 3.0,
    }
    settings.update(changes)
    return WorkerConfig(**settings)


class Ledger:
    """Read-only probes of the coordinator's database."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url)

    def close(self) -> None:
        self.engine.dispose()

    def task_states(self) -> dict[str, tuple[TaskState, str | None]]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(Task.id, Task.state, Task.lease_holder)).all()
        return {r[0]: (r[1], r[2]) for r in rows}

    def commitments_per_task(self) -> dict[str, list[str]]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(Commitment.task_id, Commitment.node_id)).all()
        out: dict[str, list[str]] = {}
        for task_id, node_id in rows:
            out.setdefault(task_id, []).append(node_id)
        return out

    def commitment_count(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(Commitment)).scalar_one())

    def node_state(self, node_id: str) -> NodeState | None:
        with self.engine.connect() as conn:
            return conn.execute(select(Node.state).where(Node.id == node_id)).scalar_one_or_none()

    def leased_by(self, node_id: str) -> list[str]:
        return [
            task_id
            for task_id, (state, holder) in self.task_states().items()
            if state is TaskState.LEASED and holder == node_id
        ]


class CoordinatorProcess:
    """``python -m rollnet.reference.cli coordinator`` on a fixed address, stderr to a file."""

    def __init__(self, data_dir: Path, database_url: str, listen: str, trainer: Identity) -> None:
        self.data_dir = data_dir
        self.database_url = database_url
        self.listen = listen
        self.log = data_dir / "coordinator.log"
        self.config = data_dir / "coordinator.toml"
        data_dir.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            "\n".join(
                [
                    f'network_id = "{NETWORK}"',
                    f'trainers = ["{trainer.node_id}"]',
                    "heartbeat_interval = 1",
                    "lease_duration = 30",
                    "suspect_after_missed = 30",
                    "offline_after_missed = 60",
                    "sweep_interval = 0.2",
                    "retry_after = 0.2",
                    "pull_wait_max = 2",
                ]
            )
            + "\n"
        )
        self.process: subprocess.Popen[bytes] | None = None
        self._start_offset = 0

    def start(self) -> None:
        self._start_offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rollnet.reference.cli",
                    "coordinator",
                    "--data-dir",
                    str(self.data_dir),
                    "--db",
                    self.database_url,
                    "--listen",
                    self.listen,
                    "--config",
                    str(self.config),
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    async def wait_listening(self) -> None:
        def listening() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"coordinator exited early:\n{self.log.read_text()}")
            with self.log.open("rb") as output:
                output.seek(self._start_offset)
                return b"listening on" in output.read()

        await eventually(listening, within=90, what="the coordinator to listen")

    def kill(self) -> None:
        """SIGKILL: no drain, no cleanup."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
