"""The replay cache shared by every replica and every restart: signed calls' nonces.

A nonce is recorded with :func:`claim_nonces` before the call it signs takes effect; a second
claim of the same (signed timestamp, node id, nonce) finds it recorded and is a replay (a replay
carries the signed timestamp it was signed with). Rows live until the signature's window has
closed (after it the signature is refused as stale anyway), then :func:`prune_nonces` deletes
them, so the table holds one signing window of calls.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, delete
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from rollnet.ledger.models import RequestNonce
from rollnet.ledger.prepared import Prepared

NonceKey = tuple[str, str, int]
"""(node id, nonce, signed timestamp in Unix milliseconds): one signed call."""

#: Nonces claimed per INSERT (3 parameters each: well inside SQLite's variable limit).
NONCES_PER_STATEMENT = 1_024


def claim_nonces(session: Session, nonces: Sequence[NonceKey]) -> set[NonceKey]:
    """Record each ``(node id, nonce, signed timestamp in ms)`` not recorded yet; return those
    recorded now. One missing from the answer was recorded before: a replay. (One twice in
    ``nonces`` is returned once: telling the call from its replay is the caller's.)

    One prepared ``INSERT … ON CONFLICT DO NOTHING RETURNING`` per chunk, its row count rounded
    up to a power of two (the last row repeated, which the conflict clause skips), so a handful
    of statements serve every batch size and none is compiled per call.
    """
    dialect = session.get_bind().dialect.name
    fresh: set[NonceKey] = set()
    for start in range(0, len(nonces), NONCES_PER_STATEMENT):
        chunk = list(nonces[start : start + NONCES_PER_STATEMENT])
        size = 1 << (len(chunk) - 1).bit_length()
        chunk += [chunk[-1]] * (size - len(chunk))
        params: dict[str, Any] = {}
        for index, (node_id, nonce, signed_ms) in enumerate(chunk):
            params[f"n{index}"] = node_id
            params[f"v{index}"] = nonce
            params[f"t{index}"] = signed_ms
        statement = _claim_statement(dialect, size)
        fresh.update((n, v, t) for n, v, t in statement.rows(session, params))
    return fresh


def replayed_calls(session: Session, nonces: Sequence[NonceKey | None]) -> set[int]:
    """Claim the nonces of a batch of calls (``None``: a call without one) with
    :func:`claim_nonces`; the indices of the replays among them: calls whose nonce was recorded
    before, or by an earlier call of the same batch."""
    fresh = claim_nonces(session, [nonce for nonce in nonces if nonce is not None])
    replays: set[int] = set()
    for index, nonce in enumerate(nonces):
        if nonce is None:
            continue
        if nonce in fresh:
            fresh.discard(nonce)  # a second one in this batch is its replay
        else:
            replays.add(index)
    return replays


@functools.lru_cache(maxsize=32)
def _claim_statement(dialect: str, rows: int) -> Prepared:
    insert: Any = postgresql.insert if dialect == "postgresql" else sqlite.insert
    table = RequestNonce.__table__
    columns = table.c
    statement = (
        insert(table)
        .values(
            [
                {
                    "node_id": bindparam(f"n{i}", type_=columns.node_id.type),
                    "nonce": bindparam(f"v{i}", type_=columns.nonce.type),
                    "signed_ms": bindparam(f"t{i}", type_=columns.signed_ms.type),
                }
                for i in range(rows)
            ]
        )
        .on_conflict_do_nothing(index_elements=["signed_ms", "node_id", "nonce"])
        .returning(columns.node_id, columns.nonce, columns.signed_ms)
    )
    return Prepared(statement)


def prune_nonces(session: Session, *, signed_before: datetime) -> int:
    """Delete the nonces of calls signed before ``signed_before``; how many went."""
    cutoff = int(signed_before.timestamp() * 1000)
    result: Any = session.execute(delete(RequestNonce).where(RequestNonce.signed_ms < cutoff))
    return int(result.rowcount or 0)
