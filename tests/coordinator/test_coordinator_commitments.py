"""Commitments and verdicts: signed, idempotent receipts; binding and batch checks; spot checks
thinning out for trusted nodes; ejection after repeated rejects."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import blake3
import grpc
import pytest
from coordinator_testing import (
    commitment_request,
    judge_next_job,
    make_work,
    publish_checkpoint,
    pull,
    pull_and_commit,
    register,
    request_tasks,
    running_parties,
    upload_and_commit,
)
from google.protobuf import duration_pb2

from rollnet.reference.coordinator.batches import count_rollouts
from rollnet.reference.coordinator.config import CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.credit import spot_check_draw, spot_check_probability
from rollnet.reference.coordinator.server import prune_uncredited_blobs, start_coordinator
from rollnet.sdk import ErrorReason, Identity, RollnetError, verify_signature
from rollnet.sdk.commitments import max_batch_bytes
from rollnet.sdk.testing import connect, wait_until
from rollnet.v1 import (
    blob_service_pb2,
    commitment_pb2,
    commitment_service_pb2,
    common_pb2,
    ledger_service_pb2,
    node_pb2,
    node_service_pb2,
    rollout_pb2,
    validation_pb2,
    validation_service_pb2,
)

BATCH = blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH


def receipt_bytes(receipt: commitment_pb2.Receipt) -> bytes:
    """The signed bytes of a receipt, rebuilt from docs/protocol.md ("Other signed bytes")."""
    micros = receipt.received_at.seconds * 1_000_000 + receipt.received_at.nanos // 1000
    return (
        b"rollnet-receipt-v1\n"
        + receipt.commitment_id.encode()
        + b"\n"
        + receipt.binding_digest.hex().encode()
        + b"\n"
        + str(micros).encode()
    )


async def test_submission_checks_and_idempotent_receipts(
    coordinator_config: CoordinatorConfig, trainer_identity: Identity
) -> None:
    async with running_parties(coordinator_config, trainer_identity) as parties:
        coordinator, trainer = parties.coordinator, parties.trainer
        client, worker = parties.client, parties.worker
        await request_tasks(trainer, 1, samples_per_prompt=2)
        leased = await pull(client)
        work = make_work(worker, leased.task, leased.lease)
        uploaded = await client.blobs.upload(work.batch, BATCH)
        request = commitment_request(worker, work, uploaded.blob)

        # A wrong binding digest: refused before anything is stored.
        forged = commitment_service_pb2.SubmitCommitmentRequest()
        forged.CopyFrom(request)
        forged.binding_digest = bytes(32)
        with pytest.raises(RollnetError) as refused:
            await client.commitments.submit_commitment(forged)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.reason == ErrorReason.COMMITMENT_BINDING_INVALID

        # A batch that does not match the task (one rollout short), and a blob that is no batch.
        short = make_work(worker, leased.task, leased.lease)
        del short.rollouts[-1]
        short.batch = rollout_pb2.RolloutBatch(
            task_id=leased.task.task_id,
            lease_id=leased.lease.lease_id,
            fencing_token=leased.lease.fencing_token,
            node_id=worker.node_id,
            checkpoint_step=leased.task.checkpoint_step,
            rollouts=short.rollouts,
        ).SerializeToString()
        for batch in (short.batch, b"\xff\xfe not a protobuf"):
            blob = (await client.blobs.upload(batch, BATCH)).blob
            with pytest.raises(RollnetError) as refused:
                await client.commitments.submit_commitment(commitment_request(worker, short, blob))
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.reason == ErrorReason.ROLLOUT_BATCH_INVALID

        # A completion longer than the task allows (unchecked commitments are credited for
        # their completion tokens, so the coordinator refuses it itself).
        long = make_work(worker, leased.task, leased.lease)
        limit = leased.task.sampling.max_new_tokens
        long.rollouts[1].completion_token_ids.extend([4] * limit)
        padded = rollout_pb2.RolloutBatch.FromString(work.batch)
        padded.rollouts[1].completion_token_ids.extend([4] * limit)
        long.batch = padded.SerializeToString()
        blob = (await client.blobs.upload(long.batch, BATCH)).blob
        with pytest.raises(RollnetError) as refused:
            await client.commitments.submit_commitment(commitment_request(worker, long, blob))
        assert refused.value.reason == ErrorReason.ROLLOUT_BATCH_INVALID
        assert f"the task allows {limit}" in refused.value.message

        # The honest commitment, then the same call again: the same receipt, nothing new.
        request.request_id = "commit-1"
        first = await client.commitments.submit_commitment(request)
        receipt = first.receipt
        assert receipt.coordinator_public_key == coordinator.ctx.identity.public_key
        assert verify_signature(
            coordinator.ctx.identity.public_key, receipt.signature, receipt_bytes(receipt)
        )
        assert not verify_signature(
            coordinator.ctx.identity.public_key, receipt.signature, receipt_bytes(receipt) + b"0"
        )
        repeat = await client.commitments.submit_commitment(request)
        assert repeat.receipt == receipt
        assert repeat.commitment.commitment_id == first.commitment.commitment_id
        # The same work under a fresh request id (a client that lost its id) is recognised too.
        fresh = commitment_service_pb2.SubmitCommitmentRequest()
        fresh.CopyFrom(request)
        fresh.request_id = "commit-1-retry"
        assert (await client.commitments.submit_commitment(fresh)).receipt == receipt

        # The request id reused for a different body is refused.
        changed = commitment_service_pb2.SubmitCommitmentRequest()
        changed.CopyFrom(request)
        changed.claimed_work.decode_tokens += 1
        with pytest.raises(RollnetError) as refused:
            await client.commitments.submit_commitment(changed)
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.reason == ErrorReason.REQUEST_ID_REUSED

        # Exactly one commitment exists for the task, readable by its node.
        read = await client.commitments.get_commitment(
            commitment_service_pb2.GetCommitmentRequest(
                commitment_id=first.commitment.commitment_id
            )
        )
        assert read.commitment.task_id == leased.task.task_id
        assert read.commitment.state == commitment_pb2.Commitment.STATE_PENDING


async def test_spot_checks_thin_out_and_rejects_eject(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    validator_identity: Identity,
) -> None:
    config = with_overrides(
        coordinator_config, trusted_streak=2, min_validation_rate=0.0, eject_after_rejects=2
    )
    coordinator = await start_coordinator(config)
    honest, cheat = Identity.generate(), Identity.generate()
    trainer = connect(coordinator.address, trainer_identity)
    validator = connect(coordinator.address, validator_identity)
    good = connect(coordinator.address, honest)
    bad = connect(coordinator.address, cheat)
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        await register(validator, validator_identity, common_pb2.ROLE_VALIDATOR)
        await register(good, honest, common_pb2.ROLE_WORKER)
        await register(bad, cheat, common_pb2.ROLE_WORKER)
        await publish_checkpoint(trainer, trainer_identity, step=1, tokenizer=True)
        await request_tasks(trainer, 14)

        # The honest node: everything is validated until its streak reaches trusted_streak, then
        # each commitment is checked with probability trusted_streak / streak, drawn from the
        # coordinator seed and the commitment id (so an auditor can redo every draw).
        streak, skipped = 0, 0
        for _ in range(12):
            submitted = await pull_and_commit(good, honest, tokenizer=True)
            commitment = submitted.commitment
            queued = commitment.state == commitment_pb2.Commitment.STATE_PENDING
            probability = spot_check_probability(streak, 2, 0.0)
            assert queued == (spot_check_draw(config.seed, commitment.commitment_id) < probability)
            if streak < 2:
                assert queued, "an untrusted node's work is always validated"
            if queued:
                verdict = await judge_next_job(validator, accept=True)
                assert verdict.verdict.commitment_id == commitment.commitment_id
                streak += 1
            else:
                skipped += 1
                assert commitment.state == commitment_pb2.Commitment.STATE_ACCEPTED
                assert not commitment.validated
        assert skipped > 0, "a trusted node's work is sampled, not all validated"
        node = await good.nodes.get_node(node_service_pb2.GetNodeRequest())
        assert node.node.trust_streak == streak
        balance = await good.ledger.get_balance(ledger_service_pb2.GetBalanceRequest())
        assert balance.credited > 0
        assert balance.slashed == 0
        assert balance.entry_count == 12  # one credit per commitment, checked or not

        # The cheat: rejects slash it, reset its streak, and the second one ejects it.
        for attempt in range(2):
            await pull_and_commit(bad, cheat, tokenizer=True)
            verdict = await judge_next_job(validator, accept=False)
            assert verdict.verdict.work_units < 0
            state = (await bad.nodes.get_node(node_service_pb2.GetNodeRequest())).node
            assert state.reject_count == attempt + 1
        assert state.state == node_pb2.Node.STATE_EJECTED
        assert "2 rejected commitments" in state.state_reason
        with pytest.raises(RollnetError) as refused:
            await pull(bad, wait=0)
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert refused.value.reason == ErrorReason.NODE_EJECTED
        # Its uploads too, at once (the state its key was cached with is dropped on ejection).
        with pytest.raises(RollnetError) as refused:
            await bad.blobs.upload(b"more work", blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH)
        assert refused.value.reason == ErrorReason.NODE_EJECTED
        # Verdicts come from validator keys only.
        with pytest.raises(RollnetError) as refused:
            await good.validation.submit_verdict(
                validation_service_pb2.SubmitVerdictRequest(
                    job_id="any", lease_id="any", decision=validation_pb2.Verdict.DECISION_ACCEPT
                )
            )
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert refused.value.reason == ErrorReason.ROLE_NOT_ALLOWED
        balance = await bad.ledger.get_balance(ledger_service_pb2.GetBalanceRequest())
        assert balance.slashed > 0
        assert balance.credited == 0
        # The rejected prompts were queued again; honest work on them is accepted.
        last = (await pull_and_commit(good, honest, tokenizer=True)).commitment
        if last.state == commitment_pb2.Commitment.STATE_PENDING:
            await judge_next_job(validator, accept=True)
        # The trainer's stream carries accepted work only: everything up to the last accepted
        # commitment, and not one rollout of the rejected ones (which came before it).
        stream = trainer.rollouts.stream(0)
        streamed: list[rollout_pb2.AcceptedRollout] = []
        while not streamed or streamed[-1].commitment_id != last.commitment_id:
            streamed.append(await asyncio.wait_for(anext(stream), timeout=10))
        assert {r.node_id for r in streamed} == {honest.node_id}
        assert len({r.commitment_id for r in streamed}) == 13
    finally:
        for c in (trainer, validator, good, bad):
            await c.close()
        await coordinator.stop(grace=0.1)


async def test_a_job_no_validator_finishes_is_given_up_and_its_prompts_queued_again(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    validator_identity: Identity,
) -> None:
    """A validation job whose lease lapses max_validation_attempts times (a validator that cannot
    get the inputs, or dies on the job) is given up: the commitment is UNVERIFIABLE, nobody is
    credited or slashed, and the task's prompts are queued again as a new task."""
    config = with_overrides(
        coordinator_config,
        heartbeat_interval=timedelta(seconds=0.5),
        heartbeat_interval_min=timedelta(seconds=0.1),
        suspect_after_missed=30.0,  # the nodes here do not heartbeat: keep them ACTIVE
        offline_after_missed=60.0,
        lease_duration=timedelta(seconds=1),
        sweep_interval=timedelta(seconds=0.05),
        max_validation_attempts=2,
    )
    async with running_parties(config, trainer_identity, validator_identity) as parties:
        coordinator, trainer, validator = parties.coordinator, parties.trainer, parties.validator
        worker, worker_identity = parties.client, parties.worker
        await request_tasks(trainer, 1)
        first = await pull(worker)
        assert first.HasField("task")
        submitted = await upload_and_commit(
            worker, worker_identity, make_work(worker_identity, first.task, first.lease)
        )
        commitment_id = submitted.commitment.commitment_id
        leases = []
        for _ in range(2):  # leased, never answered, taken back at the deadline: twice
            job = await validator.validation.pull_validation_job(
                validation_service_pb2.PullValidationJobRequest(
                    wait=duration_pb2.Duration(seconds=10)
                )
            )
            assert job.HasField("job")
            leases.append(job.lease.fencing_token)
        assert leases == [1, 2]

        async def given_up() -> bool:
            read = await worker.commitments.get_commitment(
                commitment_service_pb2.GetCommitmentRequest(commitment_id=commitment_id)
            )
            return read.commitment.state == commitment_pb2.Commitment.STATE_UNVERIFIABLE

        await wait_until(given_up, within=20, what="the validation given up")
        again = await pull(worker)
        assert again.HasField("task")
        assert again.task.task_id != first.task.task_id
        assert list(again.task.prompt_ids) == list(first.task.prompt_ids)
        none_left = await validator.validation.pull_validation_job(
            validation_service_pb2.PullValidationJobRequest(wait=duration_pb2.Duration())
        )
        assert not none_left.HasField("job")
        balance = await worker.ledger.get_balance(
            ledger_service_pb2.GetBalanceRequest(node_id=worker_identity.node_id)
        )
        assert (balance.credited, balance.slashed) == (0, 0)
        assert coordinator.ctx.metrics.validation_failed._value.get() == 1
        # Nobody could check it: its batch is kept for rejected_blob_ttl, then deleted.
        batch = coordinator.ctx.blobs
        digest = blake3.blake3(make_work(worker_identity, first.task, first.lease).batch).digest()
        assert batch.exists(digest)
        assert await prune_uncredited_blobs(coordinator.ctx) == (0, 0)
        later = coordinator.ctx.clock() + config.rejected_blob_ttl + timedelta(seconds=1)
        coordinator.ctx.clock = lambda: later
        files, _ = await prune_uncredited_blobs(coordinator.ctx)
        assert files == 1
        assert not batch.exists(digest)


def test_rollouts_are_counted_on_the_wire_without_parsing() -> None:
    rollouts = [rollout_pb2.Rollout(prompt_index=i, completion_token_ids=[4, 5]) for i in range(5)]
    data = rollout_pb2.RolloutBatch(
        task_id="t", lease_id="l", fencing_token=3, node_id="n", rollouts=rollouts
    ).SerializeToString()
    assert count_rollouts(data, limit=100) == 5
    assert count_rollouts(data, limit=3) == 3  # the scan stops at the limit
    assert count_rollouts(b"", limit=10) == 0
    assert count_rollouts(data[:-1], limit=100) == -1  # truncated
    assert count_rollouts(b"\xff\xfe not a protobuf", limit=10) == -1
    assert count_rollouts(b"\x33", limit=10) == -1  # a group (wire type 3)


async def test_a_blob_is_read_only_for_a_lease_that_may_submit(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Reading and parsing a blob costs the coordinator memory and time: a caller without the
    # task's lease is refused first, and a lease holder's blob of too many (tiny) rollouts is
    # refused from a count on the wire, before the batch is built.
    coordinator = await start_coordinator(coordinator_config)
    worker, stranger = Identity.generate(), Identity.generate()
    trainer = connect(coordinator.address, trainer_identity)
    client, other = connect(coordinator.address, worker), connect(coordinator.address, stranger)
    reads: list[bytes] = []
    blobs = coordinator.ctx.blobs
    real = blobs.read_range

    def counted(digest: bytes, offset: int, length: int) -> tuple[int, bytes]:
        reads.append(digest)
        return real(digest, offset, length)

    monkeypatch.setattr(blobs, "read_range", counted)
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        await register(client, worker, common_pb2.ROLE_WORKER)
        await register(other, stranger, common_pb2.ROLE_WORKER)
        await publish_checkpoint(trainer, trainer_identity, step=1)
        await request_tasks(trainer, 1, samples_per_prompt=2)
        leased = await pull(client)
        work = make_work(worker, leased.task, leased.lease)
        # The stranger uploads a batch over 1 MiB (smaller ones cost less to parse than the
        # lease read) and commits it under the worker's lease.
        stolen = make_work(stranger, leased.task, leased.lease)
        stolen.rollouts[0].prompt_token_ids.extend([1 << 21] * 300_000)  # 4 bytes each
        batch = rollout_pb2.RolloutBatch.FromString(stolen.batch)
        batch.rollouts[0].prompt_token_ids.extend([1 << 21] * 300_000)
        stolen.batch = batch.SerializeToString()
        assert len(stolen.batch) > 1 << 20
        uploaded = await other.blobs.upload(stolen.batch, BATCH)
        with pytest.raises(RollnetError) as refused:
            await other.commitments.submit_commitment(
                commitment_request(stranger, stolen, uploaded.blob)
            )
        assert refused.value.reason == ErrorReason.LEASE_NOT_FOUND
        assert reads == []
        # The lease holder's batch padded with 100,000 empty rollouts (2 bytes each).
        padded = work.batch + b"\x32\x00" * 100_000
        uploaded = await client.blobs.upload(padded, BATCH)
        with pytest.raises(RollnetError) as refused:
            await client.commitments.submit_commitment(
                commitment_request(worker, work, uploaded.blob)
            )
        assert refused.value.reason == ErrorReason.ROLLOUT_BATCH_INVALID
        assert "more than" in refused.value.message
        # A batch larger than any batch for the task may be: refused from its size, unread.
        limit = max_batch_bytes(2, leased.task.sampling.max_new_tokens)
        bulky = work.batch + rollout_pb2.RolloutBatch(task_id="x" * limit).SerializeToString()
        uploaded = await client.blobs.upload(bulky, BATCH)
        with pytest.raises(RollnetError) as refused:
            await client.commitments.submit_commitment(
                commitment_request(worker, work, uploaded.blob)
            )
        assert refused.value.reason == ErrorReason.ROLLOUT_BATCH_INVALID
        assert f"a batch for this task is at most {limit}" in refused.value.message
        # The honest batch still goes through.
        uploaded = await client.blobs.upload(work.batch, BATCH)
        response = await client.commitments.submit_commitment(
            commitment_request(worker, work, uploaded.blob)
        )
        assert response.receipt.signature
    finally:
        for c in (trainer, client, other):
            await c.close()
        await coordinator.stop(grace=0.1)


async def test_only_the_coordinators_token_counts_are_shown(
    coordinator_config: CoordinatorConfig, trainer_identity: Identity, validator_identity: Identity
) -> None:
    """A claim of 2 x 10^12 tokens for a batch of a few is not echoed: the receipt's commitment,
    GetCommitment and the validator's job show the tokens the coordinator counted."""
    async with running_parties(coordinator_config, trainer_identity, validator_identity) as parties:
        trainer, validator = parties.trainer, parties.validator
        client, worker = parties.client, parties.worker
        await request_tasks(trainer, 1, samples_per_prompt=2)
        leased = await pull(client)
        work = make_work(worker, leased.task, leased.lease)
        uploaded = await client.blobs.upload(work.batch, BATCH)
        request = commitment_request(worker, work, uploaded.blob)
        request.claimed_work.prefill_tokens = 10**12
        request.claimed_work.decode_tokens = 10**12
        submitted = await client.commitments.submit_commitment(request)
        counted = commitment_pb2.WorkClaim(
            prefill_tokens=sum(len(r.prompt_token_ids) for r in work.rollouts),
            decode_tokens=sum(len(r.completion_token_ids) for r in work.rollouts),
        )
        assert counted.prefill_tokens == 6  # make_work's three made-up prompt tokens, twice
        assert submitted.commitment.claimed_work == counted
        read = await client.commitments.get_commitment(
            commitment_service_pb2.GetCommitmentRequest(
                commitment_id=submitted.commitment.commitment_id
            )
        )
        assert read.commitment.claimed_work == counted
        job = await validator.validation.pull_validation_job(
            validation_service_pb2.PullValidationJobRequest()
        )
        assert job.job.commitment.claimed_work == counted
