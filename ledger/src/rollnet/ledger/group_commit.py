"""Group commit: one thread runs every write transaction; work queued meanwhile shares one commit.

Callers hand :class:`GroupCommitWriter` a unit of work (a function of a session) and get a
future: :meth:`~GroupCommitWriter.submit` from an event loop (an :class:`asyncio.Future`),
:meth:`~GroupCommitWriter.submit_threadsafe` or :meth:`~GroupCommitWriter.run` from any thread.
The writer thread takes everything queued at that moment (up to ``max_batch``) and runs it in
one transaction, each unit in its own SAVEPOINT, so a unit's failure rolls back its own writes
only; nobody hears success before the batch's COMMIT has returned. Should the shared transaction
itself fail (a deferred constraint one unit broke, say), the batch runs again in parts as its
:class:`~rollnet.ledger.batching.OnFailure` says (by default each half in a transaction of its
own, down to the unit that fails alone). While a batch commits the next one accumulates, so
batches grow with load while a lone call is never delayed. These are the steps of the event-loop
:class:`~rollnet.ledger.batching.Batcher`, run on a thread that callers on any thread or loop
reach. The coordinator runs all its SQLite writes through one; a program that only appends
ledger entries hands it ``lambda session: append_entries(session, [entry])``.

Work may run again after a failed transaction, so it must depend on nothing but its session.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from rollnet.ledger.batching import OnFailure

log = logging.getLogger("rollnet.ledger")

T = TypeVar("T")


@dataclass(slots=True)
class _WriteJob:
    work: Callable[[Session], Any]
    loop: asyncio.AbstractEventLoop | None
    """The caller's event loop; ``None`` for a thread's call (a concurrent future)."""
    future: asyncio.Future[Any] | concurrent.futures.Future[Any]


def _settle_all(settled: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for future, ok, value in settled:
        if future.cancelled():
            continue  # the caller went away; the work itself committed (or not) all the same
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


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
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._sessions = sessions
        self._max_batch = max_batch
        self._on_failure = on_failure
        self._queue: queue.SimpleQueue[_WriteJob | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="rollnet-write", daemon=True)
        self._thread.start()
        #: Transactions committed so far, and the units of work they carried (tests, metrics).
        self.batches = 0
        self.jobs = 0

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
        return self.submit_threadsafe(work).result(timeout)

    def shutdown(self, wait: bool = True) -> None:
        """Finish the queued work, then stop the thread; later submissions are refused."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(None)
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
            self._queue.put(job)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            job = self._queue.get()
            if job is None:
                return
            batch = [job]
            while len(batch) < self._max_batch:
                try:
                    queued = self._queue.get_nowait()
                except queue.Empty:
                    break
                if queued is None:
                    stopping = True
                    break
                batch.append(queued)
            live = [
                item
                for item in batch
                if item.loop is not None
                or (
                    isinstance(item.future, concurrent.futures.Future)
                    and item.future.set_running_or_notify_cancel()
                )
            ]
            # One wake-up per event loop for the whole batch, not one per call.
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]]
            by_loop = {}
            for item, (ok, value) in zip(live, self._commit(live), strict=True):
                if item.loop is None:
                    threaded = item.future
                    assert isinstance(threaded, concurrent.futures.Future)
                    if ok:
                        threaded.set_result(value)
                    else:
                        threaded.set_exception(value)
                else:
                    looped = item.future
                    assert isinstance(looped, asyncio.Future)
                    by_loop.setdefault(item.loop, []).append((looped, ok, value))
            for loop, settled in by_loop.items():
                # A closed event loop (its caller gone) must not take the writer down with it.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_settle_all, settled)

    def _commit(self, batch: list[_WriteJob]) -> list[tuple[bool, Any]]:
        if not batch:
            return []
        outcomes: list[tuple[bool, Any]] = []
        try:
            with self._sessions.begin() as session:
                if len(batch) == 1:
                    # Alone in its transaction: a failure rolls the whole of it back (below).
                    outcomes.append((True, batch[0].work(session)))
                else:
                    for item in batch:
                        try:
                            with session.begin_nested():
                                outcomes.append((True, item.work(session)))
                        except Exception as error:
                            outcomes.append((False, error))
        except Exception as error:  # the commit (or a lone call) failed: nothing was stored
            if len(batch) == 1:
                return [(False, error)]
            log.warning(
                "a group commit of %d calls failed (%s: %s); %s",
                len(batch),
                type(error).__name__,
                error,
                self._on_failure.value,
            )
            return [o for part in self._on_failure.parts(batch) for o in self._commit(part)]
        self.batches += 1
        self.jobs += len(batch)
        return outcomes


__all__ = ["GroupCommitWriter"]
