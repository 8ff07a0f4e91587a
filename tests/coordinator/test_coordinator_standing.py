"""Nodes that may no longer work (ejected, banned, deregistered, taken off an allow-list) are
refused by every work RPC with the reason that says why, and an allow-listed validator's verdict
is checked like any other input."""

from __future__ import annotations

import math
from collections.abc import Awaitable
from pathlib import Path

import grpc
import pytest
from coordinator_testing import (
    commitment_request,
    make_work,
    publish_checkpoint,
    pull,
    register,
    request_tasks,
    running_parties,
    upload_and_commit,
)

from rollnet.ledger import idempotency
from rollnet.reference.coordinator.config import CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.sdk import ErrorReason, Identity, RollnetClient, RollnetError
from rollnet.sdk.testing import connect
from rollnet.v1 import (
    blob_service_pb2,
    commitment_pb2,
    common_pb2,
    ledger_service_pb2,
    node_pb2,
    node_service_pb2,
    task_service_pb2,
    validation_pb2,
    validation_service_pb2,
)

BATCH = blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH


async def _refused(call: Awaitable[object]) -> RollnetError:
    with pytest.raises(RollnetError) as refused:
        await call
    return refused.value


async def _pull_job(validator: RollnetClient) -> validation_service_pb2.PullValidationJobResponse:
    job = await validator.validation.pull_validation_job(
        validation_service_pb2.PullValidationJobRequest()
    )
    assert job.HasField("job")
    return job


def _verdict(
    job: validation_service_pb2.PullValidationJobResponse, **fields: object
) -> validation_service_pb2.SubmitVerdictRequest:
    request = validation_service_pb2.SubmitVerdictRequest(
        job_id=job.job.job_id,
        lease_id=job.lease.lease_id,
        fencing_token=job.lease.fencing_token,
        decision=validation_pb2.Verdict.DECISION_ACCEPT,
        **fields,  # type: ignore[arg-type]
    )
    count = len(job.job.task.prompt_ids) * job.job.task.samples_per_prompt
    if not request.validated_rewards:
        request.validated_rewards.extend([common_pb2.Reward(task_reward=1.0, total=1.0)] * count)
    return request


async def test_ejected_nodes_do_no_more_work_and_verdicts_are_checked(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    validator_identity: Identity,
    operator_identity: Identity,
) -> None:
    coordinator = await start_coordinator(coordinator_config)
    honest, cheat = Identity.generate(), Identity.generate()
    clients = {
        identity.node_id: connect(coordinator.address, identity)
        for identity in (trainer_identity, validator_identity, operator_identity, honest, cheat)
    }
    trainer, validator, operator = (
        clients[i.node_id] for i in (trainer_identity, validator_identity, operator_identity)
    )
    try:
        for identity, role in (
            (trainer_identity, common_pb2.ROLE_TRAINER),
            (validator_identity, common_pb2.ROLE_VALIDATOR),
            (operator_identity, common_pb2.ROLE_OPERATOR),
            (honest, common_pb2.ROLE_WORKER),
            (cheat, common_pb2.ROLE_WORKER),
        ):
            await register(clients[identity.node_id], identity, role)
        await publish_checkpoint(trainer, trainer_identity, step=1)
        await request_tasks(trainer, 2)

        # A worker ejected while it holds a lease: upload, commit and give-back say so.
        worker = clients[cheat.node_id]
        pulled = await pull(worker)
        work = make_work(cheat, pulled.task, pulled.lease)
        uploaded = await worker.blobs.upload(work.batch, BATCH)
        await operator.nodes.eject_node(
            node_service_pb2.EjectNodeRequest(node_id=cheat.node_id, reason="cheating")
        )
        for call in (
            worker.blobs.upload(work.batch + b"more", BATCH),
            worker.commitments.submit_commitment(commitment_request(cheat, work, uploaded.blob)),
            worker.tasks.fail_task(
                task_service_pb2.FailTaskRequest(
                    lease_id=pulled.lease.lease_id, fencing_token=pulled.lease.fencing_token
                )
            ),
        ):
            refused = await _refused(call)
            assert (refused.code, refused.reason) == (
                grpc.StatusCode.PERMISSION_DENIED,
                ErrorReason.NODE_EJECTED,
            ), refused

        # Honest work to judge. An allow-listed validator's verdict is checked all the same.
        honest_client = clients[honest.node_id]
        pulled = await pull(honest_client)
        submitted = await upload_and_commit(
            honest_client, honest, make_work(honest, pulled.task, pulled.lease)
        )
        claimed = submitted.commitment.claimed_work
        job = await _pull_job(validator)
        total = claimed.prefill_tokens + claimed.decode_tokens
        for bad, field in (
            (
                _verdict(job, validated_work=commitment_pb2.WorkClaim(prefill_tokens=total + 1)),
                "validated_work",
            ),
            (
                _verdict(job, validated_work=commitment_pb2.WorkClaim(decode_tokens=2**63)),
                "validated_work.decode_tokens",
            ),
            (
                _verdict(
                    job,
                    checks=[validation_pb2.CheckResult(check="toploc", figures={"x": math.nan})],
                ),
                "not finite",
            ),
            (
                _verdict(job, validated_rewards=[common_pb2.Reward(total=math.inf)] * 4),
                "finite",
            ),
        ):
            refused = await _refused(validator.validation.submit_verdict(bad))
            assert (refused.code, refused.reason) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                ErrorReason.INVALID_FIELDS,
            ), refused
            assert field in refused.message

        # The validator ejected while it holds the job: no verdict, no new job.
        await operator.nodes.eject_node(
            node_service_pb2.EjectNodeRequest(node_id=validator_identity.node_id, reason="broken")
        )
        for attempt in (
            validator.validation.submit_verdict(_verdict(job)),
            validator.validation.pull_validation_job(
                validation_service_pb2.PullValidationJobRequest()
            ),
        ):
            refused = await _refused(attempt)
            assert refused.reason == ErrorReason.NODE_EJECTED, refused
        balance = await honest_client.ledger.get_balance(
            ledger_service_pb2.GetBalanceRequest(node_id=honest.node_id)
        )
        assert (balance.credited, balance.slashed) == (0, 0), "nobody judged it"
        # A deregistered worker's uploads are refused at once.
        await honest_client.nodes.deregister_node(node_service_pb2.DeregisterNodeRequest())
        refused = await _refused(honest_client.blobs.upload(b"after leaving", BATCH))
        assert refused.reason == ErrorReason.NODE_DEREGISTERED, refused
    finally:
        for client in clients.values():
            await client.close()
        await coordinator.stop(grace=0.5)


async def test_a_validator_taken_off_the_allow_list_is_refused_after_a_restart(
    coordinator_config: CoordinatorConfig, validator_identity: Identity
) -> None:
    coordinator = await start_coordinator(coordinator_config)
    validator = connect(coordinator.address, validator_identity)
    try:
        await register(validator, validator_identity, common_pb2.ROLE_VALIDATOR)
    finally:
        await validator.close()
        await coordinator.stop(grace=0.5)

    restarted = await start_coordinator(with_overrides(coordinator_config, validators=frozenset()))
    validator = connect(restarted.address, validator_identity)
    try:
        refused = await _refused(
            validator.validation.pull_validation_job(
                validation_service_pb2.PullValidationJobRequest()
            )
        )
        assert (refused.code, refused.reason) == (
            grpc.StatusCode.PERMISSION_DENIED,
            ErrorReason.ROLE_NOT_PERMITTED,
        )
        assert "no longer on the coordinator's validator allow-list" in refused.message
    finally:
        await validator.close()
        await restarted.stop(grace=0.5)


async def test_a_retry_racing_its_first_verdict_gets_the_first_answer(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    validator_identity: Identity,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On PostgreSQL a retry (same request id) sent while the first call is in flight waits on
    its row locks and finds the job done: it must get the first call's answer, not a refusal."""
    async with running_parties(coordinator_config, trainer_identity, validator_identity) as parties:
        trainer, validator = parties.trainer, parties.validator
        worker, worker_identity = parties.client, parties.worker
        await request_tasks(trainer, 1)
        pulled = await pull(worker)
        await upload_and_commit(
            worker, worker_identity, make_work(worker_identity, pulled.task, pulled.lease)
        )
        job = await _pull_job(validator)
        request = _verdict(job, request_id="verdict-1")
        first = await validator.validation.submit_verdict(request)
        # The retry's own look-up ran before the first call committed: it saw no record.
        real_lookup = idempotency.lookup
        blind = [True]

        def lookup(*args: object) -> bytes | None:
            if blind[0]:
                blind[0] = False
                return None
            return real_lookup(*args)  # type: ignore[arg-type]

        monkeypatch.setattr(idempotency, "lookup", lookup)
        again = await validator.validation.submit_verdict(request)
        assert not blind[0], "the retry took the racing path"
        assert again.verdict.verdict_id == first.verdict.verdict_id


async def _clean_restart_uploads_at_once(
    leave: RollnetClient, come_back: RollnetClient, work: RollnetClient, worker: Identity
) -> None:
    """Deregister through ``leave``; ``work`` caches the DEREGISTERED state (an upload is
    refused); register again through ``come_back``: ``work`` accepts an upload at once."""
    await register(leave, worker, common_pb2.ROLE_WORKER)
    await leave.nodes.deregister_node(node_service_pb2.DeregisterNodeRequest())
    refused = await _refused(work.blobs.upload(b"while away", BATCH))
    assert refused.reason == ErrorReason.NODE_DEREGISTERED, refused
    again = await register(come_back, worker, common_pb2.ROLE_WORKER)
    assert again.node.state == node_pb2.Node.STATE_PENDING
    uploaded = await work.blobs.upload(b"back at work", BATCH)
    assert uploaded.blob.size == len(b"back at work")


async def test_a_clean_worker_restart_uploads_at_once(
    coordinator_config: CoordinatorConfig,
) -> None:
    """Registration refreshes the key state cached by an earlier call (issue 17, item 9: the
    upload was refused NODE_DEREGISTERED for the key cache's 30 s)."""
    coordinator = await start_coordinator(coordinator_config)
    worker = Identity.generate()
    client = connect(coordinator.address, worker)
    try:
        await _clean_restart_uploads_at_once(client, client, client, worker)
    finally:
        await client.close()
        await coordinator.stop(grace=0.5)


@pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_worker_registered_on_another_replica_uploads_at_once(
    coordinator_config: CoordinatorConfig, tmp_path: Path
) -> None:
    """A replica whose cache says DEREGISTERED reads the state again before it refuses, so a
    node that registered again through another replica is not refused there either."""
    replicas = [
        await start_coordinator(with_overrides(coordinator_config, data_dir=tmp_path / name))
        for name in ("replica-a", "replica-b")
    ]
    worker = Identity.generate()
    clients = [connect(r.address, worker) for r in replicas]
    try:
        await _clean_restart_uploads_at_once(clients[0], clients[1], clients[0], worker)
    finally:
        for client in clients:
            await client.close()
        for replica in replicas:
            await replica.stop(grace=0.5)
