"""Seeds cannot be re-rolled, give-backs leave a trace, and copies of committed rollouts are
refused (docs/verification.md, "Seeds are the task's" and "Copies across identities")."""

from __future__ import annotations

import time

import pytest
from coordinator_testing import (
    Work,
    judge_next_job,
    make_work,
    publish_checkpoint,
    pull,
    register,
    request_tasks,
    running_parties,
    upload_and_commit,
)
from sqlalchemy import select
from sqlalchemy.orm import Session

from rollnet.ledger import tasks
from rollnet.ledger.attempts import attempts_of_node, attempts_of_task
from rollnet.ledger.enums import AttemptOutcome, TaskState
from rollnet.ledger.models import RolloutFingerprint
from rollnet.reference.coordinator.config import CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.copies import COPY_LOGPROB_MAX
from rollnet.reference.coordinator.server import Coordinator, start_coordinator
from rollnet.sdk import ErrorReason, Identity, RollnetClient, RollnetError
from rollnet.sdk.testing import NETWORK_ID, connect
from rollnet.sdk.worker.lease import LeaseContext
from rollnet.v1 import common_pb2, rollout_pb2, task_service_pb2

GIVE_BACKS = 3
#: A completion whose claimed log-probability is far below the copy threshold.
IMPROBABLE = [40, 41, 42, 43, 44, 45, 0]
IMPROBABLE_LOGPROBS = [-4.0] * len(IMPROBABLE)


def _config(config: CoordinatorConfig) -> CoordinatorConfig:
    return with_overrides(config, max_attempts=2 * GIVE_BACKS + 4)


async def _started(config: CoordinatorConfig) -> Coordinator:
    return await start_coordinator(_config(config))


def _seeds(
    client: RollnetClient, worker: Identity, pulled: task_service_pb2.PullTaskResponse
) -> list[int]:
    """The seeds the SDK's worker runtime samples this lease's rollouts with."""
    lease = LeaseContext(
        task=pulled.task,
        lease=pulled.lease,
        network_id=NETWORK_ID,
        node_id=worker.node_id,
        client=client,
        deadline=time.monotonic() + 60,
    )
    return [lease.sampling_seed(i) for i in range(lease.rollout_count)]


async def _give_back(client: RollnetClient, pulled: task_service_pb2.PullTaskResponse) -> None:
    response = await client.tasks.fail_task(
        task_service_pb2.FailTaskRequest(
            lease_id=pulled.lease.lease_id,
            fencing_token=pulled.lease.fencing_token,
            reason=task_service_pb2.FAIL_REASON_BACKEND_ERROR,
            message="out of memory (test)",
        )
    )
    assert response.requeued


async def test_give_backs_keep_the_seeds_and_are_recorded(
    coordinator_config: CoordinatorConfig, trainer_identity: Identity
) -> None:
    coordinator = await _started(coordinator_config)
    shopper, other = Identity.generate(), Identity.generate()
    trainer = connect(coordinator.address, trainer_identity)
    client = connect(coordinator.address, shopper)
    other_client = connect(coordinator.address, other)
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        await register(client, shopper, common_pb2.ROLE_WORKER)
        await register(other_client, other, common_pb2.ROLE_WORKER)
        await publish_checkpoint(trainer, trainer_identity, step=1)
        [task_id] = await request_tasks(trainer, 1, samples_per_prompt=4)

        seen: list[list[int]] = []
        leases: list[str] = []
        for _ in range(GIVE_BACKS):
            pulled = await pull(client)
            assert pulled.task.task_id == task_id
            seen.append(_seeds(client, shopper, pulled))
            leases.append(pulled.lease.lease_id)
            await _give_back(client, pulled)
        # The same node again, then a second node: the same seeds every time.
        pulled = await pull(client)
        seen.append(_seeds(client, shopper, pulled))
        await _give_back(client, pulled)
        leases.append(pulled.lease.lease_id)
        second = await pull(other_client)
        assert second.task.task_id == task_id
        assert second.lease.fencing_token == GIVE_BACKS + 2
        seen.append(_seeds(other_client, other, second))
        assert len(set(map(tuple, seen))) == 1, seen
        assert len(set(seen[0])) == 4  # one seed per rollout, all different

        def read(session: Session) -> tuple[list[tuple[object, ...]], dict[AttemptOutcome, int]]:
            rows: list[tuple[object, ...]] = [
                (a.node_id, a.lease_id, a.fencing_token, a.outcome, a.reason, a.detail)
                for a in attempts_of_task(session, task_id)
            ]
            return rows, attempts_of_node(session, shopper.node_id)

        rows, by_outcome = await coordinator.ctx.run_read(read)
        assert rows == [
            (
                shopper.node_id,
                lease,
                token,
                AttemptOutcome.GIVEN_BACK,
                "FAIL_REASON_BACKEND_ERROR",
                "out of memory (test)",
            )
            for token, lease in enumerate(leases, start=1)
        ]
        assert by_outcome == {AttemptOutcome.GIVEN_BACK: GIVE_BACKS + 1}
        metric = coordinator.ctx.metrics.registry.get_sample_value(
            "rollnet_task_attempts_ended_total",
            {"node": shopper.node_id, "outcome": "given_back"},
        )
        assert metric == GIVE_BACKS + 1
    finally:
        for c in (trainer, client, other_client):
            await c.close()
        await coordinator.stop(grace=0.5)


def _with_completion(work: Work, index: int, completion: list[int], logprobs: list[float]) -> Work:
    """``work`` with rollout ``index``'s completion replaced (the batch re-serialized)."""
    rollout = work.rollouts[index]
    del rollout.completion_token_ids[:]
    rollout.completion_token_ids.extend(completion)
    del rollout.behaviour_logprobs[:]
    rollout.behaviour_logprobs.extend(logprobs)
    batch = rollout_pb2.RolloutBatch.FromString(work.batch)
    del batch.rollouts[:]
    batch.rollouts.extend(work.rollouts)
    work.batch = batch.SerializeToString()
    return work


async def _lease(client: RollnetClient) -> task_service_pb2.PullTaskResponse:
    pulled = await pull(client)
    assert pulled.HasField("task"), "a task was queued"
    return pulled


async def _refused(client: RollnetClient, worker: Identity, work: Work) -> RollnetError:
    with pytest.raises(RollnetError) as refused:
        await upload_and_commit(client, worker, work)
    return refused.value


async def test_copies_are_refused_and_honest_repeats_are_not(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    validator_identity: Identity,
) -> None:
    assert sum(IMPROBABLE_LOGPROBS) <= COPY_LOGPROB_MAX
    coordinator = await _started(coordinator_config)
    original, copier, third = Identity.generate(), Identity.generate(), Identity.generate()
    trainer = connect(coordinator.address, trainer_identity)
    validator = connect(coordinator.address, validator_identity)
    clients = {w.node_id: connect(coordinator.address, w) for w in (original, copier, third)}
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        await register(validator, validator_identity, common_pb2.ROLE_VALIDATOR)
        for worker in (original, copier, third):
            await register(clients[worker.node_id], worker, common_pb2.ROLE_WORKER)
        await publish_checkpoint(trainer, trainer_identity, step=1)
        await request_tasks(trainer, 3, samples_per_prompt=2)
        a, b, c = (clients[w.node_id] for w in (original, copier, third))

        # The original commits an improbable completion as rollout 1.
        first = await _lease(a)
        work = _with_completion(
            make_work(original, first.task, first.lease), 1, IMPROBABLE, IMPROBABLE_LOGPROBS
        )
        committed = await upload_and_commit(a, original, work)
        original_id = committed.commitment.commitment_id

        # Another node commits the same completion (another task, another prompt): a copy.
        second = await _lease(b)
        copy = _with_completion(
            make_work(copier, second.task, second.lease), 0, IMPROBABLE, [-0.01] * 7
        )
        refused = await _refused(b, copier, copy)
        assert refused.reason == ErrorReason.ROLLOUT_DUPLICATE
        assert "rollouts[0]" in refused.message
        assert f"rollout 1 of commitment {original_id}" in refused.message

        # Its lease was taken back and recorded; the task is queued again, with its seeds.
        def taken_back(session: Session) -> tuple[list[tuple[str, AttemptOutcome]], TaskState]:
            row = tasks.get_task(session, second.task.task_id)
            assert row is not None
            ended = attempts_of_task(session, second.task.task_id)
            return [(x.node_id, x.outcome) for x in ended], row.state

        assert await coordinator.ctx.run_read(taken_back) == (
            [(copier.node_id, AttemptOutcome.DUPLICATE)],
            TaskState.QUEUED,
        )
        again = await _lease(b)

        # The same improbable completion twice in one batch (sample reuse) is a copy too.
        reused = make_work(copier, again.task, again.lease)
        for index in (0, 1):
            _with_completion(reused, index, [50, 51, 52, 53, 54, 0], [-5.0] * 6)
        refused = await _refused(b, copier, reused)
        assert refused.reason == ErrorReason.ROLLOUT_DUPLICATE
        assert "rollouts[1] repeats rollout 0 of this batch" in refused.message

        # Probable completions repeat honestly (make_work's are identical everywhere).
        honest = await _lease(b)
        await upload_and_commit(b, copier, make_work(copier, honest.task, honest.lease))

        # Once the original is rejected, its completion no longer counts as committed: the
        # rejected task's fresh copy (and anyone) may produce it honestly.
        verdict = await judge_next_job(validator, accept=False, reason="TOKEN_NOT_SAMPLED")
        assert verdict.verdict.commitment_id == original_id
        rejected = await coordinator.ctx.run_read(
            lambda s: [
                (x.node_id, x.outcome, x.reason) for x in attempts_of_task(s, first.task.task_id)
            ]
        )
        assert rejected == [(original.node_id, AttemptOutcome.REJECTED, "TOKEN_NOT_SAMPLED")]
        fresh = await _lease(c)
        repeat = _with_completion(
            make_work(third, fresh.task, fresh.lease), 0, IMPROBABLE, IMPROBABLE_LOGPROBS
        )
        await upload_and_commit(c, third, repeat)

        def prints(session: Session) -> int:
            return len(session.scalars(select(RolloutFingerprint)).all())

        assert await coordinator.ctx.run_read(prints) == 2 + 2 + 2  # three commitments
    finally:
        for client in (trainer, validator, *clients.values()):
            await client.close()
        await coordinator.stop(grace=0.5)


@pytest.mark.slow
async def test_a_task_re_leased_after_a_give_back_is_not_a_copy(
    coordinator_config: CoordinatorConfig, trainer_identity: Identity
) -> None:
    # Give-backs store nothing: the next holder's honest rollouts (the same seeds, so possibly
    # the same improbable completions) are never refused as copies of the first holder's.
    coordinator = await _started(coordinator_config)
    first, second = Identity.generate(), Identity.generate()
    trainer = connect(coordinator.address, trainer_identity)
    one, two = connect(coordinator.address, first), connect(coordinator.address, second)
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        for client, worker in ((one, first), (two, second)):
            await register(client, worker, common_pb2.ROLE_WORKER)
        await publish_checkpoint(trainer, trainer_identity, step=1)
        await request_tasks(trainer, 1, samples_per_prompt=1)
        pulled = await _lease(one)
        await _give_back(one, pulled)
        again = await _lease(two)
        assert again.task.task_id == pulled.task.task_id
        work = _with_completion(
            make_work(second, again.task, again.lease), 0, IMPROBABLE, IMPROBABLE_LOGPROBS
        )
        response = await upload_and_commit(two, second, work)
        assert response.commitment.task_id == pulled.task.task_id
    finally:
        for client in (trainer, one, two):
            await client.close()
        await coordinator.stop(grace=0.5)


async def test_seeds_other_than_the_tasks_are_refused_at_intake(
    coordinator_config: CoordinatorConfig, trainer_identity: Identity
) -> None:
    # Unchecked work is credited, so the coordinator checks the seeds itself: a worker on the
    # former lease-derived rule (or choosing its own) is refused, told the expected derivation.
    async with running_parties(_config(coordinator_config), trainer_identity) as parties:
        trainer, client, worker = parties.trainer, parties.client, parties.worker
        await request_tasks(trainer, 1, samples_per_prompt=2)
        pulled = await _lease(client)
        work = make_work(worker, pulled.task, pulled.lease)
        expected = work.rollouts[1].sampling_seed
        work.rollouts[1].sampling_seed = expected ^ 1
        batch = rollout_pb2.RolloutBatch.FromString(work.batch)
        batch.rollouts[1].sampling_seed = expected ^ 1
        work.batch = batch.SerializeToString()
        refused = await _refused(client, worker, work)
        assert refused.reason == ErrorReason.ROLLOUT_BATCH_INVALID
        assert f"rollouts[1].sampling_seed is not the task's seed {expected}" in refused.message
        assert "rollnet/v1/task-sampling-seed" in refused.message
