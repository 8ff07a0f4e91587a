"""Leasing tasks for concurrent pulls, many in one transaction (:class:`PullBatcher`)."""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from rollnet.ledger import artifacts, idempotency, nodes, tasks
from rollnet.ledger.batching import AGAIN, Batcher, OnFailure
from rollnet.ledger.nonces import NonceKey, replayed_calls
from rollnet.ledger.tasks import LeasedTask
from rollnet.reference.coordinator.context import (
    CoordinatorContext,
    IdempotencyScope,
    StoredResponse,
)
from rollnet.reference.coordinator.refusal import Refusal
from rollnet.reference.coordinator.serde import capabilities_from_db, lease_to_proto, task_to_proto
from rollnet.reference.coordinator.standing import Caller, refuse_unusable
from rollnet.sdk.errors import ErrorReason
from rollnet.v1 import task_pb2, task_service_pb2

log = logging.getLogger("rollnet.coordinator")


def _lease_response(leased: LeasedTask, now: datetime) -> task_service_pb2.PullTaskResponse:
    lease = lease_to_proto(leased.lease_id, leased.fencing_token, leased.lease_deadline, now)
    return task_service_pb2.PullTaskResponse(
        task=task_to_proto(leased, state=task_pb2.Task.STATE_LEASED, attempt=leased.fencing_token),
        lease=lease,
    )


@dataclass(frozen=True, slots=True)
class NoTask:
    """A pull that leased nothing, and the filters its long poll waits on."""

    environments: tuple[str, ...] | None
    min_checkpoint_step: int | None


@dataclass(slots=True)
class _PendingPull:
    caller: Caller
    #: The environments the pull asked for (``None``: the node's capabilities decide).
    environments: tuple[str, ...] | None
    scope: IdempotencyScope | None
    future: asyncio.Future[task_service_pb2.PullTaskResponse | NoTask] | None = None
    #: The call's nonce, recorded in the batch's transaction (first try of a long poll only).
    nonce: NonceKey | None = None


class PullBatcher(Batcher[_PendingPull]):
    """Leases for concurrent pulls, many in one transaction.

    On SQLite every write goes through the one writer thread, where each pull used to be a call
    of its own: its savepoint, its request-id look-up, its node's standing, the latest step, its
    held leases, a candidate, the lease, its answer's record. Pulls that arrive while a batch is
    being written now wait and go together in the next one (a lone pull is written at once):
    one look-up of their request ids, one read of their nodes, one of their held leases, one
    candidate query per environment filter, and then one UPDATE and one record per lease.
    Each pull still gets its own answer: a refusal, a replayed answer, a lease or nothing.
    The queue is a :class:`~rollnet.ledger.batching.Batcher` without a gather delay that skips
    pulls whose callers left (a lease taken for one would count against its node's cap until it
    expired) and, should a batch's transaction fail, tries each pull again alone, so that one
    pull's failure (a constraint it breaks, say) reaches its own caller only.

    On PostgreSQL writes run in parallel on a few threads and each pull stays a transaction of
    its own (a batch would lock many node rows at once, against heartbeat batches that lock
    them in another order).
    """

    noun = "pulls"
    log = log

    def __init__(self, ctx: CoordinatorContext, *, max_batch: int = 256) -> None:
        super().__init__(max_batch=max_batch, on_failure=OnFailure.EACH_ALONE, skip_abandoned=True)
        self.ctx = ctx

    @property
    def pulls(self) -> int:
        """Pulls carried by the transactions sent to lease (tests and metrics)."""
        return self.items

    async def lease(
        self,
        caller: Caller,
        environments: tuple[str, ...] | None,
        scope: IdempotencyScope | None,
        nonce: NonceKey | None = None,
    ) -> task_service_pb2.PullTaskResponse | NoTask:
        """Lease a task for one pull: its response (with a lease), or :class:`NoTask`.

        Raises the pull's :class:`Refusal` (``NONCE_REPLAYED`` when ``nonce``, recorded in the
        batch's transaction, was recorded before), or :class:`StoredResponse` when its request
        id was answered before.
        """
        pending = _PendingPull(caller, environments, scope, nonce=nonce)
        if self.ctx.group_commit is None:
            (outcome,) = await self._outcomes([pending])
            return _settled(outcome)
        pending.future = asyncio.get_running_loop().create_future()
        self._enqueue(pending)
        return await pending.future

    def _requeued(self, item: _PendingPull) -> None:
        item.nonce = None  # recorded with the batch that committed

    async def _batch_outcomes(self, batch: list[_PendingPull]) -> list[Any]:
        return await self._lease_batch(batch)

    async def _lease_batch(self, batch: list[_PendingPull]) -> list[Any]:
        """The outcomes of a batch taken from the queue."""
        return await self._outcomes(batch)

    async def _commit(self, batch: list[_PendingPull]) -> list[Any]:
        # The batch handles its pulls' request ids itself (scoped=False).
        return await self.ctx.run_in_transaction(
            functools.partial(self._work, batch=batch), scoped=False
        )

    def _work(self, session: Session, batch: list[_PendingPull]) -> list[Any]:
        """Every pull's outcome: a response, :class:`NoTask`, an exception, or ``AGAIN`` (a pull
        whose request id another pull of the batch carries: tried again in the next batch, where
        the first one's record answers it)."""
        for pending in batch:
            if pending.scope is not None:
                # Nothing of this transaction is recorded yet; a batch (or a group commit) that
                # failed before runs this again with its records rolled back.
                pending.scope.stored = False
        config = self.ctx.config
        outcomes: list[Any] = [None] * len(batch)
        # The pulls' nonces first: a replayed pull leases nothing and hears no stored answer.
        replays = replayed_calls(session, [pending.nonce for pending in batch])
        repeats = _answer_repeats(session, batch, outcomes)
        for index in replays:
            outcomes[index] = Refusal(ErrorReason.NONCE_REPLAYED, "nonce already used by this key")
        asking = [index for index, outcome in enumerate(outcomes) if outcome is None]
        standings = nodes.get_standings(session, {batch[i].caller.node_id for i in asking})
        latest = artifacts.latest_checkpoint_step(session)
        min_step = tasks.oldest_leasable_step(latest, config.async_level)
        requests: list[tasks.LeaseRequest] = []
        leasing: list[int] = []
        for index in asking:
            pending = batch[index]
            row = standings.get(pending.caller.node_id)
            try:
                if row is None:
                    raise Refusal(ErrorReason.UNKNOWN_KEY, "node is not registered")
                refuse_unusable(row)
                caps = capabilities_from_db(row.capabilities)
            except Exception as error:  # this pull's alone: the others' go on
                outcomes[index] = error
                continue
            environments = pending.environments or (tuple(sorted(caps.environments)) or None)
            cap = min(
                caps.max_concurrent_leases or config.max_leases_per_node, config.max_leases_per_node
            )
            requests.append(tasks.LeaseRequest(pending.caller.node_id, environments, cap))
            leasing.append(index)
        now = self.ctx.clock()
        leased = tasks.lease_tasks(
            session,
            requests,
            now=now,
            lease_duration=config.lease_duration,
            min_checkpoint_step=min_step,
        )
        for index, request, task in zip(leasing, requests, leased, strict=True):
            if task is None:
                outcomes[index] = NoTask(request.environments, min_step)
                continue
            # Built here, in the lease's transaction, so that a pull with a request id has its
            # answer recorded in that same transaction (not a second one).
            response = _lease_response(task, now)
            scope = batch[index].scope
            if scope is not None:
                scope.store(session, response, now)
            outcomes[index] = response
        for index, first in repeats.items():
            # A second pull with the first one's request id hears what the first one recorded,
            # as a retry would (the replay compares the two requests' digests). After a refusal
            # or no task nothing was recorded: it goes again, in the next batch.
            answer = outcomes[first]
            scope = batch[first].scope
            if isinstance(answer, StoredResponse):
                outcomes[index] = StoredResponse(answer.payload)
            elif isinstance(answer, task_service_pb2.PullTaskResponse) and scope is not None:
                outcomes[index] = StoredResponse(scope.record_of(answer))
        return outcomes


def _answer_repeats(
    session: Session, batch: list[_PendingPull], outcomes: list[Any]
) -> dict[int, int]:
    """Look up the batch's request ids (one read per method): a pull answered before gets
    :class:`StoredResponse`. A pull whose request id an earlier pull of the batch carries is
    set to go again; returned: its index, to the index of that earlier pull."""
    first: dict[tuple[str, str, str], int] = {}
    repeats: dict[int, int] = {}
    for index, pending in enumerate(batch):
        scope = pending.scope
        # Every scoped pull is looked up, whether or not an earlier try of its long poll was:
        # another call with its request id may have leased and recorded since.
        if scope is None:
            continue
        key = (scope.method, scope.caller_id, scope.request_id)
        if key in first:
            outcomes[index] = AGAIN
            repeats[index] = first[key]
        else:
            first[key] = index
    for method in {method for method, _, _ in first}:
        ours = {
            (caller, request_id): i for (m, caller, request_id), i in first.items() if m == method
        }
        for pair, payload in idempotency.lookup_many(session, method, ours).items():
            outcomes[ours[pair]] = StoredResponse(payload)
    return repeats


def has_work(filters: NoTask, session: Session) -> bool:
    """Whether a queued task matches the filters a pull that leased nothing waits on."""
    return tasks.has_queued_task(
        session,
        environments=filters.environments,
        min_checkpoint_step=filters.min_checkpoint_step,
    )


def _settled(outcome: Any) -> task_service_pb2.PullTaskResponse | NoTask:
    if isinstance(outcome, BaseException):
        raise outcome
    assert outcome is not AGAIN, "a pull alone in its batch is never sent again"
    return outcome  # type: ignore[no-any-return]
