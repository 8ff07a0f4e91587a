"""Helpers for worker tests: a coordinator that ticks fast, worker configs, a generator without a
model, and the coordinator as a process (the trainer, its demand and database probes are
:mod:`swarm_testing`'s)."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import swarm_testing
from google.protobuf import json_format

from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.reference.envs.registry import load_environment
from rollnet.reference.inference.tokenization import CheckpointTokenizer
from rollnet.reference.model.tokenizer import build_char_tokenizer
from rollnet.reference.testing import swarm_coordinator_config
from rollnet.reference.worker import InferenceGenerator
from rollnet.sdk import Identity
from rollnet.sdk.checkpoints import CheckpointStore
from rollnet.sdk.prompts import encode_problem
from rollnet.sdk.testing import NETWORK_ID, wait_until
from rollnet.sdk.worker import Backoff, LeaseContext, LeaseLost, RolloutGenerator, WorkerConfig
from rollnet.v1 import common_pb2, rollout_pb2, task_pb2

# Shared swarm helpers, with this directory's defaults.
start_trainer = functools.partial(swarm_testing.start_trainer, shard_size=128 * 1024)
request_tasks = functools.partial(swarm_testing.request_tasks, prompts_per_task=2, max_new_tokens=8)


def coordinator_config_for(
    tmp_path: Path, database_url: str, trainer: Identity, **changes: Any
) -> CoordinatorConfig:
    """Seconds-scale timings; nodes go suspect and offline after fewer missed heartbeats."""
    settings: dict[str, Any] = {"suspect_after_missed": 3.0, "offline_after_missed": 6.0, **changes}
    return swarm_coordinator_config(
        tmp_path / "coordinator", database_url, trainers=[trainer], **settings
    )


def worker_config(address: str, data_dir: Path, **changes: Any) -> WorkerConfig:
    """A worker config with fast back-off, for tests."""
    settings: dict[str, Any] = {
        "target": address,
        "data_dir": data_dir,
        "network_id": NETWORK_ID,
        "backends": ("torch",),
        "pull_wait": 1.0,
        "call_timeout": 5.0,
        "backoff": Backoff(initial=0.1, maximum=0.5),
        "drain_timeout": 20.0,
        "deregister_timeout": 3.0,
    }
    settings.update(changes)
    return WorkerConfig(**settings)


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
                    f'network_id = "{NETWORK_ID}"',
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

        await wait_until(listening, within=90, what="the coordinator to listen")

    def kill(self) -> None:
        """SIGKILL: no drain, no cleanup."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


@functools.cache
def _tiny_tokenizer() -> CheckpointTokenizer:
    # The tiny model's tokenizer.json is the character tokenizer (model/tokenizer.py).
    return CheckpointTokenizer(build_char_tokenizer())


def prompt_ids_of(task: task_pb2.Task) -> list[list[int]]:
    """The task's prompts as a worker encodes them with the tiny model's tokenizer: what the
    coordinator recorded as their lengths when it made the task."""
    environment = load_environment(
        task.environment, json_format.MessageToDict(task.environment_config)
    )
    return [encode_problem(_tiny_tokenizer(), environment.prompt(int(p))) for p in task.prompt_ids]


class EchoGenerator(RolloutGenerator):
    """Rollouts without a model (the coordinator checks bindings and prompt lengths, not
    proofs). With ``hold_first``, the first lease is held until the runtime cancels it."""

    def __init__(self, *, hold_first: bool = False) -> None:
        self.hold_first = hold_first
        self.leases: list[LeaseContext] = []

    async def generate(
        self, task: task_pb2.Task, lease: LeaseContext
    ) -> Sequence[rollout_pb2.Rollout]:
        self.leases.append(lease)
        if self.hold_first and len(self.leases) == 1:
            while not lease.cancelled:  # noqa: ASYNC110 - the flag is set from another thread
                await asyncio.sleep(0.02)
            raise LeaseLost(lease.cancel_reason)
        prompts = prompt_ids_of(task)
        return [
            rollout_pb2.Rollout(
                prompt_index=index // task.samples_per_prompt,
                prompt_id=task.prompt_ids[index // task.samples_per_prompt],
                sample_index=index % task.samples_per_prompt,
                prompt_token_ids=prompts[index // task.samples_per_prompt],
                completion_token_ids=[8, 0],
                behaviour_logprobs=[-0.5, -0.1],
                sampling_seed=lease.sampling_seed(index),
                finish_reason=rollout_pb2.FINISH_REASON_EOS,
            )
            for index in range(lease.rollout_count)
        ]


def generator_without_backend(tmp_path: Path) -> InferenceGenerator:
    """The reference generator computing in float32 whose backend must never be loaded: for a
    task it refuses before any work."""

    def no_backend() -> Any:
        raise AssertionError("no backend is loaded for a task it will not do")

    store = CheckpointStore(tmp_path / "checkpoints", network_id="n")
    return InferenceGenerator(no_backend, store, dtype="float32")


def offline_lease(compute_dtype: common_pb2.ComputeDtype.ValueType) -> LeaseContext:
    """A one-prompt task asking for ``compute_dtype``, leased without a client (nothing may be
    fetched for it)."""
    task = task_pb2.Task(
        task_id="t",
        prompt_ids=[1],
        samples_per_prompt=1,
        checkpoint_step=1,
        compute_dtype=compute_dtype,
    )
    return LeaseContext(
        task=task,
        lease=task_pb2.Lease(lease_id="l", fencing_token=1),
        network_id="n",
        node_id="node",
        client=None,  # type: ignore[arg-type]  # never reached: nothing is fetched
        deadline=0.0,
    )
