"""Per-node statistics end to end on a bf16 network: an honest worker and a worker that steers
towards digits (its every token within tolerance of the seeded winner, so every check passes)
run against a real coordinator and validator. The validator sends each rollout's statistics with
its ACCEPT; the coordinator adds them up per worker, keeps the honest worker unflagged and ejects
the steering worker within the budget docs/verification.md states ("Per-node statistics"),
its accepted work credited once and never slashed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import select
from swarm_testing import Ledger
from validator_testing import coordinator_config_for, request_tasks, start_trainer

from rollnet.ledger.enums import NodeState, TaskState
from rollnet.ledger.models import Node, NodeStatistics
from rollnet.reference.adversary import Cheat, build_cheating_worker
from rollnet.reference.adversary.cheats import _LOAD_LOCK
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.reference.inference.base import DType
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.testing import in_process_validator
from rollnet.reference.worker import InferenceGenerator
from rollnet.sdk.checkpoints import CheckpointStore
from rollnet.sdk.identity import Identity
from rollnet.sdk.proofs.statistics import BFLOAT16_POLICY
from rollnet.sdk.testing import NETWORK_ID, wait_until
from rollnet.sdk.worker import Backoff, Worker, WorkerConfig, WorkerFatalError

STEERING_BUDGET = 20_000
"""Tokens within which a digit-steering worker is flagged on the tiny model in bf16 (the
detection table in docs/verification.md: median ~4k, every simulated node by 10k)."""


class SerializedLoadBackend(TorchBackend):
    """The honest reference backend, loading under the adversary's load lock: transformers'
    loading is not thread-safe (its meta-device init is process-wide), and this test runs both
    workers in one process."""

    def load(self, model_dir: str, device: str = "cpu", dtype: DType = "float32") -> None:
        with _LOAD_LOCK:
            super().load(model_dir, device=device, dtype=dtype)


def evidence(ledger: Ledger, node_id: str) -> tuple[int, int, int, str] | None:
    """(tokens, losses, wins, flagged test) of a node's statistics row."""
    with ledger.engine.connect() as conn:
        row = conn.execute(
            select(
                NodeStatistics.tokens,
                NodeStatistics.near_tie_losses,
                NodeStatistics.near_tie_wins,
                NodeStatistics.flagged_test,
            ).where(NodeStatistics.node_id == node_id)
        ).one_or_none()
    return None if row is None else (row[0], row[1], row[2], row[3])


def dispersion_of(ledger: Ledger, node_id: str) -> tuple[int, int, float]:
    """(tokens, dispersion_tokens, logprob_dispersion) of a node's statistics row, read at once
    (the worker may still be adding to it)."""
    with ledger.engine.connect() as conn:
        row = conn.execute(
            select(
                NodeStatistics.tokens,
                NodeStatistics.dispersion_tokens,
                NodeStatistics.logprob_dispersion,
            ).where(NodeStatistics.node_id == node_id)
        ).one()
    return int(row[0]), int(row[1]), float(row[2])


def state_reason(ledger: Ledger, node_id: str) -> str:
    with ledger.engine.connect() as conn:
        return str(conn.execute(select(Node.state_reason).where(Node.id == node_id)).scalar_one())


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_a_steering_worker_is_flagged_and_the_honest_one_is_not(
    tmp_path: Path, sqlite_url: str, tiny_model: Path
) -> None:
    trainer, validator_key = Identity.generate(), Identity.generate()
    config = coordinator_config_for(
        tmp_path,
        sqlite_url,
        trainer,
        validator_key,
        compute_dtype="bfloat16",
        # Every commitment validated: the statistics come with every verdict.
        trusted_streak=10**6,
    )
    coordinator = await start_coordinator(config)
    address = coordinator.address
    ledger = Ledger(sqlite_url)
    trainer_client = await start_trainer(address, trainer, tiny_model)
    store = CheckpointStore(tmp_path / "honest" / "checkpoints", network_id=NETWORK_ID)
    generator = InferenceGenerator(SerializedLoadBackend, store, dtype="bfloat16")
    honest = Worker(
        WorkerConfig(
            target=address,
            data_dir=tmp_path / "honest",
            network_id=NETWORK_ID,
            dtypes=("bfloat16",),
            pull_wait=1.0,
            backoff=Backoff(initial=0.1, maximum=1.0),
        ),
        Identity.generate(),
        generator,
    )
    steering_identity = Identity.generate()
    steering = build_cheating_worker(
        Cheat.STEER_DIGIT,
        WorkerConfig(
            target=address,
            data_dir=tmp_path / "steering",
            network_id=NETWORK_ID,
            dtypes=("bfloat16",),
            pull_wait=1.0,
            backoff=Backoff(initial=0.1, maximum=1.0),
            drain_timeout=5.0,
            deregister_timeout=3.0,
        ),
        steering_identity,
    )
    validator = in_process_validator(address, tmp_path / "validator", validator_key)
    honest_run = asyncio.create_task(honest.run())
    steering_run = asyncio.create_task(steering.run())
    validating = asyncio.create_task(validator.run())
    try:

        async def flagged() -> bool:
            if ledger.tasks_in(TaskState.QUEUED) < 2:
                await request_tasks(
                    trainer_client, 2, prompts_per_task=4, samples=4, max_new_tokens=32
                )
            for task in (honest_run, validating):
                assert not task.done(), task
            return ledger.node_state(steering_identity.node_id) is NodeState.EJECTED

        await wait_until(flagged, within=540, what="the steering worker flagged and ejected")
        steered = evidence(ledger, steering_identity.node_id)
        assert steered is not None
        tokens, losses, wins, test = steered
        assert test == "near_tie"
        assert BFLOAT16_POLICY.min_tokens <= tokens <= STEERING_BUDGET, steered
        assert losses > BFLOAT16_POLICY.honest_loss_rate * (losses + wins)
        assert state_reason(ledger, steering_identity.node_id).startswith(
            "per-node statistics: near_tie test"
        )
        # Every check passed on every steered job: credited, never slashed.
        verdicts = ledger.verdicts_by_node()[steering_identity.node_id]
        assert all(accepted for accepted, _, _ in verdicts), verdicts
        assert ledger.balance(steering_identity.node_id, "credit") > 0
        assert ledger.balance(steering_identity.node_id, "slash") == 0
        with pytest.raises(WorkerFatalError, match="NODE_EJECTED"):
            await asyncio.wait_for(steering_run, 60)

        # The honest worker: statistics accumulated, no near-tie loss, not flagged.
        await wait_until(
            lambda: (evidence(ledger, honest.node_id) or (0,))[0] > 0,
            within=120,
            what="statistics of the honest worker",
        )
        honest_evidence = evidence(ledger, honest.node_id)
        assert honest_evidence is not None
        assert honest_evidence[3] == "", honest_evidence
        assert ledger.node_state(honest.node_id) is not NodeState.EJECTED
        assert ledger.balance(honest.node_id, "slash") == 0
        # Its reported log-probabilities were compared on every token, their dispersion well
        # under the honest bound (the worker and validator run the same bf16 kernels here).
        tokens, compared, dispersion = dispersion_of(ledger, honest.node_id)
        assert compared == tokens > 0
        assert dispersion / compared < BFLOAT16_POLICY.honest_dispersion
    finally:
        honest.request_stop()
        steering.request_stop()
        validator.request_stop()
        await asyncio.gather(honest_run, steering_run, validating, return_exceptions=True)
        generator.close()
        await trainer_client.close()
        await coordinator.stop(grace=0.5)
        ledger.close()
