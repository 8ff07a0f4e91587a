"""Helpers for trainer tests: a fast-ticking coordinator with the trainer allow-listed, an
in-process worker and validator, the ``rollnet trainer`` command as a process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from swarm_testing import NETWORK, free_port

from rollnet.reference.coordinator.config import CoordinatorConfig, load_config, with_overrides
from rollnet.reference.validator import Validator, ValidatorConfig
from rollnet.reference.worker import InferenceGenerator, make_backend
from rollnet.sdk import Identity
from rollnet.sdk.checkpoints import CheckpointStore
from rollnet.sdk.worker import Backoff, Worker, WorkerConfig


def coordinator_config(
    tmp_path: Path, database_url: str, trainer: Identity, validator: Identity, **changes: Any
) -> CoordinatorConfig:
    """Seconds-scale timings; the trainer and the validator allow-listed."""
    settings: dict[str, Any] = {
        "database_url": database_url,
        "listen": "127.0.0.1:0",
        "network_id": NETWORK,
        "trainers": frozenset({trainer.node_id}),
        "validators": frozenset({validator.node_id}),
        "heartbeat_interval": timedelta(seconds=1),
        "lease_duration": timedelta(seconds=20),
        "sweep_interval": timedelta(seconds=0.2),
        "retry_after": timedelta(seconds=0.2),
        "pull_wait_max": timedelta(seconds=2),
        "suspect_after_missed": 5.0,
        "offline_after_missed": 10.0,
    }
    settings.update(changes)
    return with_overrides(load_config(tmp_path / "coordinator"), **settings)


def worker(address: str, data_dir: Path) -> tuple[Worker, InferenceGenerator]:
    """An in-process reference worker (torch backend) and its generator (close it after)."""
    store = CheckpointStore(data_dir / "checkpoints", network_id=NETWORK)
    generator = InferenceGenerator(lambda: make_backend("torch"), store)
    node = Worker(
        WorkerConfig(
            target=address,
            data_dir=data_dir,
            network_id=NETWORK,
            pull_wait=1.0,
            backoff=Backoff(initial=0.1, maximum=1.0),
        ),
        Identity.generate(),
        generator,
    )
    return node, generator


def validator(address: str, data_dir: Path, identity: Identity) -> Validator:
    """An in-process reference validator with seconds-scale waits."""
    return Validator(
        ValidatorConfig(
            target=address,
            data_dir=data_dir,
            network_id=NETWORK,
            pull_wait=1.0,
            backoff=Backoff(initial=0.1, maximum=1.0),
        ),
        identity,
    )


def spawn_trainer(
    address: str,
    key: Path,
    model: Path,
    data_dir: Path,
    config: Path,
    log: Path,
    *,
    processes: int = 1,
) -> subprocess.Popen[bytes]:
    """``rollnet trainer`` as a process (one torch thread), output appended to ``log``; with
    ``processes > 1`` under ``torchrun`` (FSDP2 on CPU, gloo). In a session of its own, so that
    ``os.killpg`` reaches every process."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    handle = log.open("ab")
    launcher = (
        [
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(processes),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            "-m",
        ]
        if processes > 1
        else ["-m"]
    )
    args = [
        sys.executable,
        *launcher,
        "rollnet.reference.cli",
        "trainer",
        "--coordinator",
        address,
        "--network-id",
        NETWORK,
        "--key",
        str(key),
        "--model",
        str(model),
        "--data-dir",
        str(data_dir),
        "--config",
        str(config),
        "--torch-threads",
        "1",
        "--log-level",
        "INFO",
    ]
    return subprocess.Popen(args, stdout=handle, stderr=handle, env=env, start_new_session=True)


def process_tree(pid: int) -> set[int]:
    """``pid`` and every live descendant of it (from ``/proc``): torchrun's workers included,
    whatever process group or session they were started in."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current not in found:
            found.add(current)
            todo.extend(children.get(current, []))
    return found


def kill_tree(process: subprocess.Popen[bytes]) -> set[int]:
    """SIGKILL ``process``'s group and every descendant, reap it; returns the pids killed (the
    caller waits until none is alive: :func:`alive`)."""
    pids = process_tree(process.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(30)
    return pids


def alive(pids: set[int]) -> bool:
    """Whether any of ``pids`` still runs (zombies count as gone)."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return True
        except OSError:
            continue
    return False
