"""Helpers for trainer tests: a fast-ticking coordinator with the trainer allow-listed and
the ``rollnet trainer`` command as a process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.reference.testing import swarm_coordinator_config
from rollnet.sdk import Identity
from rollnet.sdk.testing import NETWORK_ID, free_port


def coordinator_config(
    tmp_path: Path, database_url: str, trainer: Identity, validator: Identity, **changes: Any
) -> CoordinatorConfig:
    """Seconds-scale timings, leases long enough for a training step; the trainer and the
    validator allow-listed."""
    settings: dict[str, Any] = {"lease_duration": timedelta(seconds=20), **changes}
    return swarm_coordinator_config(
        tmp_path / "coordinator",
        database_url,
        trainers=[trainer],
        validators=[validator],
        **settings,
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
    extra: Sequence[str] = (),
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
        NETWORK_ID,
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
        *extra,
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
