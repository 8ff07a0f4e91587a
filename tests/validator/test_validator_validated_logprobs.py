"""End to end on the tiny model: a worker shades its behaviour log-probabilities by half the
error model's floor (within every token's tolerance; issue 19, item 4: every check passes), a
real validator accepts the job, and the trainer's stream carries the validator's own
log-probabilities — equal to its prefill's, not the worker's."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from validator_testing import coordinator_config_for, request_tasks, start_trainer

from rollnet.reference.coordinator.server import start_coordinator
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.testing import in_process_validator
from rollnet.reference.worker import InferenceGenerator, make_backend
from rollnet.sdk import Backoff, Identity, Worker, WorkerConfig
from rollnet.sdk.checkpoints import CheckpointStore
from rollnet.sdk.proofs import FLOAT32, token_logprobs
from rollnet.sdk.testing import NETWORK_ID, wait_until
from rollnet.sdk.worker import LeaseContext
from rollnet.v1 import rollout_pb2, task_pb2

SHADE = 0.5 * FLOAT32.logit_error_floor


class ShadingGenerator(InferenceGenerator):
    """Honest generation, then every behaviour log-probability lowered by :data:`SHADE`: within
    the validator's tolerance, so the work is accepted, and biased on every token."""

    async def generate(
        self, task: task_pb2.Task, lease: LeaseContext
    ) -> Sequence[rollout_pb2.Rollout]:
        rollouts = await super().generate(task, lease)
        for rollout in rollouts:
            shaded = [value - SHADE for value in rollout.behaviour_logprobs]
            del rollout.behaviour_logprobs[:]
            rollout.behaviour_logprobs.extend(shaded)
        return rollouts


@pytest.mark.timeout(240)
async def test_the_trainer_gets_the_validators_log_probabilities(
    tmp_path: Path, db_url: str, tiny_model: Path
) -> None:
    trainer, validator_key = Identity.generate(), Identity.generate()
    coordinator = await start_coordinator(
        coordinator_config_for(tmp_path, db_url, trainer, validator_key)
    )
    address = coordinator.address
    trainer_client = await start_trainer(address, trainer, tiny_model)
    store = CheckpointStore(tmp_path / "worker" / "checkpoints", network_id=NETWORK_ID)
    generator = ShadingGenerator(lambda: make_backend("torch"), store)
    worker = Worker(
        WorkerConfig(
            target=address,
            data_dir=tmp_path / "worker",
            network_id=NETWORK_ID,
            pull_wait=1.0,
            backoff=Backoff(initial=0.1, maximum=1.0),
        ),
        Identity.generate(),
        generator,
    )
    validator = in_process_validator(address, tmp_path / "validator", validator_key)
    working = asyncio.create_task(worker.run())
    validating = asyncio.create_task(validator.run())
    try:
        await request_tasks(trainer_client, 1, samples=2, max_new_tokens=24)
        await wait_until(lambda: validator.verdicts_submitted == 1, within=150, what="a verdict")
        outcome = validator.last_outcome
        assert outcome is not None
        assert outcome.accepted, outcome.reject_reason  # the shading passes every check
        stream = trainer_client.rollouts.stream(0)
        rollouts = [await asyncio.wait_for(anext(stream), timeout=30) for _ in range(2)]
        backend = TorchBackend()
        backend.load(str(tiny_model))
        for index, accepted in enumerate(rollouts):
            rollout = accepted.rollout
            validated = np.asarray(accepted.validated_logprobs, dtype=np.float32)
            assert validated.size == len(rollout.completion_token_ids) > 0
            # Exactly what the validator computed in its prefill, as float32.
            sent = outcome.validated_logprobs[index].astype(np.float32)
            assert np.array_equal(validated, sent)
            # And what anyone gets from a prefill of the checkpoint (batched differently, so
            # equal up to float32 rounding).
            (prefill,) = backend.prefill_batch(
                [(list(rollout.prompt_token_ids), list(rollout.completion_token_ids))]
            )
            recomputed = token_logprobs(prefill.logits, rollout.completion_token_ids, 1.0)
            np.testing.assert_allclose(validated, recomputed, rtol=0, atol=1e-5)
            # Not the worker's shaded numbers, which the trainer must not use.
            behaviour = np.asarray(rollout.behaviour_logprobs, dtype=np.float64)
            np.testing.assert_allclose(validated - behaviour, SHADE, rtol=0, atol=1e-4)
    finally:
        worker.request_stop()
        validator.request_stop()
        await asyncio.wait_for(asyncio.gather(working, validating), 60)
        generator.close()
        await trainer_client.close()
        await coordinator.stop(grace=0.5)
