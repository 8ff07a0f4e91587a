"""The request verifier's key look-ups: cached for a while, read from the database in batches.

Every signed call resolves its public key to a node id, a role and whether it is banned. The
answers are cached for :data:`KEY_CACHE_SECONDS` (a ban on this replica clears the cache at
once; the handlers that matter re-read the node's state from the database, so a ban on another
replica is also enforced at once there). Misses are not read one by one: the keys that miss
while a read is in flight wait for the next one, which reads them all with a single SELECT, so
a swarm of thousands of nodes whose cache entries expire together costs a few reads, not
thousands. The cache is bounded; the oldest entries go first.
"""

from __future__ import annotations

import asyncio
import itertools
import time

from sqlalchemy.orm import Session

from rollnet.ledger import nodes as node_repo
from rollnet.ledger.enums import NodeRole, NodeState
from rollnet.reference.coordinator.context import CoordinatorContext
from rollnet.reference.coordinator.serde import ROLE_FROM_DB
from rollnet.reference.coordinator.standing import off_allow_list
from rollnet.sdk.identity import node_id_from_public_key
from rollnet.sdk.verifier import KnownKey

KEY_CACHE_SECONDS = 30.0
KEY_CACHE_ENTRIES = 200_000
KEYS_PER_READ = 1_000


class KeyDirectory:
    """Resolves public keys for :class:`~rollnet.sdk.verifier.RequestVerifier`."""

    def __init__(
        self,
        ctx: CoordinatorContext,
        *,
        ttl: float = KEY_CACHE_SECONDS,
        max_entries: int = KEY_CACHE_ENTRIES,
    ) -> None:
        self.ctx = ctx
        self.ttl = ttl
        self.max_entries = max_entries
        self._waiting: dict[bytes, asyncio.Future[KnownKey | None]] = {}
        self._reading: asyncio.Task[None] | None = None
        #: Database reads made so far, and the keys they carried (for tests and the bench).
        self.reads = 0
        self.keys_read = 0
        self.largest_read = 0

    async def resolve(self, public_key: bytes) -> KnownKey | None:
        """What is known of ``public_key``; ``None`` when it is not registered."""
        cached = self.ctx.key_cache.get(public_key)
        if cached is not None and cached[2] > time.monotonic():
            return cached[0]
        future = self._waiting.get(public_key)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._waiting[public_key] = future
            if self._reading is None:
                self._reading = asyncio.create_task(self._read_all())
        # Shielded: one caller giving up must not cancel the answer others wait for.
        return await asyncio.shield(future)

    async def _read_all(self) -> None:
        batch: dict[bytes, asyncio.Future[KnownKey | None]] = {}
        try:
            while self._waiting:
                # At most KEYS_PER_READ per SELECT (a flood of unknown keys must not build a
                # statement past SQLite's variable limit); the rest wait for the next read.
                keys = list(itertools.islice(self._waiting, KEYS_PER_READ))
                batch = {key: self._waiting.pop(key) for key in keys}
                try:
                    found = await self._read(list(batch))
                except Exception as error:  # every caller of this batch hears it
                    for future in batch.values():
                        if not future.done():
                            future.set_exception(error)
                    continue
                for key, future in batch.items():
                    if not future.done():
                        future.set_result(found.get(key))
        finally:
            self._reading = None
            # Cancelled (the server is stopping): nobody may be left waiting for an answer.
            for future in [*batch.values(), *self._waiting.values()]:
                future.cancel()
            self._waiting.clear()

    async def _read(self, keys: list[bytes]) -> dict[bytes, KnownKey]:
        by_id = {node_id_from_public_key(key): key for key in keys}

        def work(session: Session) -> dict[str, tuple[bytes, NodeRole, NodeState]]:
            return node_repo.get_keys(session, list(by_id))

        generation = self.ctx.key_cache_generation
        rows = await self.ctx.run_read(work)
        self.reads += 1
        self.keys_read += len(keys)
        self.largest_read = max(self.largest_read, len(keys))
        found: dict[bytes, KnownKey] = {}
        expiry = time.monotonic() + self.ttl
        cache = self.ctx.key_cache
        for node_id, (public_key, role, state) in rows.items():
            key = by_id[node_id]
            if public_key != key:
                continue  # a node id collision would need a BLAKE3 collision; refuse all the same
            known = KnownKey(
                node_id=node_id,
                role=ROLE_FROM_DB[role],
                banned=state == NodeState.BANNED,
                revoked=off_allow_list(self.ctx.config, role, node_id, public_key, now=True),
            )
            found[key] = known
            if generation != self.ctx.key_cache_generation:
                continue  # the cache was cleared (a ban) while this read ran: do not refill it
            cache.pop(key, None)  # re-inserted last: the oldest entries are evicted first
            cache[key] = (known, state, expiry)
        while len(cache) > self.max_entries:
            del cache[next(iter(cache))]
        return found
