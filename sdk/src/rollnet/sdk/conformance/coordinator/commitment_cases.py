"""The coordinator suite's cases: commitments."""

from __future__ import annotations

import os

import blake3

from rollnet.sdk.commitments import verify_receipt
from rollnet.sdk.conformance.coordinator._base import C, case, expect
from rollnet.sdk.conformance.target import GET_COMMITMENT, SUBMIT, Target
from rollnet.v1 import commitment_pb2, commitment_service_pb2, common_pb2


@case(
    "commitment.receipt",
    "a commitment's receipt verifies with the coordinator key; GetCommitment reads it",
)
async def commitment_receipt(target: Target) -> None:
    worker = await target.worker()
    work, response = await target.committed(worker)
    key = await target.coordinator_public_key()
    expect(verify_receipt(response.receipt, key), "the receipt's signature does not verify")
    expect(
        bytes(response.receipt.coordinator_public_key) == key,
        "the receipt names another coordinator key than registration announced",
    )
    commitment = response.commitment
    expect(commitment.node_id == worker.node_id, "the commitment names another node")
    expect(commitment.task_id == work.task.task_id, "the commitment names another task")
    read = await worker.call(
        GET_COMMITMENT,
        commitment_service_pb2.GetCommitmentRequest(commitment_id=commitment.commitment_id),
        commitment_service_pb2.GetCommitmentResponse,
    )
    expect(
        read.commitment.binding_digest == commitment.binding_digest,
        "GetCommitment answers another binding digest",
    )
    await worker.refused(
        GET_COMMITMENT,
        commitment_service_pb2.GetCommitmentRequest(commitment_id="conformance-none"),
        C.NOT_FOUND,
        "COMMITMENT_NOT_FOUND",
    )


@case(
    "commitment.others",
    "a worker reading another node's commitment: ROLE_NOT_ALLOWED; a validator may",
)
async def commitment_others(target: Target) -> None:
    owner = await target.worker()
    other = await target.worker()
    _, response = await target.committed(owner)
    request = commitment_service_pb2.GetCommitmentRequest(
        commitment_id=response.commitment.commitment_id
    )
    await other.refused(GET_COMMITMENT, request, C.PERMISSION_DENIED, "ROLE_NOT_ALLOWED")
    validator = await target.peer("validator")
    read = await validator.call(
        GET_COMMITMENT, request, commitment_service_pb2.GetCommitmentResponse
    )
    expect(read.commitment.node_id == owner.node_id, "the validator read another commitment")


@case(
    "commitment.claimed_work",
    "claimed_work is the coordinator's count of the batch, whatever the node claimed",
)
async def commitment_claimed_work(target: Target) -> None:
    worker = await target.worker()
    task, lease = await target.lease(worker)
    work = target.work(worker, task, lease)
    uploaded = await worker.upload(work.batch)
    request = target.commitment(worker, work, uploaded.blob)
    counted = commitment_pb2.WorkClaim()
    counted.CopyFrom(request.claimed_work)
    request.claimed_work.decode_tokens += 1_000_000
    response = await worker.call(SUBMIT, request, commitment_service_pb2.SubmitCommitmentResponse)
    for shown, where in (
        (response.commitment.claimed_work, "SubmitCommitment"),
        (
            (
                await worker.call(
                    GET_COMMITMENT,
                    commitment_service_pb2.GetCommitmentRequest(
                        commitment_id=response.commitment.commitment_id
                    ),
                    commitment_service_pb2.GetCommitmentResponse,
                )
            ).commitment.claimed_work,
            "GetCommitment",
        ),
    ):
        expect(
            (shown.prefill_tokens, shown.decode_tokens)
            == (counted.prefill_tokens, counted.decode_tokens),
            f"{where} shows claimed_work {shown.prefill_tokens} + {shown.decode_tokens}, the "
            f"batch holds {counted.prefill_tokens} + {counted.decode_tokens} tokens",
        )


@case("commitment.binding", "a binding digest made for another node: COMMITMENT_BINDING_INVALID")
async def commitment_binding(target: Target) -> None:
    worker = await target.worker()
    task, lease = await target.lease(worker)
    work = target.work(worker, task, lease)
    uploaded = await worker.upload(work.batch)
    request = target.commitment(worker, work, uploaded.blob, binding_node=os.urandom(16).hex())
    await worker.refused(SUBMIT, request, C.INVALID_ARGUMENT, "COMMITMENT_BINDING_INVALID")


@case("commitment.blob_missing", "a commitment naming a blob never uploaded: BLOB_NOT_FOUND")
async def commitment_blob_missing(target: Target) -> None:
    worker = await target.worker()
    task, lease = await target.lease(worker)
    work = target.work(worker, task, lease)
    blob = common_pb2.BlobRef(blake3=blake3.blake3(work.batch).digest(), size=len(work.batch))
    await worker.refused(
        SUBMIT, target.commitment(worker, work, blob), C.NOT_FOUND, "BLOB_NOT_FOUND"
    )


@case("commitment.others_lease", "a worker committing under another node's lease: LEASE_NOT_FOUND")
async def commitment_others_lease(target: Target) -> None:
    owner = await target.worker()
    thief = await target.worker()
    task, lease = await target.lease(owner)
    work = target.work(thief, task, lease)
    uploaded = await thief.upload(work.batch)
    await thief.refused(
        SUBMIT, target.commitment(thief, work, uploaded.blob), C.NOT_FOUND, "LEASE_NOT_FOUND"
    )


@case(
    "commitment.others_blob",
    "a worker naming another node's batch under its own lease: ROLLOUT_BATCH_INVALID",
)
async def commitment_others_blob(target: Target) -> None:
    owner = await target.worker()
    thief = await target.worker()
    owner_task, owner_lease = await target.lease(owner)
    owner_work = target.work(owner, owner_task, owner_lease)
    uploaded = await owner.upload(owner_work.batch)
    task, lease = await target.lease(thief)
    work = target.work(thief, task, lease)
    await thief.refused(
        SUBMIT,
        target.commitment(thief, work, uploaded.blob),
        C.INVALID_ARGUMENT,
        "ROLLOUT_BATCH_INVALID",
    )


@case("commitment.rollout_count", "a batch with a rollout too many: ROLLOUT_BATCH_INVALID")
async def commitment_rollout_count(target: Target) -> None:
    worker = await target.worker()
    task, lease = await target.lease(worker)
    wanted = len(task.prompt_ids) * task.samples_per_prompt
    work = target.work(worker, task, lease, rollouts=wanted + 1)
    uploaded = await worker.upload(work.batch)
    await worker.refused(
        SUBMIT,
        target.commitment(worker, work, uploaded.blob),
        C.INVALID_ARGUMENT,
        "ROLLOUT_BATCH_INVALID",
        "INVALID_FIELDS",
    )
