"""Re-checking a coordinator's ledger from what LedgerService answers, by docs/ledger.md alone:
each entry's canonical bytes and hash, the links between entries, and the signed chain head.

Written from the document rather than imported from ``rollnet.ledger``, so that the suite checks
the written format (and works where only the SDK is installed).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import blake3

from rollnet.sdk.domains import LEDGER_ENTRY_DOMAIN, LEDGER_HEAD_DOMAIN
from rollnet.sdk.identity import verify_signature
from rollnet.v1 import ledger_pb2

FORMAT_VERSION = 1
ZERO_HASH = b"\x00" * 32


def _str(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">I", len(data)) + data


def _opt_str(text: str) -> bytes:
    # The wire cannot tell an absent id from an empty one; LedgerService sends "" for absent.
    return b"\x00" if not text else b"\x01" + _str(text)


def kind_name(kind: int) -> str:
    """``credit`` for ``KIND_CREDIT`` (the ledger's kind strings)."""
    return ledger_pb2.LedgerEntry.Kind.Name(kind).removeprefix("KIND_").lower()  # type: ignore[arg-type]


def canonical_bytes(entry: ledger_pb2.LedgerEntry) -> bytes:
    """The entry's canonical bytes, format version 1 (docs/ledger.md)."""
    time_us = entry.recorded_at.seconds * 1_000_000 + entry.recorded_at.nanos // 1000
    return b"".join(
        (
            LEDGER_ENTRY_DOMAIN,
            bytes([FORMAT_VERSION]),
            struct.pack(">Q", entry.sequence),
            struct.pack(">q", time_us),
            _str(entry.node_id),
            _str(kind_name(entry.kind)),
            struct.pack(">q", entry.amount),
            _opt_str(entry.commitment_id),
            _opt_str(entry.verdict_id),
            _str(entry.memo),
        )
    )


def entry_hash(prev_hash: bytes, entry: ledger_pb2.LedgerEntry) -> bytes:
    """BLAKE3(prev_hash || canonical bytes)."""
    digest: bytes = blake3.blake3(prev_hash + canonical_bytes(entry)).digest()
    return digest


def head_message(network_id: str, sequence: int, head_hash: bytes) -> bytes:
    """The bytes a chain head's signature covers."""
    return (
        LEDGER_HEAD_DOMAIN
        + bytes([FORMAT_VERSION])
        + _str(network_id)
        + struct.pack(">Q", sequence)
        + head_hash
    )


def verify_chain(
    entries: Sequence[ledger_pb2.LedgerEntry],
    head: ledger_pb2.ChainHead,
    network_id: str,
    coordinator_key: bytes,
) -> str | None:
    """What is wrong with ``entries`` (the whole chain, from sequence 1, up to the head) and the
    signed ``head``; ``None`` when everything verifies."""
    prev = ZERO_HASH
    for expected, entry in enumerate(entries, start=1):
        if entry.sequence != expected:
            return f"entry {expected} has sequence {entry.sequence} (gap or reorder)"
        if bytes(entry.prev_hash) != prev:
            return f"entry {entry.sequence}'s prev_hash is not the previous entry's hash"
        computed = entry_hash(prev, entry)
        if bytes(entry.entry_hash) != computed:
            return (
                f"entry {entry.sequence}'s entry_hash {entry.entry_hash.hex()} is not "
                f"BLAKE3(prev_hash || canonical bytes) = {computed.hex()}"
            )
        prev = computed
    if head.network_id != network_id:
        return f"the chain head names network {head.network_id!r}"
    if head.sequence != len(entries):
        return f"the head covers sequence {head.sequence}, the chain has {len(entries)} entries"
    if bytes(head.head_hash) != prev:
        return "the head's hash is not the last entry's hash"
    if bytes(head.coordinator_public_key) != coordinator_key:
        return "the head is signed by another key than the coordinator's"
    if not verify_signature(
        coordinator_key, bytes(head.signature), head_message(network_id, head.sequence, prev)
    ):
        return "the chain head's signature does not verify"
    return None
