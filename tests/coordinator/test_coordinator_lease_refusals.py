"""Using a lease after its deadline is LEASE_EXPIRED whether or not the sweep has requeued its
task yet (it was LEASE_CLOSED once requeued); a lease given back before its deadline is
LEASE_CLOSED; ReportProgress and FailTask name a lease by its id alone."""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import timedelta

import grpc
import pytest
from coordinator_testing import (
    commitment_request,
    make_work,
    pull,
    request_tasks,
    running_parties,
)
from google.protobuf.message import Message

from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.reference.coordinator.server import sweep_once
from rollnet.sdk import ErrorReason, Identity, RollnetError
from rollnet.v1 import blob_service_pb2, task_service_pb2


async def _refusal(call: object) -> RollnetError:
    with pytest.raises(RollnetError) as refused:
        await call  # type: ignore[misc]
    return refused.value


async def test_a_lease_past_its_deadline_is_expired_before_and_after_the_sweep(
    coordinator_config: CoordinatorConfig, trainer_identity: Identity
) -> None:
    async with running_parties(coordinator_config, trainer_identity) as parties:
        coordinator, trainer = parties.coordinator, parties.trainer
        client, worker = parties.client, parties.worker
        await request_tasks(trainer, 2)
        leased = await pull(client)
        work = make_work(worker, leased.task, leased.lease)
        uploaded = await client.blobs.upload(work.batch, blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH)
        lease = leased.lease

        progress = task_service_pb2.ReportProgressRequest(
            lease_id=lease.lease_id, fencing_token=lease.fencing_token
        )
        give_back = task_service_pb2.FailTaskRequest(
            lease_id=lease.lease_id,
            fencing_token=lease.fencing_token,
            reason=task_service_pb2.FAIL_REASON_DEADLINE,
        )
        real_clock = coordinator.ctx.clock
        later = real_clock() + coordinator.ctx.config.lease_duration + timedelta(seconds=1)
        coordinator.ctx.clock = lambda: later
        # Past the deadline, before the sweep: committing or reporting progress is too late.
        too_late: tuple[Awaitable[Message], ...] = (
            client.commitments.submit_commitment(commitment_request(worker, work, uploaded.blob)),
            client.tasks.report_progress(progress),
        )
        for use in too_late:
            refused = await _refusal(use)
            assert refused.code == grpc.StatusCode.FAILED_PRECONDITION, refused
            assert refused.reason == ErrorReason.LEASE_EXPIRED, refused
        # After the sweep requeued it (it was LEASE_CLOSED then), the same, FailTask too.
        await sweep_once(coordinator.ctx)
        too_late = (
            client.commitments.submit_commitment(commitment_request(worker, work, uploaded.blob)),
            client.tasks.report_progress(progress),
            client.tasks.fail_task(give_back),
        )
        for use in too_late:
            refused = await _refusal(use)
            assert refused.code == grpc.StatusCode.FAILED_PRECONDITION, refused
            assert refused.reason == ErrorReason.LEASE_EXPIRED, refused
        coordinator.ctx.clock = real_clock

        # Given back before its deadline, a lease is closed, not expired.
        other = await pull(client)
        await client.tasks.fail_task(
            task_service_pb2.FailTaskRequest(
                lease_id=other.lease.lease_id,
                fencing_token=other.lease.fencing_token,
                reason=task_service_pb2.FAIL_REASON_DEADLINE,
            )
        )
        refused = await _refusal(
            client.tasks.report_progress(
                task_service_pb2.ReportProgressRequest(
                    lease_id=other.lease.lease_id, fencing_token=other.lease.fencing_token
                )
            )
        )
        assert refused.reason == ErrorReason.LEASE_CLOSED, refused
