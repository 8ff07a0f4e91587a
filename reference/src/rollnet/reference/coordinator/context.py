"""What every part of the coordinator shares: database, configuration, key, clock, signals."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

from google.protobuf.message import Message
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from rollnet.ledger import idempotency
from rollnet.ledger.engine import read_only_session, session_factory
from rollnet.reference.coordinator.blobstore import BlobStore
from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.reference.coordinator.metrics import CoordinatorMetrics
from rollnet.sdk.identity import Identity
from rollnet.sdk.verifier import KnownKey

T = TypeVar("T")

PROTOCOL_MAJOR = 1
PROTOCOL_MINOR = 0


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

    @staticmethod
    def fire(event: asyncio.Event) -> None:
        """Wake every waiter once: set, then clear for the next round."""
        event.set()
        event.clear()


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
    #: public key -> (what the verifier needs, monotonic expiry); see server.resolve.
    key_cache: dict[bytes, tuple[KnownKey, float]] = field(default_factory=dict)
    sessions: sessionmaker[Session] = field(init=False)
    _writer: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.sessions = session_factory(self.engine)
        # SQLite has one writer: feeding it from one thread avoids its lock convoy (waiters in
        # SQLite's busy handler sleep in steps of up to 100 ms while the database sits idle).
        # PostgreSQL takes row locks, so writes run in parallel there.
        single_writer = self.engine.dialect.name == "sqlite"
        self._writer = ThreadPoolExecutor(
            max_workers=1 if single_writer else 8, thread_name_prefix="rollnet-write"
        )

    async def run_in_transaction(self, work: Callable[[Session], T]) -> T:
        """Run ``work`` in one write transaction on a writer thread (SQL never blocks the loop)."""

        scope = IDEMPOTENCY_SCOPE.get()
        now = self.clock()

        def _run() -> T:
            with self.sessions.begin() as session:
                result = work(session)
                # Work may return the response alone or first in a tuple with side results.
                response = result[0] if isinstance(result, tuple) and result else result
                if (
                    scope is not None
                    and not scope.stored
                    and isinstance(response, scope.response_type)
                ):
                    idempotency.store(
                        session,
                        scope.caller_id,
                        scope.method,
                        scope.request_id,
                        scope.request_digest + response.SerializeToString(deterministic=True),
                        now=now,
                    )
                    scope.stored = True
                return result

        return await asyncio.get_running_loop().run_in_executor(self._writer, _run)

    def close(self) -> None:
        """Stop the writer thread and release database connections."""
        self._writer.shutdown(wait=True)
        self.engine.dispose()

    async def run_read(self, work: Callable[[Session], T]) -> T:
        """Run read-only ``work`` on a worker thread; on SQLite it takes no write lock."""

        def _run() -> T:
            with read_only_session(self.sessions) as session:
                return work(session)

        return await asyncio.to_thread(_run)


@dataclass
class IdempotencyScope:
    """A mutating call's request id: its response is stored in the mutation's own transaction.

    Set by the servicer layer around a call; :meth:`CoordinatorContext.run_in_transaction` stores
    the first result of type ``response_type`` under the key in that same transaction, so the
    mutation and the record of its answer commit or roll back together.
    """

    caller_id: str
    method: str
    request_id: str
    request_digest: bytes
    response_type: type[Message]
    stored: bool = False


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
