"""The append-only, hash-chained contribution ledger: appends, signed heads, balances.

Every function takes a :class:`~sqlalchemy.orm.Session` and runs inside the caller's transaction
(``with session.begin(): ...``), so a credit can commit atomically with the verdict that earns it.

Appends serialise on the one-row ``ledger_chain_tip`` table: the tip is read ``FOR UPDATE`` (on
SQLite every transaction already holds the single write lock from ``BEGIN IMMEDIATE``), the new
entries are chained from it and inserted, and the tip is advanced, all in one transaction. Two
coordinator replicas on one PostgreSQL therefore never fork the chain, sequence numbers are
gapless, and a process killed mid-batch leaves either the whole batch or none of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from blake3 import blake3
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from sqlalchemy import case, func, select, update
from sqlalchemy.orm import Session

from rollnet.ledger._columns import utc_now
from rollnet.ledger.canonical import (
    chain_head_message,
    datetime_to_us,
    encode_entry,
)
from rollnet.ledger.enums import EntryKind
from rollnet.ledger.models import Base, LedgerChainTip, LedgerEntry, SignedChainHead

_I64_MIN = -(2**63)
_I64_MAX = 2**63 - 1
_TIP_ID = 1
_ENTRIES_TABLE = Base.metadata.tables[LedgerEntry.__tablename__]


@dataclass(frozen=True, slots=True)
class NewEntry:
    """An entry to append; the ledger assigns its sequence, time and hashes."""

    node_id: str
    kind: EntryKind
    #: Signed work units: credits and validator rewards ≥ 0, slashes ≤ 0, adjustments any sign.
    amount: int
    commitment_id: str | None = None
    verdict_id: str | None = None
    memo: str = ""

    def __post_init__(self) -> None:
        kind = EntryKind(self.kind)
        object.__setattr__(self, "kind", kind)  # accept "credit" as well as EntryKind.CREDIT
        if not _I64_MIN <= self.amount <= _I64_MAX:
            raise ValueError(f"amount {self.amount} does not fit a signed 64-bit integer")
        if kind in (EntryKind.CREDIT, EntryKind.VALIDATOR_REWARD) and self.amount < 0:
            raise ValueError(f"a {kind} entry cannot be negative (got {self.amount})")
        if kind is EntryKind.SLASH and self.amount > 0:
            raise ValueError(f"a slash entry cannot be positive (got {self.amount})")


@dataclass(frozen=True, slots=True)
class AppendedEntry:
    """An entry as stored in the chain."""

    sequence: int
    recorded_at: datetime
    node_id: str
    kind: EntryKind
    amount: int
    commitment_id: str | None
    verdict_id: str | None
    memo: str
    prev_hash: bytes
    entry_hash: bytes


@dataclass(frozen=True, slots=True)
class ChainTip:
    """The last sequence number (0 for an empty chain) and its entry hash."""

    sequence: int
    head_hash: bytes


@dataclass(frozen=True, slots=True)
class SignedHead:
    """A chain head vouched for by an Ed25519 signature over :func:`chain_head_message`."""

    network_id: str
    sequence: int
    head_hash: bytes
    signer_public_key: bytes
    signature: bytes
    signed_at: datetime


def chain_tip(session: Session, *, for_update: bool = False) -> ChainTip:
    """Read the chain tip; ``for_update`` locks it until the transaction ends."""
    query = select(LedgerChainTip.sequence, LedgerChainTip.head_hash).where(
        LedgerChainTip.id == _TIP_ID
    )
    if for_update:
        query = query.with_for_update()
    row = session.execute(query).one_or_none()
    if row is None:
        raise RuntimeError("ledger_chain_tip is empty: run the migrations (upgrade_to_head)")
    return ChainTip(sequence=row.sequence, head_hash=row.head_hash)


def append_entries(
    session: Session, entries: Sequence[NewEntry], *, now: datetime | None = None
) -> list[AppendedEntry]:
    """Append ``entries``, in order, as one group commit inside the caller's transaction.

    All entries share one ``recorded_at``. Returns them as stored. Nothing is visible to others
    until the caller commits; if the transaction rolls back, none of them exist.

    The chain tip stays locked until the transaction ends and every append waits for it: append
    last in a transaction (after locking tasks, jobs or nodes, never before — that order cannot
    deadlock) and commit promptly.
    """
    if not entries:
        return []
    recorded_at = now if now is not None else utc_now()
    time_us = datetime_to_us(recorded_at)
    tip = chain_tip(session, for_update=True)
    prev_hash = tip.head_hash
    sequence = tip.sequence
    appended: list[AppendedEntry] = []
    for entry in entries:
        sequence += 1
        kind = entry.kind
        canonical = encode_entry(
            sequence,
            time_us,
            entry.node_id,
            kind.value,
            entry.amount,
            entry.commitment_id,
            entry.verdict_id,
            entry.memo,
        )
        entry_hash = blake3(prev_hash + canonical).digest()
        appended.append(
            AppendedEntry(
                sequence,
                recorded_at,
                entry.node_id,
                kind,
                entry.amount,
                entry.commitment_id,
                entry.verdict_id,
                entry.memo,
                prev_hash,
                entry_hash,
            )
        )
        prev_hash = entry_hash
    rows = [
        {
            "sequence": stored.sequence,
            "recorded_at": recorded_at,
            "node_id": stored.node_id,
            "kind": stored.kind,
            "amount": stored.amount,
            "commitment_id": stored.commitment_id,
            "verdict_id": stored.verdict_id,
            "memo": stored.memo,
            "prev_hash": stored.prev_hash,
            "entry_hash": stored.entry_hash,
        }
        for stored in appended
    ]
    _insert_entries(session, rows)
    session.execute(
        update(LedgerChainTip)
        .where(LedgerChainTip.id == _TIP_ID)
        .values(sequence=sequence, head_hash=prev_hash)
    )
    return appended


def _insert_entries(session: Session, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert a batch of entry rows with one executemany.

    Every row of a batch shares ``recorded_at`` and most share a kind, so each column's bind
    processor runs once per distinct value instead of once per row (SQLAlchemy's executemany
    would run all of them for every row — a third of the append cost), then the driver gets the
    processed rows in the statement's own parameter order.
    """
    connection = session.connection()
    dialect = connection.dialect
    compiled = _ENTRIES_TABLE.insert().compile(dialect=dialect)
    processors = {
        column.name: column.type._cached_bind_processor(dialect)
        for column in _ENTRIES_TABLE.columns
    }
    memo: dict[tuple[str, object], object] = {}

    def bound(name: str, value: object) -> object:
        processor = processors[name]
        if processor is None or value is None:
            return value
        if name in ("recorded_at", "kind"):
            key = (name, value)
            if key not in memo:
                memo[key] = processor(value)
            return memo[key]
        return processor(value)

    positions = compiled.positiontup
    if positions is not None:  # positional paramstyle (sqlite3: qmark)
        params: list[Any] = [tuple(bound(n, row[n]) for n in positions) for row in rows]
    else:  # named paramstyle (psycopg: pyformat)
        params = [{n: bound(n, v) for n, v in row.items()} for row in rows]
    connection.exec_driver_sql(str(compiled), params)


def list_entries(
    session: Session,
    *,
    after_sequence: int = 0,
    limit: int = 1000,
    node_id: str | None = None,
    kind: EntryKind | None = None,
) -> list[AppendedEntry]:
    """Entries with ``sequence > after_sequence`` in order, at most ``limit`` of them,
    optionally only those of one node and/or one kind."""
    query = select(LedgerEntry).where(LedgerEntry.sequence > after_sequence)
    if node_id is not None:
        query = query.where(LedgerEntry.node_id == node_id)
    if kind is not None:
        query = query.where(LedgerEntry.kind == kind)
    rows = session.scalars(query.order_by(LedgerEntry.sequence).limit(limit))
    return [_appended(row) for row in rows]


def _appended(row: LedgerEntry) -> AppendedEntry:
    return AppendedEntry(
        sequence=row.sequence,
        recorded_at=row.recorded_at,
        node_id=row.node_id,
        kind=row.kind,
        amount=row.amount,
        commitment_id=row.commitment_id,
        verdict_id=row.verdict_id,
        memo=row.memo,
        prev_hash=row.prev_hash,
        entry_hash=row.entry_hash,
    )


def public_key_bytes(private_key: Ed25519PrivateKey) -> bytes:
    """The 32 raw bytes of the public half of ``private_key``."""
    return private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def sign_chain_head(
    session: Session,
    private_key: Ed25519PrivateKey,
    network_id: str,
    *,
    now: datetime | None = None,
) -> SignedHead:
    """Sign the current chain head with the coordinator key and store the signed head.

    Idempotent per (network, sequence, key): signing again before the chain moves returns the
    stored head, so calling this periodically costs one read when nothing happened. The tip is
    locked while signing so the head cannot move underneath the signature.
    """
    tip = chain_tip(session, for_update=True)
    public_key = public_key_bytes(private_key)
    existing = session.scalars(
        select(SignedChainHead).where(
            SignedChainHead.network_id == network_id,
            SignedChainHead.sequence == tip.sequence,
            SignedChainHead.signer_public_key == public_key,
        )
    ).one_or_none()
    if existing is not None:
        return _signed_head(existing)
    signature = private_key.sign(chain_head_message(network_id, tip.sequence, tip.head_hash))
    head = SignedChainHead(
        network_id=network_id,
        sequence=tip.sequence,
        head_hash=tip.head_hash,
        signer_public_key=public_key,
        signature=signature,
        signed_at=now if now is not None else utc_now(),
    )
    session.add(head)
    session.flush()
    return _signed_head(head)


def latest_signed_head(session: Session, network_id: str) -> SignedHead | None:
    """The signed head with the highest sequence for ``network_id``, if any."""
    row = session.scalars(
        select(SignedChainHead)
        .where(SignedChainHead.network_id == network_id)
        .order_by(SignedChainHead.sequence.desc(), SignedChainHead.id.desc())
        .limit(1)
    ).one_or_none()
    return None if row is None else _signed_head(row)


def _signed_head(row: SignedChainHead) -> SignedHead:
    return SignedHead(
        network_id=row.network_id,
        sequence=row.sequence,
        head_hash=row.head_hash,
        signer_public_key=row.signer_public_key,
        signature=row.signature,
        signed_at=row.signed_at,
    )


def balances(session: Session) -> dict[str, int]:
    """Per-node totals of all entries (work units), ordered by node id."""
    rows = session.execute(
        select(LedgerEntry.node_id, func.sum(LedgerEntry.amount))
        .group_by(LedgerEntry.node_id)
        .order_by(LedgerEntry.node_id)
    )
    return {node_id: int(total) for node_id, total in rows}


def balance(session: Session, node_id: str) -> int:
    """Total of ``node_id``'s entries (0 when it has none)."""
    total = session.scalar(
        select(func.coalesce(func.sum(LedgerEntry.amount), 0)).where(LedgerEntry.node_id == node_id)
    )
    return int(total or 0)


@dataclass(frozen=True, slots=True)
class NodeTotals:
    """A node's ledger totals."""

    balance: int
    credited: int
    slashed: int
    entry_count: int


def node_totals(session: Session, node_id: str) -> NodeTotals:
    """Balance, credits, slashes (as a positive number) and entry count of ``node_id``."""
    row = session.execute(
        select(
            func.coalesce(func.sum(LedgerEntry.amount), 0),
            func.coalesce(
                func.sum(case((LedgerEntry.kind == EntryKind.CREDIT, LedgerEntry.amount), else_=0)),
                0,
            ),
            func.coalesce(
                func.sum(case((LedgerEntry.kind == EntryKind.SLASH, -LedgerEntry.amount), else_=0)),
                0,
            ),
            func.count(),
        ).where(LedgerEntry.node_id == node_id)
    ).one()
    return NodeTotals(int(row[0]), int(row[1]), int(row[2]), int(row[3]))
