"""Group commit for hot paths: many concurrent appends, one transaction.

Callers on any thread :meth:`GroupCommitAppender.submit` an entry and get a future. One writer
thread takes everything queued at that moment (up to ``max_batch``), appends it with
:func:`~rollnet.ledger.chain.append_entries` in a single transaction, then resolves the futures.
While a batch commits, the next one accumulates, so batches grow with load and latency stays one
commit. When a batch's transaction fails, each half of it is appended again in a transaction of
its own, down to the entry that fails alone: one bad entry (a string PostgreSQL cannot store, say)
fails its own future only, and the others are written, still in their order.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from types import TracebackType

from sqlalchemy.orm import Session, sessionmaker

from rollnet.ledger.chain import AppendedEntry, NewEntry, append_entries


@dataclass(frozen=True, slots=True)
class _Pending:
    entry: NewEntry
    future: Future[AppendedEntry]


class GroupCommitAppender:
    """Batches concurrent ledger appends into few transactions (thread-safe)."""

    def __init__(self, sessions: sessionmaker[Session], *, max_batch: int = 1000) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._sessions = sessions
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        #: Number of transactions committed so far (observability and tests).
        self.batches_committed = 0
        self._thread = threading.Thread(
            target=self._run, name="rollnet-ledger-group-commit", daemon=True
        )
        self._thread.start()

    def submit(self, entry: NewEntry) -> Future[AppendedEntry]:
        """Queue ``entry``; the future resolves once its transaction has committed."""
        future: Future[AppendedEntry] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the appender is closed")
            self._queue.put(_Pending(entry, future))
        return future

    def append(self, entry: NewEntry, *, timeout: float | None = None) -> AppendedEntry:
        """Submit ``entry`` and wait until it is committed."""
        return self.submit(entry).result(timeout)

    def close(self) -> None:
        """Commit what is queued, then stop the writer thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._thread.join()

    def __enter__(self) -> GroupCommitAppender:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            self._commit(batch)

    def _commit(self, batch: list[_Pending]) -> None:
        live = [pending for pending in batch if pending.future.set_running_or_notify_cancel()]
        if live:
            self._append(live)

    def _append(self, live: list[_Pending]) -> None:
        try:
            with self._sessions.begin() as session:
                appended = append_entries(session, [pending.entry for pending in live])
        except Exception as exc:
            if len(live) == 1:
                live[0].future.set_exception(exc)
                return
            middle = len(live) // 2
            self._append(live[:middle])
            self._append(live[middle:])
            return
        except BaseException as exc:  # every caller must learn its entry was not written
            for pending in live:
                pending.future.set_exception(exc)
            raise
        self.batches_committed += 1
        for pending, stored in zip(live, appended, strict=True):
            pending.future.set_result(stored)
