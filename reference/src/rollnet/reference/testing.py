"""Helpers for tests that run the reference servers in-process: coordinator configurations for
a test network and seconds-scale timings, and an in-process worker and validator.

The SDK-only helpers (a non-retrying signed client, waiting on a condition, the test network id)
are in :mod:`rollnet.sdk.testing`; this module adds what needs the reference servers.

    config = swarm_coordinator_config(tmp_path, "sqlite+pysqlite:///rollnet.db", trainers=[key])
    coordinator = await start_coordinator(config)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from rollnet.reference.coordinator.config import CoordinatorConfig, load_config, with_overrides
from rollnet.reference.inference.base import DType
from rollnet.reference.validator import Validator, ValidatorConfig
from rollnet.reference.worker import InferenceGenerator, make_backend
from rollnet.sdk.checkpoints import CheckpointStore
from rollnet.sdk.identity import Identity
from rollnet.sdk.proofs.binding import LeaseBinding
from rollnet.sdk.testing import NETWORK_ID
from rollnet.sdk.worker import Backoff, Worker, WorkerConfig
from rollnet.v1 import commitment_pb2, common_pb2, task_pb2, validation_pb2

__all__ = [
    "SWARM_TIMINGS",
    "coordinator_config",
    "in_process_validator",
    "in_process_worker",
    "swarm_coordinator_config",
    "validation_job",
]

#: Coordinator timings on the scale of seconds, so that leases expire, nodes go suspect and
#: offline, and long polls return within one test.
SWARM_TIMINGS: Mapping[str, Any] = {
    "heartbeat_interval": timedelta(seconds=1),
    "lease_duration": timedelta(seconds=4),
    "sweep_interval": timedelta(seconds=0.2),
    "retry_after": timedelta(seconds=0.2),
    "pull_wait_max": timedelta(seconds=2),
    "suspect_after_missed": 5.0,
    "offline_after_missed": 10.0,
}


def coordinator_config(
    data_dir: Path,
    database_url: str,
    *,
    trainers: Iterable[Identity | str] = (),
    validators: Iterable[Identity | str] = (),
    operators: Iterable[Identity | str] = (),
    **changes: Any,
) -> CoordinatorConfig:
    """The default configuration on ``data_dir``, listening on 127.0.0.1 port 0, on
    :data:`~rollnet.sdk.testing.NETWORK_ID`, with the given identities (or node ids)
    allow-listed in their roles; ``changes`` override any other field."""
    settings: dict[str, Any] = {
        "database_url": database_url,
        "listen": "127.0.0.1:0",
        "network_id": NETWORK_ID,
        "trainers": _node_ids(trainers),
        "validators": _node_ids(validators),
        "operators": _node_ids(operators),
        **changes,
    }
    return with_overrides(load_config(data_dir), **settings)


def swarm_coordinator_config(
    data_dir: Path, database_url: str, **changes: Any
) -> CoordinatorConfig:
    """:func:`coordinator_config` (the same ``trainers``, ``validators``, ``operators``) with
    :data:`SWARM_TIMINGS`; ``changes`` override those too."""
    return coordinator_config(data_dir, database_url, **{**SWARM_TIMINGS, **changes})


def _node_ids(members: Iterable[Identity | str]) -> frozenset[str]:
    return frozenset(m if isinstance(m, str) else m.node_id for m in members)


def in_process_worker(
    address: str, data_dir: Path, dtype: DType = "float32"
) -> tuple[Worker, InferenceGenerator]:
    """A reference worker (torch backend, computing in ``dtype``) for the coordinator at
    ``address`` with short waits, and its generator (close it after the worker stops)."""
    store = CheckpointStore(data_dir / "checkpoints", network_id=NETWORK_ID)
    generator = InferenceGenerator(lambda: make_backend("torch"), store, dtype=dtype)
    worker = Worker(
        WorkerConfig(
            target=address,
            data_dir=data_dir,
            network_id=NETWORK_ID,
            dtypes=(dtype,),
            pull_wait=1.0,
            backoff=Backoff(initial=0.1, maximum=1.0),
        ),
        Identity.generate(),
        generator,
    )
    return worker, generator


def in_process_validator(address: str, data_dir: Path, identity: Identity) -> Validator:
    """A reference validator signing as ``identity`` for the coordinator at ``address``, with
    short waits."""
    return Validator(
        ValidatorConfig(
            target=address,
            data_dir=data_dir,
            network_id=NETWORK_ID,
            pull_wait=1.0,
            backoff=Backoff(initial=0.1, maximum=1.0),
        ),
        identity,
    )


def validation_job(
    task: task_pb2.Task,
    binding: LeaseBinding,
    blob: common_pb2.BlobRef,
    digests: Sequence[commitment_pb2.RolloutDigest],
) -> validation_pb2.ValidationJob:
    """The job a coordinator would hand a validator for the batch ``blob`` of ``task``,
    committed under ``binding`` with the per-rollout ``digests`` (ids ``c-<task>``,
    ``j-<task>``)."""
    commitment = commitment_pb2.Commitment(
        commitment_id="c-" + task.task_id,
        task_id=task.task_id,
        lease_id=binding.lease_id,
        fencing_token=binding.fencing_token,
        node_id=binding.node_id,
        rollout_batch=blob,
        checkpoint_step=task.checkpoint_step,
        rollouts=digests,
    )
    return validation_pb2.ValidationJob(
        job_id="j-" + task.task_id, commitment=commitment, task=task, network_id=binding.network_id
    )
