"""The coordinator suite's cases: validation."""

from __future__ import annotations

from rollnet.sdk.conformance.coordinator._base import C, case, expect, ledger_entries
from rollnet.sdk.conformance.target import (
    GET_BALANCE,
    GET_COMMITMENT,
    PULL_JOB,
    VERDICT,
    Target,
    duration,
    new_request_id,
)
from rollnet.v1 import (
    commitment_pb2,
    commitment_service_pb2,
    ledger_service_pb2,
    validation_pb2,
    validation_service_pb2,
)


@case(
    "validation.accept",
    "ACCEPT credits the worker: commitment ACCEPTED, a credit entry, the balance",
)
async def validation_accept(target: Target) -> None:
    validator = await target.peer("validator")
    worker = await target.worker()
    _, response = await target.committed(worker)
    commitment_id = response.commitment.commitment_id
    pulled = await target.job_for(validator, commitment_id)
    expect(pulled.job.network_id == target.config.network_id, "the job names another network")
    expect(pulled.job.task.task_id == response.commitment.task_id, "the job carries another task")
    verdict = await validator.call(
        VERDICT, target.verdict(pulled, accept=True), validation_service_pb2.SubmitVerdictResponse
    )
    expect(verdict.verdict.decision == validation_pb2.Verdict.DECISION_ACCEPT, "not ACCEPT")
    expect(verdict.verdict.work_units >= 0, "negative work units")
    read = await worker.call(
        GET_COMMITMENT,
        commitment_service_pb2.GetCommitmentRequest(commitment_id=commitment_id),
        commitment_service_pb2.GetCommitmentResponse,
    )
    expect(
        read.commitment.state == commitment_pb2.Commitment.STATE_ACCEPTED,
        f"an accepted commitment is {commitment_pb2.Commitment.State.Name(read.commitment.state)}",
    )
    expect(read.commitment.validated, "an accepted, checked commitment is not validated")
    entries = await ledger_entries(worker, worker.node_id)
    credits = [e for e in entries if e.commitment_id == commitment_id]
    expect(len(credits) == 1, f"{len(credits)} ledger entries for the accepted commitment, not 1")
    balance = await worker.call(
        GET_BALANCE,
        ledger_service_pb2.GetBalanceRequest(node_id=worker.node_id),
        ledger_service_pb2.GetBalanceResponse,
    )
    expect(
        balance.balance == sum(e.amount for e in entries),
        f"GetBalance says {balance.balance}, the node's entries sum to "
        f"{sum(e.amount for e in entries)}",
    )


@case("validation.reject", "REJECT slashes the worker: commitment REJECTED, a negative entry")
async def validation_reject(target: Target) -> None:
    validator = await target.peer("validator")
    worker = await target.worker()
    _, response = await target.committed(worker)
    commitment_id = response.commitment.commitment_id
    pulled = await target.job_for(validator, commitment_id)
    await validator.call(
        VERDICT, target.verdict(pulled, accept=False), validation_service_pb2.SubmitVerdictResponse
    )
    read = await worker.call(
        GET_COMMITMENT,
        commitment_service_pb2.GetCommitmentRequest(commitment_id=commitment_id),
        commitment_service_pb2.GetCommitmentResponse,
    )
    expect(
        read.commitment.state == commitment_pb2.Commitment.STATE_REJECTED,
        f"a rejected commitment is {commitment_pb2.Commitment.State.Name(read.commitment.state)}",
    )
    entries = [
        e for e in await ledger_entries(worker, worker.node_id) if e.commitment_id == commitment_id
    ]
    expect(len(entries) == 1 and entries[0].amount < 0, "the reject left no negative entry")


@case(
    "validation.one_verdict",
    "a second verdict on a job: VERDICT_ALREADY_RECORDED; a retry: the first",
)
async def validation_one_verdict(target: Target) -> None:
    validator = await target.peer("validator")
    worker = await target.worker()
    _, response = await target.committed(worker)
    pulled = await target.job_for(validator, response.commitment.commitment_id)
    request = target.verdict(pulled, accept=True)
    first = await validator.call(VERDICT, request, validation_service_pb2.SubmitVerdictResponse)
    again = await validator.call(VERDICT, request, validation_service_pb2.SubmitVerdictResponse)
    expect(
        again.verdict.verdict_id == first.verdict.verdict_id,
        "a verdict retried with its request id answered another verdict",
    )
    other = target.verdict(pulled, accept=False)
    await validator.refused(VERDICT, other, C.FAILED_PRECONDITION, "VERDICT_ALREADY_RECORDED")


@case(
    "validation.pull_request_id",
    "a PullValidationJob retried with its request id returns the same job",
)
async def validation_pull_request_id(target: Target) -> None:
    validator = await target.peer("validator")
    worker = await target.worker()
    _, response = await target.committed(worker)
    request = validation_service_pb2.PullValidationJobRequest(
        request_id=new_request_id(), wait=duration(5.0)
    )
    first = await validator.call(
        PULL_JOB, request, validation_service_pb2.PullValidationJobResponse, timeout=20.0
    )
    expect(first.HasField("job"), "a job was queued, yet PullValidationJob leased none")
    again = await validator.call(
        PULL_JOB, request, validation_service_pb2.PullValidationJobResponse, timeout=20.0
    )
    expect(
        again.lease.lease_id == first.lease.lease_id and again.job.job_id == first.job.job_id,
        "a PullValidationJob retried with its request id leased another job",
    )
    await validator.call(
        VERDICT, target.verdict(first, accept=True), validation_service_pb2.SubmitVerdictResponse
    )
    if first.job.commitment.commitment_id != response.commitment.commitment_id:
        pulled = await target.job_for(validator, response.commitment.commitment_id)
        await validator.call(
            VERDICT,
            target.verdict(pulled, accept=True),
            validation_service_pb2.SubmitVerdictResponse,
        )


@case(
    "validation.verdict_fields",
    "logprobs of the wrong shape, with a REJECT, or work above the batch's: INVALID_FIELDS",
)
async def validation_verdict_fields(target: Target) -> None:
    validator = await target.peer("validator")
    worker = await target.worker()
    _, response = await target.committed(worker)
    pulled = await target.job_for(validator, response.commitment.commitment_id)
    short = target.verdict(pulled, accept=True)
    del short.validated_logprobs[0].logprobs[-1]
    await validator.refused(
        VERDICT,
        short,
        C.INVALID_ARGUMENT,
        "INVALID_FIELDS",
        field="validated_logprobs",
        what="a rollout's log-probabilities one too few",
    )
    positive = target.verdict(pulled, accept=True)
    positive.validated_logprobs[0].logprobs[0] = 0.5
    await validator.refused(
        VERDICT,
        positive,
        C.INVALID_ARGUMENT,
        "INVALID_FIELDS",
        field="validated_logprobs",
        what="a log-probability above 0",
    )
    reject = target.verdict(pulled, accept=False)
    reject.validated_logprobs.extend(target.verdict(pulled, accept=True).validated_logprobs)
    await validator.refused(
        VERDICT,
        reject,
        C.INVALID_ARGUMENT,
        "INVALID_FIELDS",
        field="validated_logprobs",
        what="log-probabilities with a REJECT",
    )
    inflated = target.verdict(pulled, accept=True)
    inflated.validated_work.decode_tokens += 1_000_000
    await validator.refused(
        VERDICT,
        inflated,
        C.INVALID_ARGUMENT,
        "INVALID_FIELDS",
        field="validated_work",
        what="validated_work above the batch's tokens",
    )
    # Nothing was recorded: the job still takes its verdict.
    await validator.call(
        VERDICT, target.verdict(pulled, accept=True), validation_service_pb2.SubmitVerdictResponse
    )


@case("validation.job_not_found", "a verdict on a job the validator does not hold: JOB_NOT_FOUND")
async def validation_job_not_found(target: Target) -> None:
    validator = await target.peer("validator")
    request = validation_service_pb2.SubmitVerdictRequest(
        request_id=new_request_id(),
        job_id="conformance-none",
        lease_id="conformance-none",
        fencing_token=1,
        decision=validation_pb2.Verdict.DECISION_REJECT,
        reject_reason="conformance",
    )
    await validator.refused(VERDICT, request, C.NOT_FOUND, "JOB_NOT_FOUND")
