"""What every part of the coordinator shares: database, configuration, key, clock, signals."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from google.protobuf.message import Message
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from rollnet.ledger import idempotency
from rollnet.ledger.engine import read_only_session, session_factory
from rollnet.ledger.enums import NodeState
from rollnet.ledger.group_commit import GroupCommitWriter
from rollnet.reference.coordinator.blobstore import BlobStore
from rollnet.reference.coordinator.config import CoordinatorConfig, write_threads
from rollnet.reference.coordinator.database_lock import DatabaseLock
from rollnet.reference.coordinator.metrics import CoordinatorMetrics
from rollnet.reference.coordinator.refusal import Refusal
from rollnet.reference.coordinator.relay_reports import RelayReports
from rollnet.reference.coordinator.uploads import (
    UPLOAD_STREAMS_PER_LEASE,
    PendingUploads,
    block_size,
)
from rollnet.sdk.identity import Identity
from rollnet.sdk.node import PROTOCOL_VERSION
from rollnet.sdk.verifier import KnownKey

T = TypeVar("T")

log = logging.getLogger(__name__)

# The SDK's protocol version is the one this coordinator serves (any 1.x is admitted).
PROTOCOL_MAJOR = PROTOCOL_VERSION.major
PROTOCOL_MINOR = PROTOCOL_VERSION.minor


async def run_to_completion(coroutine: Coroutine[Any, Any, T]) -> T:
    """Await ``coroutine`` as a task that runs to its end even if the caller is cancelled.

    The caller's cancellation still propagates to the caller; the task finishes on its own, and
    an error it ends with then (nobody left to answer) is logged. For work whose bookkeeping
    must follow a database write that a cancellation cannot stop anyway.
    """
    task = asyncio.ensure_future(coroutine)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_log_orphaned_outcome)
        raise


def _log_orphaned_outcome(task: asyncio.Future[Any]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        log.warning(
            "work finished after its caller went away, with an error: %r",
            error,
            exc_info=None if isinstance(error, Refusal) else error,  # a refusal is no fault
        )


def utc_now() -> datetime:
    """The current time, timezone-aware."""
    return datetime.now(UTC)


@dataclass
class Signals:
    """In-process wake-ups for long polls and streams (other replicas are caught by polling)."""

    work_available: asyncio.Event = field(default_factory=asyncio.Event)
    jobs_available: asyncio.Event = field(default_factory=asyncio.Event)
    checkpoint_published: asyncio.Event = field(default_factory=asyncio.Event)
    rollouts_accepted: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set when the coordinator stops: long polls answer "come back later" and streams end at
    #: once, instead of holding the shutdown for their whole wait (20 s for a PullTask).
    stopping: bool = False

    def fire(self, event: asyncio.Event) -> None:
        """Wake every waiter once: set, then clear for the next round."""
        event.set()
        if not self.stopping:
            event.clear()

    def stop(self) -> None:
        """Wake every waiter, now and from now on (see :attr:`stopping`)."""
        self.stopping = True
        for event in (
            self.work_available,
            self.jobs_available,
            self.checkpoint_published,
            self.rollouts_accepted,
        ):
            event.set()


@dataclass
class CoordinatorContext:
    """Shared state of one coordinator process."""

    config: CoordinatorConfig
    engine: Engine
    identity: Identity
    blobs: BlobStore
    metrics: CoordinatorMetrics
    clock: Callable[[], datetime] = utc_now
    signals: Signals = field(default_factory=Signals)
    #: public key -> (what the verifier needs, monotonic expiry); see keys.KeyDirectory.
    #: public key -> (what the verifier needs, the node's state when read, monotonic expiry).
    key_cache: dict[bytes, tuple[KnownKey, NodeState, float]] = field(default_factory=dict)
    #: Bumped by :meth:`forget_keys`; a look-up begun before a bump does not refill the cache.
    key_cache_generation: int = 0
    sessions: sessionmaker[Session] = field(init=False)
    #: Uploads no record references yet (quota and orphan sweeping).
    uploads: PendingUploads = field(init=False)
    #: Relays nodes reported for serving shards that do not match their digest.
    relay_reports: RelayReports = field(init=False)
    #: (ended at, job id) of the last finished validation job the retention sweep has passed.
    retention_position: tuple[datetime, str] | None = None
    #: The SQLite database's lock (None on PostgreSQL), released by :meth:`close`.
    database_lock: DatabaseLock | None = None
    _writer: GroupCommitWriter | ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.sessions = session_factory(self.engine)
        self.relay_reports = RelayReports(self.metrics.registry)
        self.uploads = PendingUploads(
            self.config.upload_quota_bytes,
            block_bytes=block_size(self.blobs.root),
            max_streams=UPLOAD_STREAMS_PER_LEASE * self.config.max_leases_per_node,
        )
        # SQLite has one writer: feeding it from one thread avoids its lock convoy (waiters in
        # SQLite's busy handler sleep in steps of up to 100 ms while the database sits idle), and
        # that thread commits whatever queued meanwhile together (one fsync for many calls).
        # PostgreSQL takes row locks, so writes run in parallel there (a few threads: see
        # CoordinatorConfig.database_write_threads).
        if self.engine.dialect.name == "sqlite":
            self._writer = GroupCommitWriter(self.sessions)
        else:
            self._writer = ThreadPoolExecutor(
                max_workers=write_threads(self.config), thread_name_prefix="rollnet-write"
            )

    def cached_state(self, public_key: bytes) -> NodeState | None:
        """The node's state as its key was last resolved (None: not cached, or expired); as
        fresh as the key cache (bans, ejections and deregistrations here clear it)."""
        cached = self.key_cache.get(public_key)
        if cached is None or cached[2] <= time.monotonic():
            return None
        return cached[1]

    def forget_keys(self) -> None:
        """Drop every cached key (a node was banned, ejected or deregistered)."""
        self.key_cache.clear()
        self.key_cache_generation += 1

    def forget_key(self, public_key: bytes) -> None:
        """Drop one cached key (its node registered again: its cached state is stale)."""
        self.key_cache.pop(public_key, None)
        self.key_cache_generation += 1

    @property
    def group_commit(self) -> GroupCommitWriter | None:
        """The SQLite group-commit writer (``None`` on PostgreSQL)."""
        return self._writer if isinstance(self._writer, GroupCommitWriter) else None

    async def run_in_transaction(self, work: Callable[[Session], T], *, scoped: bool = True) -> T:
        """Run ``work`` in one write transaction on a writer thread (SQL never blocks the loop).

        On SQLite the transaction may be shared with other calls' work (group commit), each in
        its own savepoint: ``work`` sees exactly the same isolation, a failure of ``work`` rolls
        back only its own writes, and its result is returned only once the commit is durable.
        The calling RPC's request id (:class:`IdempotencyScope`) is looked up and its answer
        stored in the same transaction, unless ``scoped`` is false: work done for several calls
        at once handles their scopes itself.
        """

        scope = IDEMPOTENCY_SCOPE.get() if scoped else None
        before = (scope.checked, scope.stored) if scope is not None else (False, False)
        now = self.clock()

        def _work(session: Session) -> T:
            if scope is not None:
                # A group commit whose transaction failed runs its calls again, each from where
                # it stood before this transaction (what the failed one did was rolled back).
                scope.checked, scope.stored = before
            if scope is not None and not scope.checked:
                # A repeated request id is answered from its record, looked up here, in the
                # transaction that would otherwise write, rather than in a read of its own.
                stored = idempotency.lookup(
                    session, scope.caller_id, scope.method, scope.request_id
                )
                scope.checked = True
                if stored is not None:
                    raise StoredResponse(stored)
            result = work(session)
            # Work may return the response alone or first in a tuple with side results.
            response = result[0] if isinstance(result, tuple) and result else result
            if scope is not None and isinstance(response, scope.response_type):
                scope.store(session, response, now)
            return result

        if isinstance(self._writer, GroupCommitWriter):
            return await self._writer.submit(_work)

        def _run() -> T:
            with self.sessions.begin() as session:
                return _work(session)

        return await asyncio.get_running_loop().run_in_executor(self._writer, _run)

    def close(self) -> None:
        """Stop the writer thread and release database connections, then the database."""
        self._writer.shutdown(wait=True)
        self.engine.dispose()
        if self.database_lock is not None:
            self.database_lock.release()

    async def run_read(self, work: Callable[[Session], T]) -> T:
        """Run read-only ``work`` on a worker thread; on SQLite it takes no write lock."""

        def _run() -> T:
            with read_only_session(self.sessions) as session:
                return work(session)

        return await asyncio.to_thread(_run)


@dataclass
class IdempotencyScope:
    """A mutating call's request id: its response is stored in the mutation's own transaction.

    Set by the servicer layer around a call. :meth:`CoordinatorContext.run_in_transaction` looks
    the key up at the start of the call's first transaction (raising :class:`StoredResponse` when
    it was answered before), and stores the first result of type ``response_type`` under the key
    in that same transaction, so the mutation and the record of its answer commit or roll back
    together.
    """

    caller_id: str
    method: str
    request_id: str
    request_digest: bytes
    response_type: type[Message]
    #: Whether a transaction of this call has looked for a stored response yet.
    checked: bool = False
    stored: bool = False

    def record_of(self, response: Message) -> bytes:
        """What is stored for ``response``: the request's digest, then the response's bytes."""
        return self.request_digest + response.SerializeToString(deterministic=True)

    def store(self, session: Session, response: Message, now: datetime) -> None:
        """Record ``response`` as this call's answer in ``session`` (once per call)."""
        if self.stored:
            return
        idempotency.store(
            session, self.caller_id, self.method, self.request_id, self.record_of(response), now=now
        )
        self.stored = True


class StoredResponse(Exception):
    """Raised out of a transaction whose request id already has a stored response."""

    def __init__(self, payload: bytes) -> None:
        super().__init__("request id already answered")
        self.payload = payload


IDEMPOTENCY_SCOPE: contextvars.ContextVar[IdempotencyScope | None] = contextvars.ContextVar(
    "rollnet_idempotency_scope", default=None
)


async def wait_for(event: asyncio.Event, seconds: float) -> None:
    """Wait until ``event`` fires or ``seconds`` pass, whichever comes first."""
    if seconds <= 0:
        return
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return
