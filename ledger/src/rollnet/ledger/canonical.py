"""Canonical bytes and hashes of ledger entries and signed chain heads.

This module is the executable form of the byte-level specification in ``docs/ledger.md``; it
depends on nothing but the standard library and ``blake3`` so that a verifier can use it (or
re-implement it from the document) without trusting any other coordinator code.

Entry (format version 1), all integers big-endian::

    "rollnet.ledger.entry"   20 bytes, ASCII domain tag
    0x01                      1 byte, format version
    sequence                  u64
    time_us                   i64, microseconds since 1970-01-01T00:00:00Z
    node_id                   str
    kind                      str
    amount                    i64, work units (negative for slashes)
    commitment_id             opt-str
    verdict_id                opt-str
    memo                      str

    str     = u32 length of the UTF-8 bytes, then the bytes
    opt-str = 0x00 when absent, or 0x01 then a str

``entry_hash = BLAKE3(prev_hash ‖ canonical bytes)``; the first entry's ``prev_hash`` is
:data:`GENESIS_HASH` (32 zero bytes).
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta

from blake3 import blake3

#: Domain tag and format version that open every canonical entry.
ENTRY_DOMAIN = b"rollnet.ledger.entry"
ENTRY_FORMAT_VERSION = 1
#: Domain tag and format version that open every signed chain-head message.
HEAD_DOMAIN = b"rollnet.ledger.chain-head"
HEAD_FORMAT_VERSION = 1
#: ``prev_hash`` of the first entry, and the head hash of an empty chain.
GENESIS_HASH = bytes(32)
HASH_SIZE = 32

_ENTRY_PREFIX = ENTRY_DOMAIN + bytes([ENTRY_FORMAT_VERSION])
_HEAD_PREFIX = HEAD_DOMAIN + bytes([HEAD_FORMAT_VERSION])
_SEQUENCE_TIME = struct.Struct(">Qq")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_ABSENT = b"\x00"
_PRESENT = b"\x01"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _text(value: str) -> bytes:
    encoded = value.encode()
    return _U32.pack(len(encoded)) + encoded


def _optional_text(value: str | None) -> bytes:
    if value is None:
        return _ABSENT
    return _PRESENT + _text(value)


def canonical_entry_bytes(
    *,
    sequence: int,
    time_us: int,
    node_id: str,
    kind: str,
    amount: int,
    commitment_id: str | None,
    verdict_id: str | None,
    memo: str,
) -> bytes:
    """The canonical encoding of one ledger entry (format version 1).

    Raises :class:`ValueError` when a number does not fit its field.
    """
    try:
        return b"".join(
            (
                _ENTRY_PREFIX,
                _SEQUENCE_TIME.pack(sequence, time_us),
                _text(node_id),
                _text(kind),
                _I64.pack(amount),
                _optional_text(commitment_id),
                _optional_text(verdict_id),
                _text(memo),
            )
        )
    except struct.error as exc:
        raise ValueError(f"ledger entry field out of range: {exc}") from exc


def chain_hash(prev_hash: bytes, canonical: bytes) -> bytes:
    """``BLAKE3(prev_hash ‖ canonical)``: the hash of an entry given its predecessor's."""
    return blake3(prev_hash + canonical).digest()


def chain_head_message(network_id: str, sequence: int, head_hash: bytes) -> bytes:
    """The bytes the coordinator signs to vouch for a chain head.

    ``"rollnet.ledger.chain-head" ‖ 0x01 ‖ str(network_id) ‖ u64(sequence) ‖ head_hash``. The
    network id binds the signature to one network, so a head cannot be replayed on another.
    """
    if len(head_hash) != HASH_SIZE:
        raise ValueError(f"head hash must be {HASH_SIZE} bytes, got {len(head_hash)}")
    return _HEAD_PREFIX + _text(network_id) + _U64.pack(sequence) + head_hash


def datetime_to_us(moment: datetime) -> int:
    """Microseconds since the Unix epoch of a timezone-aware datetime (exact, no float)."""
    if moment.tzinfo is None:
        raise ValueError("naive datetime: ledger times must be timezone-aware")
    return (moment - _EPOCH) // _MICROSECOND


def us_to_datetime(time_us: int) -> datetime:
    """Inverse of :func:`datetime_to_us`, as a UTC datetime."""
    return _EPOCH + timedelta(microseconds=time_us)
