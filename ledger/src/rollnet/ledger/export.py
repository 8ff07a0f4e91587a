"""Reading the ledger out of a database: JSON Lines export and verification of a live database.

Both read one consistent snapshot (a single transaction; ``REPEATABLE READ`` on PostgreSQL) and
stream the entries, so a million-entry ledger never sits in memory as ORM objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import String, select, type_coerce
from sqlalchemy.engine import Connection, Engine

from rollnet.ledger._columns import utc_now
from rollnet.ledger.canonical import datetime_to_us
from rollnet.ledger.engine import READ_ONLY_OPTION
from rollnet.ledger.export_format import entry_line, header_line, signed_head_line
from rollnet.ledger.models import Base, LedgerChainTip, LedgerEntry, SignedChainHead
from rollnet.ledger.verify import ChainVerifier, EntryRecord, HeadRecord, VerificationReport

_ENTRIES = Base.metadata.tables[LedgerEntry.__tablename__]
_HEADS = Base.metadata.tables[SignedChainHead.__tablename__]
_TIP = Base.metadata.tables[LedgerChainTip.__tablename__]
_STREAM_BATCH = 5_000


@dataclass(frozen=True, slots=True)
class LedgerSnapshot:
    """Everything in the ledger at one instant, with entries streamed in stored order."""

    tip: tuple[int, bytes] | None
    heads: list[HeadRecord]
    signed_at: list[str]
    entries: Iterator[EntryRecord]


@contextmanager
def _snapshot_connection(engine: Engine) -> Iterator[Connection]:
    if engine.dialect.name == "postgresql":
        connection = engine.connect().execution_options(
            isolation_level="REPEATABLE READ", stream_results=True, yield_per=_STREAM_BATCH
        )
    else:
        # A deferred (read-only) SQLite transaction reads one WAL snapshot without taking the
        # write lock: exporting or verifying a big ledger never stalls the coordinator.
        connection = engine.connect().execution_options(**{READ_ONLY_OPTION: True})
    try:
        with connection.begin():
            yield connection
    finally:
        connection.close()


@contextmanager
def read_snapshot(engine: Engine) -> Iterator[LedgerSnapshot]:
    """Open a consistent snapshot of the ledger (entries ordered by sequence)."""
    with _snapshot_connection(engine) as connection:
        tip_row = connection.execute(select(_TIP.c.sequence, _TIP.c.head_hash)).one_or_none()
        head_rows = connection.execute(
            select(_HEADS).order_by(_HEADS.c.sequence, _HEADS.c.id)
        ).all()
        heads = [
            HeadRecord(
                network_id=row.network_id,
                sequence=row.sequence,
                head_hash=row.head_hash,
                signer_public_key=row.signer_public_key,
                signature=row.signature,
            )
            for row in head_rows
        ]
        signed_at = [row.signed_at.isoformat() for row in head_rows]
        # kind and recorded_at are read raw, not through the model's types: a row an attacker
        # filled with garbage must become a failed entry in the report, not a crash.
        names = (
            "sequence",
            "recorded_at",
            "node_id",
            "kind",
            "amount",
            "commitment_id",
            "verdict_id",
            "memo",
            "prev_hash",
            "entry_hash",
        )
        columns = [
            type_coerce(_ENTRIES.c[name], String()).label(name)
            if name in ("kind", "recorded_at")
            else _ENTRIES.c[name]
            for name in names
        ]
        result = connection.execution_options(yield_per=_STREAM_BATCH).execute(
            select(*columns).order_by(_ENTRIES.c.sequence)
        )
        entries = _entry_records(result)
        tip = None if tip_row is None else (tip_row.sequence, bytes(tip_row.head_hash))
        yield LedgerSnapshot(tip=tip, heads=heads, signed_at=signed_at, entries=entries)


def _entry_records(rows: Iterable[Any]) -> Iterator[EntryRecord]:
    # Rows unpack positionally (attribute access per column is measurably slower), and the
    # entries of one group commit share their time, so its conversion is reused.
    last_raw: Any = None
    last_us: Any = None
    for (
        sequence,
        recorded_at,
        node_id,
        kind,
        amount,
        commitment_id,
        verdict_id,
        memo,
        prev_hash,
        entry_hash,
    ) in rows:
        if recorded_at != last_raw:
            last_raw = recorded_at
            last_us = _raw_time_us(recorded_at)
        yield EntryRecord(
            sequence,
            last_us,
            node_id,
            kind,
            amount,
            commitment_id,
            verdict_id,
            memo,
            bytes(prev_hash),
            bytes(entry_hash),
        )


def _raw_time_us(value: Any) -> Any:
    """Microseconds since the epoch of a stored time, or the raw value if it is not a time.

    PostgreSQL hands back an aware datetime; SQLite the UTC text written by ``UTCDateTime``.
    """
    try:
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        if isinstance(value, datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=UTC)
            return datetime_to_us(value)
    except ValueError:
        pass
    return value  # fails canonical encoding, so the verifier names this entry


def export_jsonl(engine: Engine, out: Path | str) -> int:
    """Write the ledger to ``out`` in the JSON Lines export format; returns the entry count."""
    count = 0
    with read_snapshot(engine) as snapshot, open(out, "w", encoding="utf-8") as sink:
        tip_sequence, tip_hash = snapshot.tip if snapshot.tip is not None else (0, bytes(32))
        sink.write(
            header_line(
                exported_at=utc_now().isoformat(), tip_sequence=tip_sequence, tip_hash=tip_hash
            )
            + "\n"
        )
        for head, signed_at in zip(snapshot.heads, snapshot.signed_at, strict=True):
            sink.write(
                signed_head_line(
                    network_id=head.network_id,
                    sequence=head.sequence,
                    head_hash=head.head_hash,
                    signer_public_key=head.signer_public_key,
                    signature=head.signature,
                    signed_at=signed_at,
                )
                + "\n"
            )
        for entry in snapshot.entries:
            sink.write(
                entry_line(
                    sequence=entry.sequence,
                    time_us=entry.time_us,
                    node_id=entry.node_id,
                    kind=entry.kind,
                    amount=entry.amount,
                    commitment_id=entry.commitment_id,
                    verdict_id=entry.verdict_id,
                    memo=entry.memo,
                    prev_hash=entry.prev_hash,
                    entry_hash=entry.entry_hash,
                )
                + "\n"
            )
            count += 1
    return count


def verify_database(engine: Engine, *, pinned_key: bytes | None = None) -> VerificationReport:
    """Verify the ledger stored in a database: every hash, every link, every signed head."""
    verifier = ChainVerifier(pinned_key)
    with read_snapshot(engine) as snapshot:
        for entry in snapshot.entries:
            verifier.add_entry(entry)
            if verifier.failed:
                break
        for head in snapshot.heads:
            verifier.add_head(head)
        if snapshot.tip is not None:
            verifier.set_tip(*snapshot.tip)
    return verifier.finish()
