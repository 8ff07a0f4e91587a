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

from rollnet.sdk.domains import LEDGER_ENTRY_DOMAIN, LEDGER_HEAD_DOMAIN

#: Format version after the domain tag (rollnet.sdk.domains) that opens every canonical entry.
ENTRY_FORMAT_VERSION = 1
#: Format version after the domain tag that opens every signed chain-head message.
HEAD_FORMAT_VERSION = 1
#: ``prev_hash`` of the first entry, and the head hash of an empty chain.
GENESIS_HASH = bytes(32)
HASH_SIZE = 32

_ENTRY_PREFIX = LEDGER_ENTRY_DOMAIN + bytes([ENTRY_FORMAT_VERSION])
_HEAD_PREFIX = LEDGER_HEAD_DOMAIN + bytes([HEAD_FORMAT_VERSION])
_SEQUENCE_TIME = struct.Struct(">Qq")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_ABSENT = b"\x00"
_PRESENT = b"\x01"
_EMPTY_TEXT = b"\x00\x00\x00\x00"
#: str-encodings of recently seen node ids and kinds (bounded: cleared when full).
_TEXT_CACHE: dict[str, bytes] = {}
_TEXT_CACHE_LIMIT = 65_536
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


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
    return encode_entry(sequence, time_us, node_id, kind, amount, commitment_id, verdict_id, memo)


def encode_entry(
    sequence: int,
    time_us: int,
    node_id: str,
    kind: str,
    amount: int,
    commitment_id: str | None,
    verdict_id: str | None,
    memo: str,
) -> bytes:
    """:func:`canonical_entry_bytes` with positional arguments (the hot path of appends and
    verification, where keyword passing is measurable)."""
    # Written out flat, with node ids and kinds (few distinct values) encoded once and cached.
    node = _TEXT_CACHE.get(node_id)
    if node is None:
        node = _cache_text(node_id)
    kind_bytes = _TEXT_CACHE.get(kind)
    if kind_bytes is None:
        kind_bytes = _cache_text(kind)
    try:
        sequence_time = _SEQUENCE_TIME.pack(sequence, time_us)
        amount_bytes = _I64.pack(amount)
    except struct.error as exc:
        raise ValueError(f"ledger entry field out of range: {exc}") from exc
    if commitment_id is None:
        commitment = _ABSENT
    else:
        encoded = commitment_id.encode()
        commitment = _PRESENT + _U32.pack(len(encoded)) + encoded
    if verdict_id is None:
        verdict = _ABSENT
    else:
        encoded = verdict_id.encode()
        verdict = _PRESENT + _U32.pack(len(encoded)) + encoded
    if memo:
        encoded = memo.encode()
        memo_bytes = _U32.pack(len(encoded)) + encoded
    else:
        memo_bytes = _EMPTY_TEXT
    return b"".join(
        (
            _ENTRY_PREFIX,
            sequence_time,
            node,
            kind_bytes,
            amount_bytes,
            commitment,
            verdict,
            memo_bytes,
        )
    )


def _cache_text(value: str) -> bytes:
    encoded = value.encode()
    text = _U32.pack(len(encoded)) + encoded
    if len(_TEXT_CACHE) >= _TEXT_CACHE_LIMIT:
        _TEXT_CACHE.clear()
    _TEXT_CACHE[value] = text
    return text


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
    network = network_id.encode()
    return _HEAD_PREFIX + _U32.pack(len(network)) + network + _U64.pack(sequence) + head_hash


def datetime_to_us(moment: datetime) -> int:
    """Microseconds since the Unix epoch of a timezone-aware datetime (exact, no float)."""
    if moment.tzinfo is None:
        raise ValueError("naive datetime: ledger times must be timezone-aware")
    return (moment - _EPOCH) // _MICROSECOND


def us_to_datetime(time_us: int) -> datetime:
    """Inverse of :func:`datetime_to_us`, as a UTC datetime."""
    return _EPOCH + timedelta(microseconds=time_us)
