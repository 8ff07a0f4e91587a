"""The queue -> batch -> commit loop that every group commit in rollnet shares.

Callers queue an item and wait on its future; one task takes what is queued (after an optional
gather delay, up to ``max_batch``), commits it as one batch and settles each caller's future with
its own outcome. Should the batch's transaction fail, :class:`OnFailure` says how it is tried
again so that one item's failure reaches its own caller only. Each user keeps its policy: what a
batch commits (:meth:`Batcher._commit`), whether it gathers, whether items whose callers left are
skipped, how it splits after a failure, and how its callers' futures are settled
(:meth:`Batcher._settle`).

:class:`Batcher` runs on an event loop: the coordinator's heartbeats and pulls run one on theirs,
and :class:`~rollnet.ledger.group_commit.GroupCommitWriter` runs one on an event loop of its own
thread, which callers on any thread or loop reach.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import contextlib
import contextvars
import enum
import logging
from collections.abc import Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar

log = logging.getLogger("rollnet.ledger")

T = TypeVar("T")


class OnFailure(enum.Enum):
    """How a batch whose transaction failed is committed again."""

    #: Each half alone, recursively, down to the item that fails by itself: a few transactions
    #: more, one after the other.
    SPLIT_IN_HALVES = "committing each half alone"
    #: Each item alone, all at once, leaving out the items whose callers left
    #: (:meth:`Batcher._abandoned`).
    EACH_ALONE = "trying each alone"

    def parts(self, batch: Sequence[T]) -> list[list[T]]:
        """The batches to commit instead of ``batch`` (of two items or more)."""
        if self is OnFailure.SPLIT_IN_HALVES:
            middle = len(batch) // 2
            return [list(batch[:middle]), list(batch[middle:])]
        return [[item] for item in batch]


#: An outcome asking for the item to be queued again, for the next batch.
AGAIN: Any = object()
#: The outcome of an item whose caller left before it could be tried again (nobody to answer).
GONE: Any = object()


#: What a caller waits on: a future of an event loop, or of a thread.
AnyFuture = asyncio.Future[Any] | concurrent.futures.Future[Any]


class Queued(Protocol):
    """An item of a batch: what its caller waits on (``None``: committed without queueing)."""

    @property
    def future(self) -> AnyFuture | None: ...


Q = TypeVar("Q", bound=Queued)


def abandoned(item: Queued) -> bool:
    """Whether the item's caller went away (its future is settled or cancelled)."""
    return item.future is not None and item.future.done()


def settle(future: AnyFuture, outcome: Any) -> None:
    """Give ``future`` its outcome: an exception is raised to its caller, anything else returned.

    An asyncio future refuses a ``StopIteration`` (with a TypeError, which would leave the
    futures settled after it waiting): its caller gets a RuntimeError caused by it instead, as
    from a coroutine that raised it."""
    if isinstance(outcome, StopIteration) and isinstance(future, asyncio.Future):
        error = RuntimeError("StopIteration raised while committing")
        error.__cause__ = outcome
        outcome = error
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class Batcher(abc.ABC, Generic[Q]):
    """Commits queued items in batches on the running event loop.

    Subclasses implement :meth:`_commit` (one outcome per item: a value, an exception, or
    :data:`AGAIN`) and queue items with :meth:`_enqueue`; ``noun`` names the items in logs.
    Items are settled (:meth:`_settle`) and cancelled (:meth:`_cancel`) on this loop unless a
    subclass whose callers wait elsewhere says how.
    """

    #: What the items are, and where a failed batch is logged.
    noun = "items"
    log = log

    def __init__(
        self,
        *,
        max_batch: int,
        max_delay: float | None = None,
        on_failure: OnFailure = OnFailure.SPLIT_IN_HALVES,
        skip_abandoned: bool = False,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.max_batch = max_batch
        #: How long a batch gathers after its first item (``None``: it takes what is queued).
        self.max_delay = max_delay
        self.on_failure = on_failure
        #: Leave out of a batch the items whose callers left while they waited.
        self.skip_abandoned = skip_abandoned
        self._queue: asyncio.Queue[Q] = asyncio.Queue()
        self._runner: asyncio.Task[None] | None = None
        #: Set while the runner waits on an empty queue: every item queued so far is settled.
        self._idle = asyncio.Event()
        self._idle.set()
        #: Transactions tried, the items they carried, and the items tried again after their
        #: batch's transaction failed (tests and metrics).
        self.batches = 0
        self.items = 0
        self.retried = 0

    @abc.abstractmethod
    async def _commit(self, batch: list[Q]) -> Sequence[Any]:
        """Commit one batch in one transaction: each item's outcome, in order."""

    def _requeued(self, item: Q) -> None:
        """Called before an item whose outcome was :data:`AGAIN` goes back in the queue."""

    def _abandoned(self, item: Q) -> bool:
        """Whether the item's caller went away (:func:`abandoned`): left out of a batch when
        :attr:`skip_abandoned`, of the items tried again alone, and not settled."""
        return abandoned(item)

    def _settle(self, settled: list[tuple[Q, Any]]) -> None:
        """Give each item's caller its outcome (callers still waiting only)."""
        for item, outcome in settled:
            assert item.future is not None
            settle(item.future, outcome)

    def _cancel(self, items: Iterable[Q]) -> None:
        """Cancel the callers of items that will not be committed (closing)."""
        for item in items:
            if item.future is not None:
                item.future.cancel()

    def _enqueue(self, item: Q) -> None:
        if self._runner is None or self._runner.done():
            # A context of its own: the runner must not carry the first caller's request id.
            loop = asyncio.get_running_loop()
            self._runner = loop.create_task(self._run(), context=contextvars.Context())
        self._idle.clear()
        self._queue.put_nowait(item)

    @property
    def backlog(self) -> int:
        """Items waiting for a batch."""
        return self._queue.qsize()

    async def drain(self) -> None:
        """Wait until every item queued so far has been committed and its caller settled."""
        if self._runner is not None and not self._runner.done():
            await self._idle.wait()

    async def close(self) -> None:
        """Stop batching; the callers of items still queued are cancelled (:meth:`drain`
        first to finish them instead)."""
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        queued = []
        while not self._queue.empty():
            queued.append(self._queue.get_nowait())
        self._cancel(queued)
        self._idle.set()

    async def _run(self) -> None:
        while True:
            if self._queue.empty():
                self._idle.set()
            batch = [await self._queue.get()]
            if self.max_delay is not None:
                # Let the batch gather, then take what came (one timer per batch, not a timed
                # wait per item).
                await asyncio.sleep(self.max_delay)
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            if self.skip_abandoned:
                batch = [item for item in batch if not self._abandoned(item)]
                if not batch:
                    continue
            try:
                outcomes = await self._batch_outcomes(batch)
            except asyncio.CancelledError:  # closing: no caller of this batch is left waiting
                self._cancel(batch)
                raise
            settled = []
            for item, outcome in zip(batch, outcomes, strict=True):
                if outcome is GONE or self._abandoned(item):
                    continue  # the caller went away
                if outcome is AGAIN:
                    self._requeued(item)
                    self._queue.put_nowait(item)
                else:
                    settled.append((item, outcome))
            self._settle(settled)

    async def _batch_outcomes(self, batch: list[Q]) -> list[Any]:
        """The outcomes of a batch taken from the queue (a seam for subclasses and tests)."""
        return await self._outcomes(batch)

    async def _outcomes(self, batch: list[Q]) -> list[Any]:
        """Each item's outcome, or the error its transaction failed with: when the batch's
        transaction fails, its parts (:attr:`on_failure`) are committed instead, so an item the
        database refuses fails alone, at the cost of a few more transactions."""
        self.batches += 1
        self.items += len(batch)
        try:
            return list(await self._commit(batch))
        except Exception as error:
            if len(batch) == 1:
                return [error]
            self.log.warning(
                "a batch of %d %s failed (%s: %s); %s",
                len(batch),
                self.noun,
                type(error).__name__,
                error,
                self.on_failure.value,
            )
        if self.on_failure is OnFailure.SPLIT_IN_HALVES:
            outcomes: list[Any] = []
            for part in self.on_failure.parts(batch):
                outcomes += await self._outcomes(part)
            return outcomes
        outcomes = [GONE] * len(batch)
        again = [index for index, item in enumerate(batch) if not self._abandoned(item)]
        self.retried += len(again)
        singles = await asyncio.gather(
            *(self._outcomes(part) for part in self.on_failure.parts([batch[i] for i in again])),
            return_exceptions=True,
        )
        for index, single in zip(again, singles, strict=True):
            outcomes[index] = single if isinstance(single, BaseException) else single[0]
        return outcomes


__all__ = ["AGAIN", "GONE", "AnyFuture", "Batcher", "OnFailure", "Queued", "abandoned", "settle"]
