"""Helpers for validator tests: a fast-ticking coordinator, jobs built without a network and
subprocesses of the real CLIs (the trainer, its demand and database probes are
:mod:`swarm_testing`'s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import blake3
from swarm_testing import request_tasks as request_tasks
from swarm_testing import start_trainer as start_trainer

from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.reference.testing import swarm_coordinator_config, validation_job
from rollnet.sdk import Identity, batches
from rollnet.sdk.proofs import LeaseBinding
from rollnet.v1 import (
    common_pb2,
    rollout_pb2,
    task_pb2,
    validation_pb2,
)

ROOT = Path(__file__).resolve().parents[2]


def coordinator_config_for(
    tmp_path: Path, database_url: str, trainer: Identity, validator: Identity, **changes: Any
) -> CoordinatorConfig:
    """Seconds-scale timings, the trainer and validator allow-listed (``changes`` may name
    other ``trainers`` / ``validators``)."""
    allowed: dict[str, Any] = {"trainers": [trainer], "validators": [validator]}
    return swarm_coordinator_config(
        tmp_path / "coordinator", database_url, **{**allowed, **changes}
    )


# ------------------------------------------------------------------ subprocesses


def spawn(args: Sequence[str], log_file: Path) -> subprocess.Popen[bytes]:
    """Start ``python -m ...`` with the repository's interpreter, output into ``log_file``."""
    env = dict(os.environ)
    # One torch thread per process: several share the CI machine's cores.
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    handle = log_file.open("wb")
    return subprocess.Popen([sys.executable, "-m", *args], stdout=handle, stderr=handle, env=env)


def rollnet(*args: str) -> list[str]:
    """Module arguments for a ``rollnet`` CLI command."""
    return ["rollnet.reference.cli", *args]


def stop(process: subprocess.Popen[bytes], *, timeout: float = 30.0) -> int | None:
    """SIGTERM, wait; SIGKILL if it does not exit. Returns the exit code after SIGTERM."""
    if process.poll() is not None:
        return process.returncode
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None


# ------------------------------------------------------------------ jobs without a network


def seal_job(
    task: task_pb2.Task,
    lease: LeaseBinding,
    rollouts: Sequence[rollout_pb2.Rollout],
    *,
    digest_lease: LeaseBinding | None = None,
) -> tuple[validation_pb2.ValidationJob, bytes]:
    """The job a coordinator would hand out for these rollouts, and the blob bytes.

    ``digest_lease``: seal the commitment digests for another lease (a replay)."""
    batch = batches.encode_batch(lease, task.checkpoint_step, rollouts)
    blob = common_pb2.BlobRef(blake3=blake3.blake3(batch).digest(), size=len(batch))
    digests = batches.rollout_digests(digest_lease or lease, blob.blake3, rollouts)
    job = validation_job(task, lease, blob, digests)
    return job, batch
