"""The coordinator suite's cases: dispatch."""

from __future__ import annotations

import asyncio
import time

from rollnet.sdk.conformance.coordinator._base import C, _seconds, case, expect
from rollnet.sdk.conformance.suite import CaseFailure, Skipped
from rollnet.sdk.conformance.target import (
    FAIL_TASK,
    PULL_TASK,
    REPORT_PROGRESS,
    SUBMIT,
    Peer,
    Target,
    Work,
    duration,
    new_request_id,
    registration,
)
from rollnet.sdk.identity import Identity
from rollnet.v1 import commitment_service_pb2, common_pb2, node_pb2, task_service_pb2


@case(
    "dispatch.long_poll",
    "PullTask with nothing to do returns after about its wait, with retry_after",
)
async def dispatch_long_poll(target: Target) -> None:
    worker = await target.shared_worker()
    start = time.monotonic()
    pulled = await worker.call(
        PULL_TASK,
        task_service_pb2.PullTaskRequest(
            request_id=new_request_id(), wait=duration(1.0), environments=["conformance-none"]
        ),
        task_service_pb2.PullTaskResponse,
        timeout=1.0 + target.config.call_timeout,
    )
    took = time.monotonic() - start
    expect(not pulled.HasField("task"), "a task of an environment nobody serves was leased")
    expect(took < 6.0, f"a 1 s long poll took {took:.1f} s")
    expect(pulled.retry_after.ToTimedelta().total_seconds() > 0, "no retry_after with no work")


@case(
    "dispatch.lease", "a leased task: lease id, fencing token = attempt, deadline = lease_duration"
)
async def dispatch_lease(target: Target) -> None:
    worker = await target.worker()
    task, lease = await target.lease(worker)
    assert worker.registration is not None
    expect(lease.fencing_token >= 1, "fencing token below 1")
    expect(task.attempt == lease.fencing_token, "the fencing token is not the task's attempt")
    expect(task.state == task.STATE_LEASED, "a leased task is not LEASED")
    granted = _seconds(lease.deadline) - _seconds(lease.issued_at)
    wanted = worker.registration.lease_duration.ToTimedelta().total_seconds()
    expect(
        abs(granted - wanted) <= 1.0,
        f"deadline - issued_at is {granted:.1f} s, lease_duration {wanted:.1f} s",
    )
    beat = await worker.heartbeat(lease.lease_id)
    statuses = {status.lease_id: status for status in beat.leases}
    expect(lease.lease_id in statuses, "the heartbeat does not answer for the held lease")
    expect(statuses[lease.lease_id].valid, "a live lease is reported invalid")
    expect(
        _seconds(statuses[lease.lease_id].deadline) >= _seconds(lease.deadline) - 0.001,
        "a heartbeat moved the lease deadline earlier",
    )
    progress = await worker.call(
        REPORT_PROGRESS,
        task_service_pb2.ReportProgressRequest(
            lease_id=lease.lease_id, fencing_token=lease.fencing_token, total_rollouts=1
        ),
        task_service_pb2.ReportProgressResponse,
    )
    expect(progress.HasField("deadline"), "ReportProgress answers no deadline")


@case("dispatch.pull_request_id", "a PullTask retried with its request id returns the same lease")
async def dispatch_pull_request_id(target: Target) -> None:
    worker = await target.worker()
    await target.request_tasks()
    request_id = new_request_id()
    first = await worker.pull(request_id=request_id)
    expect(first.HasField("task"), "a task was queued, yet PullTask leased none")
    again = await worker.pull(request_id=request_id)
    expect(
        again.lease.lease_id == first.lease.lease_id,
        f"the retry leased {again.lease.lease_id!r}, not {first.lease.lease_id!r}",
    )


@case("dispatch.lease_cap", "a worker at its max_concurrent_leases gets no task, with retry_after")
async def dispatch_lease_cap(target: Target) -> None:
    worker = Peer(target, Identity.generate(), common_pb2.ROLE_WORKER)
    await target.register(
        worker,
        registration(
            worker.identity,
            worker.role,
            capabilities=node_pb2.Capabilities(max_concurrent_leases=1),
        ),
    )
    await worker.heartbeat()
    await target.lease(worker)
    await target.request_tasks()
    pulled = await worker.pull(wait=1.0)
    expect(not pulled.HasField("task"), "a second lease past max_concurrent_leases = 1")
    expect(pulled.retry_after.ToTimedelta().total_seconds() > 0, "no retry_after at the cap")
    # Take the queued task off the queue so that later cases lease their own.
    other = await target.worker()
    extra = await other.pull(wait=2.0)
    if extra.HasField("task"):
        await target.commit(other, target.work(other, extra.task, extra.lease))


@case("dispatch.fail_requeue", "FailTask requeues the task: another worker leases it, token + 1")
async def dispatch_fail_requeue(target: Target) -> None:
    first = await target.worker()
    task, lease = await target.lease(first)
    request = task_service_pb2.FailTaskRequest(
        request_id=new_request_id(),
        lease_id=lease.lease_id,
        fencing_token=lease.fencing_token,
        reason=task_service_pb2.FAIL_REASON_BACKEND_ERROR,
        message="conformance",
    )
    failed = await first.call(FAIL_TASK, request, task_service_pb2.FailTaskResponse)
    expect(failed.requeued, "a first attempt's FailTask did not requeue the task")
    repeat = await first.call(FAIL_TASK, request, task_service_pb2.FailTaskResponse)
    expect(repeat.requeued == failed.requeued, "a FailTask retried with its request id differs")
    await _lease_again(target, task.task_id, lease.fencing_token)


async def _lease_again(target: Target, task_id: str, old_token: int) -> None:
    """Another worker leases ``task_id`` again, with a higher fencing token."""
    other = await target.worker()
    for _ in range(50):
        pulled = await other.pull(wait=2.0)
        if not pulled.HasField("task"):
            break
        if pulled.task.task_id != task_id:
            # A task an earlier case left (its lease ran out): finish it, so it leaves the
            # queue and does not hold one of this worker's leases.
            await target.commit(other, target.work(other, pulled.task, pulled.lease))
            continue
        token = pulled.lease.fencing_token
        expect(token > old_token, f"the new lease's fencing token {token} is not above {old_token}")
        return
    raise CaseFailure(f"task {task_id} was not leased again")


@case("dispatch.fencing", "a commitment with another fencing token: FENCING_TOKEN_STALE")
async def dispatch_fencing(target: Target) -> None:
    worker = await target.worker()
    task, lease = await target.lease(worker)
    for token in (lease.fencing_token + 1, lease.fencing_token - 1):
        # The batch names the same token as the commitment: only the lease check can object.
        work = target.work(worker, task, lease, fencing_token=token)
        uploaded = await worker.upload(work.batch)
        request = target.commitment(worker, work, uploaded.blob)
        await worker.refused(
            SUBMIT, request, C.FAILED_PRECONDITION, "FENCING_TOKEN_STALE", what=f"token {token}"
        )


@case(
    "dispatch.duplicate_submit",
    "a commitment retried (same or new request id) answers the original receipt",
)
async def dispatch_duplicate_submit(target: Target) -> None:
    worker = await target.worker()
    task, lease = await target.lease(worker)
    work = target.work(worker, task, lease)
    uploaded = await worker.upload(work.batch)
    request = target.commitment(worker, work, uploaded.blob)
    first = await worker.call(SUBMIT, request, commitment_service_pb2.SubmitCommitmentResponse)
    again = await worker.call(SUBMIT, request, commitment_service_pb2.SubmitCommitmentResponse)
    expect(
        again.commitment.commitment_id == first.commitment.commitment_id
        and again.receipt.signature == first.receipt.signature,
        "a retry with the same request id answered another commitment or receipt",
    )
    request.request_id = new_request_id()
    third = await worker.call(SUBMIT, request, commitment_service_pb2.SubmitCommitmentResponse)
    expect(
        third.commitment.commitment_id == first.commitment.commitment_id,
        "the same work under a new request id made a second commitment",
    )
    changed = target.commitment(worker, work, uploaded.blob)
    changed.request_id = request.request_id
    changed.claimed_work.decode_tokens += 1
    await worker.refused(SUBMIT, changed, C.FAILED_PRECONDITION, "REQUEST_ID_REUSED")


def _lease_seconds(target: Target, worker: Peer) -> float:
    """The lease duration the target announced, or skip when waiting it out takes too long."""
    assert worker.registration is not None
    seconds = worker.registration.lease_duration.ToTimedelta().total_seconds()
    if seconds + 5 > target.config.max_wait:
        raise Skipped(
            f"lease_duration is {seconds:g} s; waiting it out needs --max-wait {seconds + 5:g}"
        )
    return seconds


async def _expired_lease(target: Target) -> tuple[Peer, Work, common_pb2.BlobRef]:
    """A worker whose lease ran out (0.5 s ago), with its uploaded batch."""
    worker = await target.worker()
    _lease_seconds(target, worker)
    task, lease = await target.lease(worker)
    work = target.work(worker, task, lease)
    uploaded = await worker.upload(work.batch)
    await asyncio.sleep(max(0.0, _seconds(lease.deadline) - time.time()) + 0.5)
    return worker, work, uploaded.blob


@case(
    "dispatch.lease_expiry", "a commitment after the lease deadline: LEASE_EXPIRED", timeout=180.0
)
async def dispatch_lease_expiry(target: Target) -> None:
    worker, work, blob = await _expired_lease(target)
    beat = await worker.heartbeat(work.lease.lease_id)
    expect(
        not any(s.valid for s in beat.leases if s.lease_id == work.lease.lease_id),
        "a heartbeat still calls an expired lease valid",
    )
    await worker.refused(
        SUBMIT,
        target.commitment(worker, work, blob),
        C.FAILED_PRECONDITION,
        "LEASE_EXPIRED",
        what="a commitment 0.5 s after the deadline",
    )


@case(
    "dispatch.requeue",
    "an expired lease's task is leased again, token + 1; the old lease: FENCING_TOKEN_STALE",
    timeout=180.0,
)
async def dispatch_requeue(target: Target) -> None:
    worker, work, blob = await _expired_lease(target)
    await _lease_again(target, work.task.task_id, work.lease.fencing_token)
    await worker.refused(
        SUBMIT,
        target.commitment(worker, work, blob),
        C.FAILED_PRECONDITION,
        "FENCING_TOKEN_STALE",
        what="the old holder's commitment after the task was leased again",
    )
