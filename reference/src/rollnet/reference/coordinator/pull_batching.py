"""Leasing tasks for concurrent pulls, many in one transaction (:class:`PullBatcher`)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from rollnet.ledger import artifacts, idempotency, nodes, tasks
from rollnet.ledger.nonces import NonceKey, claim_nonces
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


#: Outcome of a pull whose request id another pull of the same batch carries: it is retried in
#: the next batch, where the first one's record answers it.
_AGAIN = object()
#: Outcome of a pull whose caller went away before it could be tried again (nobody to answer).
_GONE = object()


class PullBatcher:
    """Leases for concurrent pulls, many in one transaction.

    On SQLite every write goes through the one writer thread, where each pull used to be a call
    of its own: its savepoint, its request-id look-up, its node's standing, the latest step, its
    held leases, a candidate, the lease, its answer's record. Pulls that arrive while a batch is
    being written now wait and go together in the next one (a lone pull is written at once):
    one look-up of their request ids, one read of their nodes, one of their held leases, one
    candidate query per environment filter, and then one UPDATE and one record per lease.
    Each pull still gets its own answer: a refusal, a replayed answer, a lease or nothing.

    On PostgreSQL writes run in parallel on a few threads and each pull stays a transaction of
    its own (a batch would lock many node rows at once, against heartbeat batches that lock
    them in another order).
    """

    def __init__(self, ctx: CoordinatorContext, *, max_batch: int = 256) -> None:
        self.ctx = ctx
        self.max_batch = max_batch
        self._queue: asyncio.Queue[_PendingPull] = asyncio.Queue()
        self._runner: asyncio.Task[None] | None = None
        #: Transactions sent to lease for pulls, and the pulls they carried (tests and metrics).
        self.batches = 0
        self.pulls = 0
        #: Pulls tried again alone after their batch's transaction failed.
        self.retried = 0

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
            self._count([pending])
            (outcome,) = await self._write([pending])
            return _settled(outcome)
        loop = asyncio.get_running_loop()
        if self._runner is None or self._runner.done():
            # A context of its own: the runner must not carry the first caller's request id.
            self._runner = loop.create_task(self._run(), context=contextvars.Context())
        pending.future = loop.create_future()
        self._queue.put_nowait(pending)
        return await pending.future

    def _count(self, batch: list[_PendingPull]) -> None:
        # Counted on the event loop, when the batch goes to the writer (threads may not race).
        self.batches += 1
        self.pulls += len(batch)

    def _count_each(self, batch: list[_PendingPull]) -> None:
        self.batches += len(batch)
        self.pulls += len(batch)
        self.retried += len(batch)

    async def close(self) -> None:
        """Stop batching; pulls still queued are cancelled."""
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        while not self._queue.empty():
            future = self._queue.get_nowait().future
            if future is not None:
                future.cancel()

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            # A pull whose caller went away while it waited leases nothing: a lease taken for it
            # would count against its node's cap until it expired.
            batch = [pending for pending in batch if not _gone(pending)]
            if not batch:
                continue
            try:
                outcomes = await self._lease_batch(batch)
            except asyncio.CancelledError:  # closing: no pull of this batch is left waiting
                for pending in batch:
                    if pending.future is not None:
                        pending.future.cancel()
                raise
            for pending, outcome in zip(batch, outcomes, strict=True):
                future = pending.future
                assert future is not None
                if future.done() or outcome is _GONE:
                    continue  # the caller went away (a lease it took expires unused)
                if outcome is _AGAIN:
                    pending.nonce = None  # recorded with the batch that committed
                    self._queue.put_nowait(pending)
                elif isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)

    async def _lease_batch(self, batch: list[_PendingPull]) -> list[Any]:
        """The batch's outcomes. If its transaction fails, each pull is tried again alone, so
        that one pull's failure (a constraint it breaks, say) reaches its own caller only."""
        self._count(batch)
        try:
            return await self._write(batch)
        except Exception as error:
            if len(batch) == 1:
                return [error]
            log.warning(
                "a batch of %d pulls failed (%s: %s); trying each alone",
                len(batch),
                type(error).__name__,
                error,
            )
        outcomes: list[Any] = [_GONE] * len(batch)
        again = [i for i, pending in enumerate(batch) if not _gone(pending)]
        self._count_each([batch[i] for i in again])
        singles = await asyncio.gather(
            *(self._write([batch[index]]) for index in again), return_exceptions=True
        )
        for index, single in zip(again, singles, strict=True):
            outcomes[index] = single if isinstance(single, BaseException) else single[0]
        return outcomes

    async def _write(self, batch: list[_PendingPull]) -> list[Any]:
        # The batch handles its pulls' request ids itself (scoped=False).
        return await self.ctx.run_in_transaction(
            functools.partial(self._work, batch=batch), scoped=False
        )

    def _work(self, session: Session, batch: list[_PendingPull]) -> list[Any]:
        """Every pull's outcome: a response, :class:`NoTask`, an exception, or ``_AGAIN``."""
        for pending in batch:
            if pending.scope is not None:
                # Nothing of this transaction is recorded yet; a batch (or a group commit) that
                # failed before runs this again with its records rolled back.
                pending.scope.stored = False
        config = self.ctx.config
        outcomes: list[Any] = [None] * len(batch)
        # The pulls' nonces first: a replayed pull leases nothing and hears no stored answer.
        fresh = claim_nonces(session, [p.nonce for p in batch if p.nonce is not None])
        replays = []
        for index, pending in enumerate(batch):
            if pending.nonce is not None:
                if pending.nonce in fresh:
                    fresh.discard(pending.nonce)  # a second one in this batch is its replay
                else:
                    replays.append(index)
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
            outcomes[index] = _AGAIN
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


def _gone(pending: _PendingPull) -> bool:
    return pending.future is not None and pending.future.done()


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
    assert outcome is not _AGAIN, "a pull alone in its batch is never sent again"
    return outcome  # type: ignore[no-any-return]
