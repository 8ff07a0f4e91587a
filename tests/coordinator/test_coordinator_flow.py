"""The whole loop through a real coordinator on port 0, on SQLite and PostgreSQL.

trainer publishes a checkpoint and asks for rollouts → worker registers, pulls, uploads a rollout
batch, commits → validator pulls the job and accepts or rejects → ledger credits or slashes →
the trainer's stream delivers accepted rollouts; `rollnet ledger verify` passes afterwards.
"""

from __future__ import annotations

import math

import blake3
import coordinator_testing
import grpc
import pytest
from coordinator_testing import publish_checkpoint, register
from google.protobuf import duration_pb2, unknown_fields

from rollnet.reference.cli import main as cli_main
from rollnet.reference.coordinator import commitments
from rollnet.reference.coordinator.credit import slash_amount
from rollnet.reference.coordinator.server import Coordinator
from rollnet.sdk import batches, testing
from rollnet.sdk.client import RollnetClient
from rollnet.sdk.errors import ErrorReason, RollnetError
from rollnet.sdk.identity import Identity
from rollnet.sdk.proofs.challenge import verify_challenge
from rollnet.sdk.retry import RetryPolicy
from rollnet.v1 import (
    blob_service_pb2,
    commitment_pb2,
    commitment_service_pb2,
    common_pb2,
    ledger_service_pb2,
    node_service_pb2,
    rollout_service_pb2,
    task_service_pb2,
    validation_pb2,
    validation_service_pb2,
)


def connect(coordinator: Coordinator, identity: Identity) -> RollnetClient:
    """A client that retries what is retryable, as a real node would."""
    return testing.connect(coordinator.address, identity, retry=RetryPolicy(), timeout=30.0)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def unknown_field(number: int, payload: bytes) -> bytes:
    """Wire bytes of a length-delimited field ``number`` that no rollnet message defines."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


HOSTILE_EXTRA = b"hostile worker's extra field"


async def do_task(
    client: RollnetClient, worker: Identity, unknown: bytes = b"", *, tokenizer: bool = False
) -> tuple[commitment_service_pb2.SubmitCommitmentResponse, int]:
    """Lease a task and commit honest-looking work; ``unknown`` is appended, as fields the schema
    does not define, to every rollout and to its claimed reward (a sub-message). Prompts are
    three made-up tokens, or with ``tokenizer`` encoded as a worker would
    (coordinator_testing.honest_prompt_ids, for a checkpoint published with its tokenizer)."""
    pulled = await client.tasks.pull_task(
        task_service_pb2.PullTaskRequest(wait=duration_pb2.Duration(seconds=5))
    )
    assert pulled.HasField("task"), "a task was queued, the pull must lease it"
    task, lease = pulled.task, pulled.lease
    rollouts = coordinator_testing.make_work(worker, task, lease, tokenizer=tokenizer).rollouts
    if unknown:
        for rollout in rollouts:
            rollout.claimed_reward.MergeFromString(unknown)
            rollout.MergeFromString(unknown)
            assert len(unknown_fields.UnknownFieldSet(rollout)) == 1
            assert len(unknown_fields.UnknownFieldSet(rollout.claimed_reward)) == 1
    binding = coordinator_testing.lease_binding(worker, task, lease)
    batch = batches.encode_batch(binding, task.checkpoint_step, rollouts)
    uploaded = await client.blobs.upload(batch, blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH)
    request = batches.commitment_request(binding, uploaded.blob, rollouts)
    response = await client.commitments.submit_commitment(request)
    return response, len(rollouts)


async def register_roles(
    clients: tuple[RollnetClient, RollnetClient, RollnetClient],
    identities: tuple[Identity, Identity, Identity],
) -> None:
    """Register a trainer, a validator and a worker, each through its own client."""
    roles = (common_pb2.ROLE_TRAINER, common_pb2.ROLE_VALIDATOR, common_pb2.ROLE_WORKER)
    for client, identity, role in zip(clients, identities, roles, strict=True):
        await register(client, identity, role)


async def reject_next_job(validator: RollnetClient, reason: str) -> None:
    """Pull the next validation job and reject it with ``reason``."""
    job = await validator.validation.pull_validation_job(
        validation_service_pb2.PullValidationJobRequest(wait=duration_pb2.Duration(seconds=5))
    )
    await validator.validation.submit_verdict(
        validation_service_pb2.SubmitVerdictRequest(
            job_id=job.job.job_id,
            lease_id=job.lease.lease_id,
            fencing_token=job.lease.fencing_token,
            decision=validation_pb2.Verdict.DECISION_REJECT,
            reject_reason=reason,
        )
    )


@pytest.mark.timeout(120)
async def test_full_loop_credit_slash_eject_and_verify(
    coordinator: Coordinator,
    coordinator_config: object,
    trainer_identity: Identity,
    validator_identity: Identity,
    db_url: str,
) -> None:
    worker = Identity.generate()
    identities = (trainer_identity, validator_identity, worker)
    trainer, validator, client = (connect(coordinator, i) for i in identities)
    try:
        await register_roles((trainer, validator, client), identities)

        # Demand before any checkpoint is refused with its reason.
        demand = rollout_service_pb2.RequestRolloutsRequest(
            rollout_step=1,
            environment="arithmetic",
            prompt_count=4,
            samples_per_prompt=2,
            sampling=common_pb2.SamplingParams(temperature=1.0, max_new_tokens=8),
            prompts_per_task=2,
        )
        with pytest.raises(RollnetError) as refused:
            await trainer.rollouts.request_rollouts(demand)
        assert refused.value.reason == ErrorReason.CHECKPOINT_NOT_FOUND

        await publish_checkpoint(trainer, trainer_identity, step=1)
        created = await trainer.rollouts.request_rollouts(demand)
        assert len(created.task_ids) == 2

        # Work 1: accepted and credited; its blob carries fields the schema does not define.
        extra = unknown_field(4242, HOSTILE_EXTRA)
        submitted, count = await do_task(client, worker, unknown=extra)
        receipt = submitted.receipt
        assert receipt.coordinator_public_key == coordinator.ctx.identity.public_key
        job = await validator.validation.pull_validation_job(
            validation_service_pb2.PullValidationJobRequest(wait=duration_pb2.Duration(seconds=5))
        )
        assert job.job.commitment.commitment_id == submitted.commitment.commitment_id
        # The post-commitment challenge: the coordinator's signature over the commitment it
        # recorded (its id did not exist before SubmitCommitment), checkable by anyone.
        assert job.job.challenged_rollouts == min(count, 8)
        assert verify_challenge(
            coordinator.ctx.identity.public_key,
            job.job.challenge,
            job.job.network_id,
            submitted.commitment.commitment_id,
            submitted.commitment.binding_digest,
            count,
            job.job.challenged_rollouts,
        )
        rewards = [common_pb2.Reward(task_reward=1.0, total=1.0)] * count
        verdict = await validator.validation.submit_verdict(
            validation_service_pb2.SubmitVerdictRequest(
                job_id=job.job.job_id,
                lease_id=job.lease.lease_id,
                fencing_token=job.lease.fencing_token,
                decision=validation_pb2.Verdict.DECISION_ACCEPT,
                validated_rewards=rewards,
                validated_work=commitment_pb2.WorkClaim(
                    prefill_tokens=3 * count, decode_tokens=3 * count
                ),
            )
        )
        assert verdict.verdict.work_units == 6 * count * 2
        balance = await client.ledger.get_balance(ledger_service_pb2.GetBalanceRequest())
        assert balance.balance == 6 * count * 2

        # The trainer's stream delivers the accepted rollouts with validated rewards.
        stream = trainer.rollouts.stream(0)
        received = [await anext(stream) for _ in range(count)]
        assert [r.validated_reward.total for r in received] == [1.0] * count
        assert len({r.sequence for r in received}) == count
        # No validator interpreted the unknown fields: none of them reaches the trainer.
        for accepted in received:
            assert len(unknown_fields.UnknownFieldSet(accepted.rollout)) == 0
            assert len(unknown_fields.UnknownFieldSet(accepted.rollout.claimed_reward)) == 0
            assert HOSTILE_EXTRA not in accepted.SerializeToString()
            assert list(accepted.rollout.completion_token_ids) == [4, 5, 0]  # known fields kept

        # Work 2: rejected → slashed; the task is requeued for someone else.
        submitted, count = await do_task(client, worker)
        await reject_next_job(validator, "EXPONENT_MISMATCH")
        balance = await client.ledger.get_balance(ledger_service_pb2.GetBalanceRequest())
        assert balance.slashed == 6 * count * 2
        assert balance.balance == 0

        head = await client.ledger.get_chain_head(
            ledger_service_pb2.GetChainHeadRequest(fresh=True)
        )
        assert head.head.sequence >= 4
    finally:
        for c in (trainer, validator, client):
            await c.close()
    await coordinator.stop(grace=0.5)
    assert cli_main(["ledger", "verify", "--db", db_url]) == 0


async def test_unknown_key_and_wrong_role_are_refused(
    coordinator: Coordinator, trainer_identity: Identity
) -> None:
    stranger = Identity.generate()
    client = connect(coordinator, stranger)
    try:
        with pytest.raises(RollnetError) as refused:
            await client.tasks.pull_task(task_service_pb2.PullTaskRequest())
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert refused.value.reason == ErrorReason.UNKNOWN_KEY
        # A trainer role needs the allow-list.
        with pytest.raises(RollnetError) as refused:
            await register(client, stranger, common_pb2.ROLE_TRAINER)
        assert refused.value.reason == ErrorReason.ROLE_NOT_PERMITTED
        # Unsupported major version names the supported range.
        with pytest.raises(RollnetError) as refused:
            await client.nodes.register_node(
                node_service_pb2.RegisterNodeRequest(
                    public_key=stranger.public_key,
                    role=common_pb2.ROLE_WORKER,
                    protocol_version=common_pb2.ProtocolVersion(major=2),
                )
            )
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.reason == ErrorReason.PROTOCOL_VERSION_UNSUPPORTED
        assert refused.value.metadata["supported_major"] == "1"
        # A worker may not pull validation jobs.
        await register(client, stranger, common_pb2.ROLE_WORKER)
        with pytest.raises(RollnetError) as refused:
            await client.validation.pull_validation_job(
                validation_service_pb2.PullValidationJobRequest()
            )
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
        # Bad input is INVALID_ARGUMENT with field violations, never INTERNAL.
        with pytest.raises(RollnetError) as refused:
            await client.commitments.submit_commitment(
                commitment_service_pb2.SubmitCommitmentRequest()
            )
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        fields = {v.field for v in refused.value.field_violations}
        assert {"lease_id", "task_id", "binding_digest"} <= fields
    finally:
        await client.close()


_ = blake3


async def test_demand_outside_the_operator_limits_is_refused_field_by_field(
    coordinator: Coordinator, trainer_identity: Identity
) -> None:
    trainer = connect(coordinator, trainer_identity)
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        await publish_checkpoint(trainer, trainer_identity, step=1)
        with pytest.raises(RollnetError) as refused:
            await trainer.rollouts.request_rollouts(
                rollout_service_pb2.RequestRolloutsRequest(
                    rollout_step=1,
                    environment="no-such-environment",
                    prompt_count=1,
                    samples_per_prompt=100_000,
                    sampling=common_pb2.SamplingParams(temperature=50.0, max_new_tokens=10**6),
                )
            )
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        fields = {v.field for v in refused.value.field_violations}
        assert {"samples_per_prompt", "sampling.temperature", "sampling.max_new_tokens"} <= fields
        with pytest.raises(RollnetError) as refused:
            await trainer.rollouts.request_rollouts(
                rollout_service_pb2.RequestRolloutsRequest(
                    rollout_step=1,
                    environment="no-such-environment",
                    prompt_count=1,
                    samples_per_prompt=2,
                    sampling=common_pb2.SamplingParams(temperature=1.0, max_new_tokens=8),
                )
            )
        assert [v.field for v in refused.value.field_violations] == ["environment"]
        assert "arithmetic" in refused.value.message  # names what is available
    finally:
        await trainer.close()


async def test_a_temperature_that_is_not_finite_or_outside_its_bounds_is_refused(
    coordinator: Coordinator, trainer_identity: Identity
) -> None:
    """Tiny temperatures make logits / T overflow to inf/NaN in the validator's sampling check:
    the coordinator refuses them, and non-finite ones, when the tasks are created."""
    trainer = connect(coordinator, trainer_identity)

    def demand(temperature: float) -> rollout_service_pb2.RequestRolloutsRequest:
        return rollout_service_pb2.RequestRolloutsRequest(
            rollout_step=1,
            environment="arithmetic",
            prompt_count=1,
            samples_per_prompt=1,
            sampling=common_pb2.SamplingParams(temperature=temperature, max_new_tokens=8),
        )

    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        await publish_checkpoint(trainer, trainer_identity, step=1)
        for temperature in (1e-310, 5e-324, 9.99e-4, 0.0, -1.0, math.nan, math.inf, 2.0001):
            with pytest.raises(RollnetError) as refused:
                await trainer.rollouts.request_rollouts(demand(temperature))
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT, temperature
            assert refused.value.reason == ErrorReason.INVALID_FIELDS, temperature
            violations = list(refused.value.field_violations)
            assert [v.field for v in violations] == ["sampling.temperature"], temperature
            assert "0.001 to 2.0 (max_temperature)" in violations[0].description
        for temperature in (1e-3, 2.0):  # both bounds are allowed
            created = await trainer.rollouts.request_rollouts(demand(temperature))
            assert len(created.task_ids) == 1
    finally:
        await trainer.close()


def test_slash_amount_divides_the_work_by_the_check_probability() -> None:
    assert slash_amount(10, 1.0) == 10
    assert slash_amount(10, 0.1) == 100
    assert slash_amount(10, 0.3) == 34  # rounded up
    assert slash_amount(0, 0.5) == 0
    assert slash_amount(10_000_000, 2 / 3) == 15_000_001  # p as stored, exactly, rounded up
    assert slash_amount(1, 1 / 3_000_000) == 3_000_000  # tiny p: no division by zero
    assert slash_amount(5, 7.4e-7) == math.ceil(5 / 7.4e-7)
    for bad in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="not in"):
            slash_amount(10, bad)


@pytest.mark.timeout(120)
async def test_a_reject_is_slashed_the_work_over_its_check_probability(
    coordinator: Coordinator,
    trainer_identity: Identity,
    validator_identity: Identity,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A trusted node's work is checked with probability p and credited unchecked otherwise; a
    # reject costs the work / p, so cheating has a non-positive expected value.
    monkeypatch.setattr(commitments, "spot_check_probability", lambda *_: 0.25)
    monkeypatch.setattr(commitments, "spot_check_draw", lambda *_: 0.0)  # this one is checked
    worker = Identity.generate()
    identities = (trainer_identity, validator_identity, worker)
    trainer, validator, client = (connect(coordinator, i) for i in identities)
    try:
        await register_roles((trainer, validator, client), identities)
        await coordinator_testing.publish_checkpoint(
            trainer, trainer_identity, step=1, tokenizer=True
        )
        await trainer.rollouts.request_rollouts(
            rollout_service_pb2.RequestRolloutsRequest(
                rollout_step=1,
                environment="arithmetic",
                prompt_count=2,
                samples_per_prompt=2,
                sampling=common_pb2.SamplingParams(temperature=1.0, max_new_tokens=8),
                prompts_per_task=2,
            )
        )
        submitted, count = await do_task(client, worker, tokenizer=True)
        await reject_next_job(validator, "TOKEN_NOT_SAMPLED")
        balance = await client.ledger.get_balance(ledger_service_pb2.GetBalanceRequest())
        claimed = submitted.commitment.claimed_work  # the coordinator's count of the batch
        assert claimed.decode_tokens == 3 * count
        work = (claimed.prefill_tokens + claimed.decode_tokens) * 2  # x 2 MFLOPs per token
        assert balance.slashed == 4 * work
    finally:
        for c in (trainer, validator, client):
            await c.close()
