"""The replay cache in the database: every verified call's nonce is recorded before it runs.

The verifier's in-memory cache refuses a replay to this process at no cost; this one refuses a
call captured before a restart, or replayed to another replica sharing the database. Claims are
not written one by one: those made while a write is in flight wait for the next one, which
records them all with one INSERT (a burst of calls costs a few transactions, on SQLite sharing
the group commit with other writes). Heartbeats record theirs in their own batch's transaction
instead (:class:`~rollnet.reference.coordinator.heartbeats.HeartbeatBatcher`).
"""

from __future__ import annotations

import asyncio
from functools import partial

from rollnet.ledger.nonces import NONCES_PER_STATEMENT, NonceKey, claim_nonces
from rollnet.reference.coordinator.context import CoordinatorContext
from rollnet.sdk.identity import node_id_from_public_key


class NonceLedger:
    """Records verified calls' nonces in the database, many calls per transaction; a
    :data:`~rollnet.sdk.verifier.NonceRecorder`."""

    def __init__(self, ctx: CoordinatorContext) -> None:
        self.ctx = ctx
        self._waiting: list[tuple[NonceKey, asyncio.Future[bool]]] = []
        self._writing: asyncio.Task[None] | None = None
        #: Transactions written so far, and the nonces they carried (for tests and the bench).
        self.writes = 0
        self.recorded = 0

    async def record(self, public_key: bytes, nonce: str, signed_ms: int) -> bool:
        """Record a call's nonce; ``False`` when it was recorded before (a replay)."""
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(((node_id_from_public_key(public_key), nonce, signed_ms), future))
        if self._writing is None:
            self._writing = asyncio.create_task(self._write_all())
        # Shielded: one caller giving up must not cancel the write others wait for.
        return await asyncio.shield(future)

    async def _write_all(self) -> None:
        batch: list[tuple[NonceKey, asyncio.Future[bool]]] = []
        try:
            while self._waiting:
                batch = self._waiting[:NONCES_PER_STATEMENT]
                del self._waiting[:NONCES_PER_STATEMENT]
                rows = [row for row, _ in batch]
                try:
                    fresh = await self.ctx.run_in_transaction(
                        partial(claim_nonces, nonces=rows), scoped=False
                    )
                except Exception as error:  # every caller of this batch hears it
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(error)
                    continue
                self.writes += 1
                self.recorded += len(fresh)
                for key, future in batch:
                    # Twice in one batch: the first is the call, the second its replay.
                    ok = key in fresh
                    fresh.discard(key)
                    if not future.done():
                        future.set_result(ok)
        finally:
            self._writing = None
            # Cancelled (the server is stopping): nobody may be left waiting for an answer.
            for _, future in [*batch, *self._waiting]:
                future.cancel()
            self._waiting.clear()
