"""What every part of the coordinator shares: database, configuration, key, clock, signals."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from rollnet.ledger.engine import session_factory
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

    def __post_init__(self) -> None:
        self.sessions = session_factory(self.engine)

    async def run_in_transaction(self, work: Callable[[Session], T]) -> T:
        """Run ``work`` in one transaction on a worker thread (SQL never blocks the loop)."""

        def _run() -> T:
            with self.sessions.begin() as session:
                return work(session)

        return await asyncio.to_thread(_run)


async def wait_for(event: asyncio.Event, seconds: float) -> None:
    """Wait until ``event`` fires or ``seconds`` pass, whichever comes first."""
    if seconds <= 0:
        return
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return
