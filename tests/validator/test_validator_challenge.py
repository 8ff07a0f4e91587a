"""``validate_job`` under a post-commitment challenge: only the challenged rollouts are
prefilled and checked in full, every rollout's binding, assigned data and reward still are, a
challenge not signed by the coordinator gives no verdict, and a worker that cheats on one
rollout of N is caught at the rate the challenge gives (k / N)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from validator_testing import seal_job

from rollnet.reference.adversary import Cheat, CheatingGenerator
from rollnet.reference.inference.tokenization import CheckpointTokenizer
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.validator import (
    ChallengeInvalid,
    CheckpointModel,
    EnvironmentCache,
    validate_job,
)
from rollnet.sdk import Identity
from rollnet.sdk.checkpoints import CheckpointStore
from rollnet.sdk.client import RollnetClient
from rollnet.sdk.proofs import (
    FLOAT32,
    LeaseBinding,
    challenged_rollouts,
    detection_probability,
    sign_challenge,
)
from rollnet.sdk.testing import NETWORK_ID
from rollnet.sdk.worker import LeaseContext
from rollnet.v1 import common_pb2, rollout_pb2, task_pb2, validation_pb2

COORDINATOR = Identity.from_seed(bytes(range(32, 64)))
PROMPTS = (3, 17)
SAMPLES = 2
ROLLOUTS = len(PROMPTS) * SAMPLES
FULL_CHECKS = {"termination", "toploc", "sampling", "behaviour_logprobs"}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CheckpointModel]:
    from rollnet.reference.model.tiny import init_tiny_model

    root = tmp_path_factory.mktemp("challenge")
    model_dir = init_tiny_model(root / "checkpoints" / "step-1", seed=0)
    backend = TorchBackend()
    backend.load(str(model_dir))
    tokenizer = CheckpointTokenizer.load(model_dir)
    return root, CheckpointModel(step=1, backend=backend, tokenizer=tokenizer, thresholds=FLOAT32)


@pytest.fixture(scope="module")
def environments() -> Iterator[EnvironmentCache]:
    cache = EnvironmentCache()
    yield cache
    cache.close()


async def honest_job(root: Path) -> tuple[validation_pb2.ValidationJob, bytes]:
    task = task_pb2.Task(
        task_id="task-1",
        environment="arithmetic",
        prompt_ids=list(PROMPTS),
        samples_per_prompt=SAMPLES,
        sampling=common_pb2.SamplingParams(temperature=1.0, max_new_tokens=24),
        checkpoint_step=1,
    )
    lease = task_pb2.Lease(lease_id="lease-1", fencing_token=1)
    store = CheckpointStore(root / "checkpoints", network_id=NETWORK_ID)
    generator = CheatingGenerator(Cheat.PROOF_REUSED, store)  # generates honestly
    context = LeaseContext(
        task=task,
        lease=lease,
        network_id=NETWORK_ID,
        node_id="node-1",
        client=cast(RollnetClient, None),
        deadline=time.monotonic() + 600,
    )
    try:
        rollouts = list(await generator.generate(task, context))
    finally:
        generator.close()
    return seal_job(task, context.binding, rollouts)


def challenged(
    job: validation_pb2.ValidationJob, commitment_id: str, count: int
) -> validation_pb2.ValidationJob:
    """``job`` as the coordinator hands it out: recorded as ``commitment_id``, challenged."""
    out = validation_pb2.ValidationJob()
    out.CopyFrom(job)
    out.commitment.commitment_id = commitment_id
    out.challenged_rollouts = count
    out.challenge = sign_challenge(
        COORDINATOR.sign,
        job.network_id,
        commitment_id,
        job.commitment.binding_digest,
        ROLLOUTS,
        count,
    )
    return out


def altered(
    blob: bytes, job: validation_pb2.ValidationJob, index: int, vocab: int
) -> tuple[Any, bytes]:
    """The batch with rollout ``index``'s last completion token edited and the commitment
    re-sealed over it (the worker commits to the edit, as the token_altered cheat does)."""
    batch = rollout_pb2.RolloutBatch.FromString(blob)
    rollouts = list(batch.rollouts)
    tokens = list(rollouts[index].completion_token_ids)
    position = len(tokens) - 2 if len(tokens) > 1 else 0
    tokens[position] = (tokens[position] + 1) % vocab
    rollouts[index].ClearField("completion_token_ids")
    rollouts[index].completion_token_ids.extend(tokens)
    lease = LeaseBinding(
        NETWORK_ID, batch.node_id, batch.task_id, batch.lease_id, batch.fencing_token
    )
    return seal_job(job.task, lease, rollouts)


@pytest.mark.slow
async def test_only_the_challenged_rollouts_are_prefilled(
    model: tuple[Path, CheckpointModel], environments: EnvironmentCache
) -> None:
    root, checkpoint = model
    job, blob = await honest_job(root)
    job = challenged(job, "c-subset", 2)
    drawn = challenged_rollouts(job.challenge, ROLLOUTS, 2)
    outcome = validate_job(job, blob, checkpoint, environments, COORDINATOR.public_key)
    assert outcome.accepted, [c for c in outcome.checks if not c.passed]
    assert outcome.challenged == drawn
    assert len(drawn) == 2
    batch = rollout_pb2.RolloutBatch.FromString(blob)
    for index in range(ROLLOUTS):
        names = {c.check for c in outcome.checks if c.rollout_index == index}
        # Binding, assigned data and the reward for every rollout; the model's checks only
        # for the challenged.
        assert {"binding", "assigned_data", "reward"} <= names
        assert (names >= FULL_CHECKS) == (index in drawn), (index, names)
        tokens = len(batch.rollouts[index].completion_token_ids)
        assert len(outcome.validated_logprobs[index]) == (tokens if index in drawn else 0)
    # The challenge vouches for the batch: every rollout's tokens are credited.
    assert outcome.decode_tokens == sum(len(r.completion_token_ids) for r in batch.rollouts)
    batch_check = next(c for c in outcome.checks if c.check == "batch")
    assert batch_check.figures["challenged_rollouts"] == 2
    # The verdict carries an empty entry for each rollout not drawn (the coordinator takes
    # it: tests/coordinator/test_coordinator_validated_logprobs.py).
    request = outcome.to_request("j", "l", 1, "r")
    assert [len(e.logprobs) > 0 for e in request.validated_logprobs] == [
        i in drawn for i in range(ROLLOUTS)
    ]


@pytest.mark.slow
async def test_a_challenge_the_coordinator_did_not_sign_gives_no_verdict(
    model: tuple[Path, CheckpointModel], environments: EnvironmentCache
) -> None:
    root, checkpoint = model
    job, blob = await honest_job(root)
    job = challenged(job, "c-forged", 2)
    with pytest.raises(ChallengeInvalid, match="no coordinator key"):
        validate_job(job, blob, checkpoint, environments)
    other = Identity.from_seed(bytes(32))
    with pytest.raises(ChallengeInvalid, match="not the coordinator's signature"):
        validate_job(job, blob, checkpoint, environments, other.public_key)
    # Re-used for another commitment: its signature no longer matches.
    moved = validation_pb2.ValidationJob()
    moved.CopyFrom(job)
    moved.commitment.commitment_id = "c-other"
    with pytest.raises(ChallengeInvalid):
        validate_job(moved, blob, checkpoint, environments, COORDINATOR.public_key)


@pytest.mark.slow
async def test_one_bad_rollout_of_n_is_caught_at_the_challenge_rate(
    model: tuple[Path, CheckpointModel], environments: EnvironmentCache
) -> None:
    """A worker edits one token of rollout 1 of 4 and commits to it; 1 of 4 rollouts is
    challenged. Over 160 commitments (a fixed range of ids: no randomness at test time) the
    job is rejected exactly when the challenge draws rollout 1, and that happens at the
    computed rate, 1/4, within 4 standard deviations."""
    root, checkpoint = model
    honest, blob = await honest_job(root)
    bad_index = 1
    job, bad_blob = altered(blob, honest, bad_index, checkpoint.backend.vocab_size)
    # Checked in full, the edit is caught.
    assert not validate_job(job, bad_blob, checkpoint, environments).accepted
    trials, count = 160, 1
    caught = drawn = 0
    for trial in range(trials):
        challenged_job = challenged(job, f"c-{trial}", count)
        outcome = validate_job(
            challenged_job, bad_blob, checkpoint, environments, COORDINATOR.public_key
        )
        hit = bad_index in outcome.challenged
        drawn += hit
        caught += not outcome.accepted
        assert outcome.accepted != hit, (trial, outcome.reject_reason)
        if hit:
            assert "sampling" in outcome.failed_checks
    rate = detection_probability(ROLLOUTS, 1, count)
    spread = (trials * rate * (1 - rate)) ** 0.5
    assert caught == drawn
    assert abs(caught - trials * rate) <= 4 * spread, (caught, trials * rate)
