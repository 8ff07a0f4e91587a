"""Group commit: one thread runs every write transaction; work queued meanwhile shares one commit.

Callers hand :class:`GroupCommitWriter` a unit of work (a function of a session) and get a
future: :meth:`~GroupCommitWriter.submit` from an event loop (an :class:`asyncio.Future`),
:meth:`~GroupCommitWriter.submit_threadsafe` or :meth:`~GroupCommitWriter.run` from any thread.
The writer thread takes everything queued at that moment (up to ``max_batch``) and runs it in
one transaction, each unit in its own SAVEPOINT, so a unit's failure (any exception, a
``KeyboardInterrupt`` or ``SystemExit`` included) rolls back its own writes only and reaches its
own caller; nobody hears success before the batch's COMMIT has returned. Should the shared
transaction itself fail (a deferred constraint one unit broke, say), the batch runs again in
parts as its :class:`~rollnet.ledger.batching.OnFailure` says (by default each half in a
transaction of its own, down to the unit that fails alone). While a batch commits the next one
accumulates, so batches grow with load while a lone call is never delayed. The thread runs an
event loop of its own, and on it a :class:`~rollnet.ledger.batching.Batcher` (the same steps as
the coordinator's heartbeats and pulls); what this module adds is how callers on any thread or
loop reach it, and how their futures are settled: one wake-up per caller's event loop for a
whole batch. The coordinator runs all its SQLite writes through one; a program that only appends
ledger entries hands it ``lambda session: append_entries(session, [entry])``.

Work may run again after a failed transaction, so it must depend on nothing but its session.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from rollnet.ledger.batching import GONE, AnyFuture, Batcher, OnFailure, settle

T = TypeVar("T")


@dataclass(slots=True)
class _WriteJob:
    work: Callable[[Session], Any]
    loop: asyncio.AbstractEventLoop | None
    """The caller's event loop; ``None`` for a thread's call (a concurrent future)."""
    future: asyncio.Future[Any] | concurrent.futures.Future[Any]


@dataclass(frozen=True, slots=True)
class _Returned:
    """What a unit of work returned: its caller's result, whatever it is (an exception object
    or one of the :class:`~rollnet.ledger.batching.Batcher`'s sentinels, say)."""

    value: Any


def _answer(future: AnyFuture, outcome: Any) -> None:
    if isinstance(outcome, _Returned):
        future.set_result(outcome.value)
    else:  # the exception its unit (or the unit's transaction) failed with
        settle(future, outcome)


def _settle_on_loop(settled: list[tuple[asyncio.Future[Any], Any]]) -> None:
    for future, outcome in settled:
        if not future.cancelled():  # else the caller went away; its work committed all the same
            _answer(future, outcome)


class _Transactions(Batcher[_WriteJob]):
    """The writer's batcher: each batch is one transaction, each unit of work in a savepoint."""

    noun = "calls"

    def __init__(
        self, sessions: sessionmaker[Session], *, max_batch: int, on_failure: OnFailure
    ) -> None:
        super().__init__(max_batch=max_batch, on_failure=on_failure)
        self.sessions = sessions
        #: Transactions committed, and the units of work they carried.
        self.committed = 0
        self.committed_jobs = 0
        #: Calls taken into a batch so far (the writer counts those submitted).
        self.taken = 0

    def queue(self, job: _WriteJob) -> None:
        self._enqueue(job)

    async def _batch_outcomes(self, batch: list[_WriteJob]) -> list[Any]:
        self.taken += len(batch)
        # A thread whose call was cancelled before its batch began is left out; the others'
        # calls can no longer be cancelled. An event loop's caller that went away still has its
        # work run: cancelling an awaiting coroutine does not take back the write it asked for.
        live = [
            job.loop is not None
            or (
                isinstance(job.future, concurrent.futures.Future)
                and job.future.set_running_or_notify_cancel()
            )
            for job in batch
        ]
        if all(live):
            return await self._outcomes(batch)
        ran = iter(await self._outcomes([job for job, ok in zip(batch, live, strict=True) if ok]))
        return [next(ran) if ok else GONE for ok in live]

    def _abandoned(self, job: _WriteJob) -> bool:
        # No call of a batch is left out, not even when its batch is tried again: a thread's
        # call can no longer be cancelled, and an event loop's caller that went away still has
        # its work committed (its future, of another thread's loop, is looked at there).
        return False

    async def _commit(self, batch: list[_WriteJob]) -> list[Any]:
        if not batch:
            return []
        outcomes: list[Any] = []
        try:
            with self.sessions.begin() as session:
                if len(batch) == 1:
                    # Alone in its transaction: a failure rolls the whole of it back.
                    outcomes.append(_Returned(batch[0].work(session)))
                else:
                    for job in batch:
                        try:
                            with session.begin_nested():
                                outcomes.append(_Returned(job.work(session)))
                        except BaseException as error:
                            outcomes.append(error)
        except BaseException as error:
            # A unit's KeyboardInterrupt, SystemExit or CancelledError is its caller's to hear
            # (as from a thread pool), not the writer's to stop on: the runner would die with
            # it, and every caller of its batch (and shutdown()) wait for good.
            if isinstance(error, Exception) or len(batch) > 1:
                # The transaction failed (Batcher._outcomes tries it again in parts), or the
                # shared COMMIT raised a BaseException, which is no one unit's.
                raise
            return [error]
        self.committed += 1
        self.committed_jobs += len(batch)
        return outcomes

    def _settle(self, settled: list[tuple[_WriteJob, Any]]) -> None:
        # One wake-up per event loop for the whole batch, not one per call.
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
        for job, outcome in settled:
            if job.loop is None:
                _answer(job.future, outcome)
            else:
                assert isinstance(job.future, asyncio.Future)
                by_loop.setdefault(job.loop, []).append((job.future, outcome))
        for loop, pairs in by_loop.items():
            # A closed event loop (its caller gone) must not take the writer down with it.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle_on_loop, pairs)

    def _cancel(self, items: Iterable[_WriteJob]) -> None:
        for job in items:
            if job.loop is None:
                job.future.cancel()
            else:
                with contextlib.suppress(RuntimeError):
                    job.loop.call_soon_threadsafe(job.future.cancel)


class GroupCommitWriter:
    """Runs write transactions on one thread, committing concurrent callers' work together
    (thread-safe; see the module docs). ``on_failure`` says how a batch whose transaction failed
    runs again."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        max_batch: int = 256,
        on_failure: OnFailure = OnFailure.SPLIT_IN_HALVES,
    ) -> None:
        self._transactions = _Transactions(sessions, max_batch=max_batch, on_failure=on_failure)
        self._loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._closed = False
        self._submitted = 0
        self._thread = threading.Thread(target=self._serve, name="rollnet-write", daemon=True)
        self._thread.start()

    @property
    def batches(self) -> int:
        """Transactions committed so far (tests, metrics)."""
        return self._transactions.committed

    @property
    def jobs(self) -> int:
        """The units of work those transactions carried."""
        return self._transactions.committed_jobs

    @property
    def backlog(self) -> int:
        """Calls submitted that no transaction has taken yet."""
        taken = self._transactions.taken  # first: a call counts as submitted before it is taken
        return self._submitted - taken

    def submit(self, work: Callable[[Session], T]) -> asyncio.Future[T]:
        """Queue ``work`` from the running event loop; the future resolves once its batch has
        committed (or failed)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._put(_WriteJob(work, loop, future))
        return future

    def submit_threadsafe(self, work: Callable[[Session], T]) -> concurrent.futures.Future[T]:
        """Queue ``work`` from any thread; the future resolves once its batch has committed."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._put(_WriteJob(work, None, future))
        return future

    def run(self, work: Callable[[Session], T], *, timeout: float | None = None) -> T:
        """Queue ``work`` and wait (on this thread) until it is committed; its result."""
        if threading.current_thread() is self._thread:
            # The writer would wait for itself: a unit of work uses the session it was given.
            raise RuntimeError("the database writer's run() called from a unit of work")
        return self.submit_threadsafe(work).result(timeout)

    def shutdown(self, wait: bool = True) -> None:
        """Finish the queued work, then stop the thread; later submissions are refused."""
        with self._lock:
            if not self._closed:
                self._closed = True
                if self._thread.is_alive():
                    asyncio.run_coroutine_threadsafe(self._finish(), self._loop)
        if wait:
            self._thread.join()

    def __enter__(self) -> GroupCommitWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.shutdown()

    def _put(self, job: _WriteJob) -> None:
        with self._lock:
            if self._closed or not self._thread.is_alive():
                raise RuntimeError("the database writer is shut down")
            self._submitted += 1  # before the writer thread can take it (backlog)
            # Callbacks run in the order they were posted: all of these before _finish.
            self._loop.call_soon_threadsafe(self._transactions.queue, job)

    def _serve(self) -> None:
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _finish(self) -> None:
        await self._transactions.drain()
        await self._transactions.close()
        asyncio.get_running_loop().stop()


__all__ = ["GroupCommitWriter"]
