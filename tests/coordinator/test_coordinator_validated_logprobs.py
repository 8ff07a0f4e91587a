"""The validator's recomputed log-probabilities on a verdict: refused unless shaped like the
batch (one entry per rollout, one value per completion token, finite, at most 0, with an ACCEPT
only), stored with the verdict, and streamed to the trainer as ``validated_logprobs`` — never for
a rollout accepted without a spot check."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from coordinator_testing import (
    Parties,
    publish_checkpoint,
    pull_and_commit,
    pull_job,
    register,
    request_tasks,
    running_parties,
    verdict_request,
)
from sqlalchemy import select, update
from sqlalchemy.engine import Engine

from rollnet.ledger.enums import ValidationJobState
from rollnet.ledger.models import Commitment, ValidationJob, Verdict
from rollnet.reference.coordinator.config import CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.sdk import ErrorReason, Identity, RollnetClient, RollnetError
from rollnet.sdk.testing import connect
from rollnet.v1 import (
    commitment_pb2,
    common_pb2,
    rollout_pb2,
    rollout_service_pb2,
    validation_pb2,
    validation_service_pb2,
)

ACCEPT = validation_pb2.Verdict.DECISION_ACCEPT
REJECT = validation_pb2.Verdict.DECISION_REJECT
# coordinator_testing.make_work: three completion tokens per rollout.
TOKENS = 3


def logprobs(*rows: list[float]) -> list[validation_pb2.ValidatedLogprobs]:
    return [validation_pb2.ValidatedLogprobs(logprobs=row) for row in rows]


def verdict_on(
    job: validation_service_pb2.PullValidationJobResponse,
    validated: list[validation_pb2.ValidatedLogprobs],
    *,
    decision: validation_pb2.Verdict.Decision.ValueType = ACCEPT,
) -> validation_service_pb2.SubmitVerdictRequest:
    """The verdict on ``job`` carrying ``validated`` (rewards and work for its rollouts)."""
    request = verdict_request(job, decision == ACCEPT, "TOKEN_NOT_SAMPLED")
    request.validated_logprobs.extend(validated)
    return request


async def refused(
    validator: RollnetClient, request: validation_service_pb2.SubmitVerdictRequest
) -> RollnetError:
    with pytest.raises(RollnetError) as caught:
        await validator.validation.submit_verdict(request)
    return caught.value


async def streamed(trainer: RollnetClient, count: int) -> list[rollout_pb2.AcceptedRollout]:
    stream = trainer.rollouts.stream(0)
    return [await asyncio.wait_for(anext(stream), timeout=10) for _ in range(count)]


def verdict_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return len(conn.execute(select(Verdict.id)).all())


def job_state(engine: Engine, job_id: str) -> ValidationJobState:
    with engine.connect() as conn:
        state: ValidationJobState = conn.execute(
            select(ValidationJob.state).where(ValidationJob.id == job_id)
        ).scalar_one()
    return state


@pytest.fixture
def config_changes() -> dict[str, Any]:
    """Coordinator settings a test changes (overridden by parametrizing it)."""
    return {}


@pytest.fixture
async def swarm(
    coordinator_config: CoordinatorConfig,
    config_changes: dict[str, Any],
    trainer_identity: Identity,
    validator_identity: Identity,
) -> AsyncIterator[Parties]:
    config = with_overrides(coordinator_config, **config_changes)
    async with running_parties(
        config, trainer_identity, validator_identity, tokenizer=True
    ) as parties:
        yield parties


async def test_accepted_verdict_carries_them_to_the_trainer(swarm: Parties) -> None:
    trainer, validator, client = swarm.trainer, swarm.validator, swarm.client
    worker, engine = swarm.worker, swarm.engine
    await request_tasks(trainer, 2, samples_per_prompt=2)
    # Job 1 with the validator's log-probabilities; values a float32 holds exactly, so the
    # stream must give back these very numbers.
    sent = [[-0.5, -0.25, -0.0], [-1.5, -2.0, -3.125]]
    await pull_and_commit(client, worker, tokenizer=True)
    job = await pull_job(validator)
    await validator.validation.submit_verdict(verdict_on(job, logprobs(*sent)))
    # Job 2 accepted without them (a validator predating the field): recorded all the same.
    await pull_and_commit(client, worker, tokenizer=True)
    job = await pull_job(validator)
    await validator.validation.submit_verdict(verdict_on(job, []))
    rollouts = await streamed(trainer, 4)
    first, second = rollouts[:2], rollouts[2:]
    assert [list(r.validated_logprobs) for r in first] == sent
    # The worker's own numbers stay in the rollout, untouched, and are not what is carried.
    assert [list(r.rollout.behaviour_logprobs) for r in first] == [
        pytest.approx([-0.1, -0.2, -0.3])
    ] * 2
    assert all(r.HasField("validated_reward") for r in rollouts)
    assert [list(r.validated_logprobs) for r in second] == [[], []]
    assert verdict_rows(engine) == 2


async def test_a_rollout_the_challenge_did_not_draw_carries_none(swarm: Parties) -> None:
    # A validator prefills only the rollouts the job's challenge draws: it sends an empty
    # entry for the others, and the trainer gets no validated values for them.
    trainer, validator, client = swarm.trainer, swarm.validator, swarm.client
    worker, engine = swarm.worker, swarm.engine
    await request_tasks(trainer, 1, samples_per_prompt=2)
    await pull_and_commit(client, worker, tokenizer=True)
    job = await pull_job(validator)
    drawn = [-0.5, -0.25, -1.0]
    await validator.validation.submit_verdict(verdict_on(job, logprobs([], drawn)))
    rollouts = await streamed(trainer, 2)
    assert [list(r.validated_logprobs) for r in rollouts] == [[], drawn]
    assert verdict_rows(engine) == 1


async def test_misshapen_log_probabilities_are_refused_and_nothing_is_recorded(
    swarm: Parties,
) -> None:
    trainer, validator, client = swarm.trainer, swarm.validator, swarm.client
    worker, engine = swarm.worker, swarm.engine
    await request_tasks(trainer, 1, samples_per_prompt=2)
    await pull_and_commit(client, worker, tokenizer=True)
    job = await pull_job(validator)
    good = [-0.5] * TOKENS
    cases: list[tuple[list[validation_pb2.ValidatedLogprobs], str, str]] = [
        (logprobs(good), "validated_logprobs", "length 1, but the batch has 2 rollouts"),
        (logprobs(good, good, good), "validated_logprobs", "length 3, but the batch has 2"),
        (
            logprobs(good, [-0.5] * 2),
            "validated_logprobs[1].logprobs",
            "length 2, but rollout 1",
        ),
        (
            logprobs([-0.5] * 4, good),
            "validated_logprobs[0].logprobs",
            "length 4, but rollout 0",
        ),
        # Each value's own bounds (the bounds table, at the edge): finite, at most 0.
        (
            logprobs(good, [-0.5, math.nan, -0.5]),
            "validated_logprobs[1].logprobs[1]",
            "nan is not finite, at most 0",
        ),
        (
            logprobs([-math.inf, -0.5, -0.5], good),
            "validated_logprobs[0].logprobs[0]",
            "-inf is not finite",
        ),
        (
            logprobs(good, [-0.5, -0.5, math.inf]),
            "validated_logprobs[1].logprobs[2]",
            "inf is not finite",
        ),
        (
            logprobs([0.25, -0.5, -0.5], good),
            "validated_logprobs[0].logprobs[0]",
            "0.25 is not finite, at most 0",
        ),
    ]
    for entries, field, why in cases:
        error = await refused(validator, verdict_on(job, entries))
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT, field
        assert error.reason == ErrorReason.INVALID_FIELDS
        violations = {v.field: v.description for v in error.field_violations}
        assert field in violations, (field, violations)
        assert why in violations[field], (why, violations[field])
    # With a REJECT they have no meaning: refused rather than silently dropped.
    error = await refused(validator, verdict_on(job, logprobs(good, good), decision=REJECT))
    assert error.reason == ErrorReason.INVALID_FIELDS
    assert "only an ACCEPT" in error.field_violations[0].description
    # Nothing was recorded by any refusal: the job is still leased, and a well-formed
    # verdict is taken.
    assert verdict_rows(engine) == 0
    assert job_state(engine, job.job.job_id) is ValidationJobState.LEASED
    await validator.validation.submit_verdict(verdict_on(job, logprobs(good, [-1.0] * TOKENS)))
    assert verdict_rows(engine) == 1
    rollouts = await streamed(trainer, 2)
    assert [list(r.validated_logprobs) for r in rollouts] == [good, [-1.0] * TOKENS]


async def test_a_commitment_stored_without_its_record_is_measured_from_its_batch(
    swarm: Parties,
) -> None:
    # Commitments stored before migration 0003 have no record to read the lengths from.
    trainer, validator, client = swarm.trainer, swarm.validator, swarm.client
    worker, engine = swarm.worker, swarm.engine
    await request_tasks(trainer, 1, samples_per_prompt=2)
    await pull_and_commit(client, worker, tokenizer=True)
    with engine.begin() as conn:
        conn.execute(update(Commitment).values(record=None))
    job = await pull_job(validator)
    error = await refused(validator, verdict_on(job, logprobs([-0.5] * TOKENS, [-0.5])))
    assert {v.field for v in error.field_violations} == {"validated_logprobs[1].logprobs"}
    await validator.validation.submit_verdict(
        verdict_on(job, logprobs([-0.5] * TOKENS, [-0.25] * TOKENS))
    )
    rollouts = await streamed(trainer, 2)
    assert [list(r.validated_logprobs) for r in rollouts] == [[-0.5] * 3, [-0.25] * 3]


@pytest.mark.parametrize(
    "config_changes", [{"trusted_streak": 1, "min_validation_rate": 0.0}], ids=["trusted"]
)
async def test_rollouts_accepted_without_a_spot_check_carry_none(swarm: Parties) -> None:
    trainer, validator, client = swarm.trainer, swarm.validator, swarm.client
    worker = swarm.worker
    await request_tasks(trainer, 12)
    validated: set[str] = set()
    unchecked: set[str] = set()
    for _ in range(12):
        commitment = (await pull_and_commit(client, worker, tokenizer=True)).commitment
        if commitment.state == commitment_pb2.Commitment.STATE_PENDING:
            job = await pull_job(validator)
            await validator.validation.submit_verdict(verdict_on(job, logprobs([-0.75] * TOKENS)))
            validated.add(commitment.commitment_id)
        else:
            unchecked.add(commitment.commitment_id)
    # trusted_streak 1: after the first accept, commitments are checked with p = 1 / streak.
    assert validated
    assert unchecked, "a trusted node's work is sampled, not all validated"
    rollouts = await streamed(trainer, 12)
    for rollout in rollouts:
        if rollout.commitment_id in validated:
            assert list(rollout.validated_logprobs) == [-0.75] * TOKENS
            assert rollout.HasField("validated_reward")
        else:
            assert rollout.commitment_id in unchecked
            assert list(rollout.validated_logprobs) == []
            assert not rollout.HasField("validated_reward")


async def test_a_retried_verdict_gets_the_stored_answer(swarm: Parties) -> None:
    trainer, validator, client = swarm.trainer, swarm.validator, swarm.client
    worker, engine = swarm.worker, swarm.engine
    await request_tasks(trainer, 1)
    await pull_and_commit(client, worker, tokenizer=True)
    job = await pull_job(validator)
    request = verdict_on(job, logprobs([-0.5, -0.5, -0.5]))
    request.request_id = "verdict-1"
    first = await validator.validation.submit_verdict(request)
    again = await validator.validation.submit_verdict(request)
    assert again == first
    assert verdict_rows(engine) == 1
    # The stream's copy comes from the stored verdict, once.
    (rollout,) = await streamed(trainer, 1)
    assert list(rollout.validated_logprobs) == [-0.5, -0.5, -0.5]


async def test_a_task_whose_verdict_could_not_be_delivered_is_refused(
    coordinator_config: CoordinatorConfig, trainer_identity: Identity
) -> None:
    # 4 bytes per completion token: at 1 MiB per message, 8 rollouts of 32,768 tokens need
    # 8 x (131,072 + 4,096) bytes, more than one verdict can hold; 7 fit.
    config = with_overrides(coordinator_config, max_message_bytes=1 << 20)
    coordinator = await start_coordinator(config)
    trainer = connect(coordinator.address, trainer_identity)
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        await publish_checkpoint(trainer, trainer_identity, step=1, tokenizer=True)

        def demand(samples: int) -> rollout_service_pb2.RequestRolloutsRequest:
            return rollout_service_pb2.RequestRolloutsRequest(
                rollout_step=1,
                environment="arithmetic",
                prompt_count=2,
                samples_per_prompt=samples,
                sampling=common_pb2.SamplingParams(temperature=1.0, max_new_tokens=32768),
                prompts_per_task=1,
            )

        with pytest.raises(RollnetError) as caught:
            await trainer.rollouts.request_rollouts(demand(8))
        assert caught.value.reason == ErrorReason.INVALID_FIELDS
        (violation,) = caught.value.field_violations
        assert violation.field == "prompts_per_task"
        assert "1081344 bytes" in violation.description
        assert "max_message_bytes (1048576)" in violation.description
        created = await trainer.rollouts.request_rollouts(demand(7))
        assert len(created.task_ids) == 2
    finally:
        await trainer.close()
        await coordinator.stop(grace=0.1)
