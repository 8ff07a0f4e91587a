"""Helpers for validator tests: a fast-ticking coordinator, a trainer that publishes the tiny
model, jobs built without a network, subprocesses of the real CLIs, and waiting on conditions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import blake3
from sqlalchemy import create_engine, select
from swarm_testing import request_tasks as request_tasks
from swarm_testing import start_trainer as start_trainer

from rollnet.ledger.enums import EntryKind, NodeState, TaskState, ValidationJobState
from rollnet.ledger.models import Commitment, LedgerEntry, Node, Task, ValidationJob, Verdict
from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.reference.testing import swarm_coordinator_config
from rollnet.sdk import Identity
from rollnet.sdk.proofs import LeaseBinding, commitment_digest, proof_digest
from rollnet.v1 import (
    commitment_pb2,
    common_pb2,
    rollout_pb2,
    task_pb2,
    validation_pb2,
)

ROOT = Path(__file__).resolve().parents[2]


def coordinator_config_for(
    tmp_path: Path, database_url: str, trainer: Identity, validator: Identity, **changes: Any
) -> CoordinatorConfig:
    """Seconds-scale timings, the trainer and validator allow-listed."""
    return swarm_coordinator_config(
        tmp_path / "coordinator",
        database_url,
        trainers=[trainer],
        validators=[validator],
        **changes,
    )


class Ledger:
    """Read-only probes of the coordinator's database."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url)

    def close(self) -> None:
        self.engine.dispose()

    def node_state(self, node_id: str) -> NodeState | None:
        with self.engine.connect() as conn:
            return conn.execute(select(Node.state).where(Node.id == node_id)).scalar_one_or_none()

    def verdicts_by_node(self) -> dict[str, list[tuple[bool, tuple[str, ...], Any]]]:
        """Per worker node: (accepted, reasons, check figures) of each verdict."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(Commitment.node_id, Verdict.accepted, Verdict.reasons, Verdict.check_figures)
                .join(Verdict, Verdict.commitment_id == Commitment.id)
                .order_by(Verdict.decided_at)
            ).all()
        out: dict[str, list[tuple[bool, tuple[str, ...], Any]]] = {}
        for node_id, accepted, reasons, figures in rows:
            out.setdefault(node_id, []).append((accepted, tuple(reasons or ()), figures))
        return out

    def verdicts_by_validator(self) -> dict[str, list[tuple[bool, tuple[str, ...]]]]:
        """Per validator node: (accepted, reasons) of each verdict it gave."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(Verdict.validator_id, Verdict.accepted, Verdict.reasons))
            out: dict[str, list[tuple[bool, tuple[str, ...]]]] = {}
            for validator_id, accepted, reasons in rows:
                out.setdefault(validator_id, []).append((accepted, tuple(reasons or ())))
        return out

    def verdicts_per_commitment(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(Verdict.commitment_id)).scalars().all()
        counts: dict[str, int] = {}
        for commitment_id in rows:
            counts[commitment_id] = counts.get(commitment_id, 0) + 1
        return counts

    def commitment_ids(self) -> list[str]:
        with self.engine.connect() as conn:
            return list(conn.execute(select(Commitment.id)).scalars().all())

    def balance(self, node_id: str, kind: str) -> int:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(LedgerEntry.amount).where(
                    LedgerEntry.node_id == node_id, LedgerEntry.kind == EntryKind(kind)
                )
            ).scalars()
            return int(sum(rows))

    def tasks_in(self, state: TaskState) -> int:
        with self.engine.connect() as conn:
            return len(conn.execute(select(Task.id).where(Task.state == state)).all())

    def jobs_in(self, state: ValidationJobState) -> int:
        with self.engine.connect() as conn:
            rows = conn.execute(select(ValidationJob.id).where(ValidationJob.state == state))
            return len(rows.all())


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
    batch = rollout_pb2.RolloutBatch(
        task_id=task.task_id,
        lease_id=lease.lease_id,
        fencing_token=lease.fencing_token,
        node_id=lease.node_id,
        checkpoint_step=task.checkpoint_step,
        rollouts=rollouts,
    ).SerializeToString(deterministic=True)
    digest = blake3.blake3(batch).digest()
    commitment = commitment_pb2.Commitment(
        commitment_id="c-" + task.task_id,
        task_id=task.task_id,
        lease_id=lease.lease_id,
        fencing_token=lease.fencing_token,
        node_id=lease.node_id,
        rollout_batch=common_pb2.BlobRef(blake3=digest, size=len(batch)),
        checkpoint_step=task.checkpoint_step,
    )
    for index, rollout in enumerate(rollouts):
        commitment.rollouts.append(
            commitment_pb2.RolloutDigest(
                sampling_seed=rollout.sampling_seed,
                proof_blake3=proof_digest(rollout.toploc_proof),
                completion_tokens=len(rollout.completion_token_ids),
                commitment_digest=commitment_digest(
                    digest_lease or lease,
                    blob_blake3=digest,
                    rollout_index=index,
                    sampling_seed=rollout.sampling_seed,
                    prompt_ids=rollout.prompt_token_ids,
                    completion_ids=rollout.completion_token_ids,
                    proof=rollout.toploc_proof,
                ),
            )
        )
    job = validation_pb2.ValidationJob(
        job_id="j-" + task.task_id, commitment=commitment, task=task, network_id=lease.network_id
    )
    return job, batch
