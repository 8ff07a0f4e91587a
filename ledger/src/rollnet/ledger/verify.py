"""Independent verification of the hash-chained ledger.

Recomputes every entry hash from the entry's own fields (never trusting the stored hash), checks
that each entry links to its predecessor and that sequence numbers run 1, 2, 3, … without gaps,
and checks every signed chain head: its Ed25519 signature, and that the chain still has the
signed hash at the signed sequence. Verification of an export needs only this module,
:mod:`rollnet.ledger.canonical`, ``blake3`` and the SDK's signature check (libsodium) — no
database and no coordinator code.

The first bad sequence number is reported: the first entry that fails its checks, or the sequence
of the first signed head the chain contradicts (or that is forged), whichever is lower.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from blake3 import blake3

from rollnet.ledger.canonical import (
    GENESIS_HASH,
    HASH_SIZE,
    chain_head_message,
    encode_entry,
)
from rollnet.ledger.export_format import EXPORT_FORMAT, EXPORT_VERSION
from rollnet.sdk.identity import verify_signature


@dataclass(frozen=True, slots=True)
class EntryRecord:
    """An entry as found in a database or an export, before any check."""

    sequence: int
    time_us: int
    node_id: str
    kind: str
    amount: int
    commitment_id: str | None
    verdict_id: str | None
    memo: str
    prev_hash: bytes
    entry_hash: bytes


@dataclass(frozen=True, slots=True)
class HeadRecord:
    """A signed chain head as found in a database or an export."""

    network_id: str
    sequence: int
    head_hash: bytes
    signer_public_key: bytes
    signature: bytes


@dataclass(frozen=True, slots=True)
class VerificationReport:
    """Outcome of a verification."""

    ok: bool
    entries_verified: int
    last_sequence: int
    head_hash: bytes
    heads_verified: int
    #: How head signatures were checked: against a pinned key, or the keys stored with them.
    key_source: str
    first_bad_sequence: int | None = None
    problem: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def summary(self) -> str:
        """Human-readable lines describing the outcome."""
        lines: list[str] = []
        if self.ok:
            lines.append(
                f"OK: {self.entries_verified} entries verified, chain head at sequence "
                f"{self.last_sequence} ({self.head_hash.hex()})"
            )
        else:
            lines.append(f"FAIL: first bad sequence {self.first_bad_sequence}: {self.problem}")
            lines.append(f"{self.entries_verified} entries verified before the failure")
        lines.append(f"{self.heads_verified} signed heads checked; {self.key_source}")
        lines.extend(self.notes)
        return "\n".join(lines)


def _sequence_failure(expected: int, found: object) -> tuple[int, str]:
    return (
        expected,
        f"expected entry {expected} but found sequence {found}"
        " (entries missing, reordered or duplicated)",
    )


def _link_failure(sequence: int) -> tuple[int, str]:
    return (
        sequence,
        f"prev_hash of entry {sequence} is not the hash of entry {sequence - 1}"
        " (entries reordered, removed or replaced)",
    )


def _encoding_failure(sequence: int, exc: Exception) -> tuple[int, str]:
    return (sequence, f"entry {sequence} cannot be encoded: {exc}")


def _hash_failure(sequence: int) -> tuple[int, str]:
    return (sequence, f"entry {sequence}'s contents do not hash to its entry_hash (entry altered)")


class ChainVerifier:
    """Streaming verifier: feed entries in sequence order and heads in any order, then finish.

    Memory: 32 bytes per entry (the recomputed hashes, kept to check heads signed at any
    sequence).
    """

    def __init__(
        self,
        pinned_key: bytes | None = None,
        *,
        start_sequence: int = 1,
        start_prev_hash: bytes = GENESIS_HASH,
    ) -> None:
        if pinned_key is not None and len(pinned_key) != HASH_SIZE:
            raise ValueError("a pinned Ed25519 public key is 32 bytes")
        self._pinned_key = pinned_key
        # A verifier may start mid-chain to check one span of a file in a worker process; the
        # spans are then stitched together with absorb_span().
        self._expected = start_sequence
        self._prev_hash = start_prev_hash
        self._hashes = bytearray()
        self._heads: list[HeadRecord] = []
        self._entry_failure: tuple[int, str] | None = None
        self._tip: tuple[int, bytes] | None = None

    @property
    def failed(self) -> bool:
        """Whether an entry has failed (later entries are then ignored)."""
        return self._entry_failure is not None

    def add_entry(self, entry: EntryRecord) -> None:
        """Check the next entry."""
        self.add_entry_fields(
            entry.sequence,
            entry.time_us,
            entry.node_id,
            entry.kind,
            entry.amount,
            entry.commitment_id,
            entry.verdict_id,
            entry.memo,
            entry.prev_hash,
            entry.entry_hash,
        )

    def add_entry_fields(
        self,
        sequence: int,
        time_us: int,
        node_id: str,
        kind: str,
        amount: int,
        commitment_id: str | None,
        verdict_id: str | None,
        memo: str,
        prev_hash: bytes,
        entry_hash: bytes,
    ) -> None:
        """Check the next entry given as fields (the hot path: no record object per entry)."""
        if self._entry_failure is not None:
            return
        expected = self._expected
        if sequence != expected:
            self._entry_failure = _sequence_failure(expected, sequence)
            return
        if prev_hash != self._prev_hash:
            self._entry_failure = _link_failure(sequence)
            return
        try:
            canonical = encode_entry(
                sequence, time_us, node_id, kind, amount, commitment_id, verdict_id, memo
            )
        except (ValueError, TypeError, AttributeError) as exc:
            self._entry_failure = _encoding_failure(sequence, exc)
            return
        computed = blake3(prev_hash + canonical).digest()
        if computed != entry_hash:
            self._entry_failure = _hash_failure(sequence)
            return
        self._hashes += computed
        self._prev_hash = computed
        self._expected = expected + 1

    def absorb_span(self, span: SpanResult) -> None:
        """Continue the chain with a span verified on its own (see :func:`verify_span`)."""
        for head in span.heads:
            self.add_head(head)
        if self._entry_failure is not None or span.first_sequence is None:
            return
        if span.first_sequence != self._expected:
            self._entry_failure = _sequence_failure(self._expected, span.first_sequence)
            return
        if span.first_prev_hash != self._prev_hash:
            self._entry_failure = _link_failure(span.first_sequence)
            return
        verified = len(span.hashes) // HASH_SIZE
        if verified:
            self._hashes += span.hashes
            self._prev_hash = span.hashes[-HASH_SIZE:]
            self._expected += verified
        self._entry_failure = span.failure

    def add_head(self, head: HeadRecord) -> None:
        """Record a signed head; it is checked in :meth:`finish`."""
        self._heads.append(head)

    def set_tip(self, sequence: int, head_hash: bytes) -> None:
        """Record the tip the source claims (the database's chain-tip row or an export header)."""
        self._tip = (sequence, head_hash)

    def _hash_at(self, sequence: int) -> bytes:
        if sequence == 0:
            return GENESIS_HASH
        start = (sequence - 1) * HASH_SIZE
        return bytes(self._hashes[start : start + HASH_SIZE])

    def finish(self) -> VerificationReport:
        """Check heads and tip against the verified entries and report."""
        failures: list[tuple[int, str]] = []
        if self._entry_failure is not None:
            failures.append(self._entry_failure)
        last_good = self._expected - 1
        notes: list[str] = []
        if self._pinned_key is not None:
            key_source = (
                f"signatures checked against the pinned coordinator key {self._pinned_key.hex()}"
            )
        else:
            key_source = (
                "signatures checked against the public keys stored with the heads (no coordinator"
                " key pinned: pass --coordinator-key to rule out a head re-signed with another key)"
            )
        heads_verified = 0
        heads_beyond_failure = 0
        for head in sorted(self._heads, key=lambda h: h.sequence):
            if self._entry_failure is not None and head.sequence > last_good:
                heads_beyond_failure += 1  # nothing verified to compare it with
                continue
            head_failure = self._check_head(head, last_good)
            if head_failure is not None:
                failures.append(head_failure)
            else:
                heads_verified += 1
        if heads_beyond_failure:
            notes.append(f"{heads_beyond_failure} signed heads lie beyond the failure, unchecked")
        if not self._heads:
            notes.append(
                "warning: no signed heads: the chain is internally consistent, but nothing signed"
                " vouches for it"
            )
        if self._tip is not None and self._entry_failure is None:
            tip_sequence, tip_hash = self._tip
            if tip_sequence > last_good:
                failures.append(
                    (
                        last_good + 1,
                        f"the chain tip says {tip_sequence} entries but the chain ends at"
                        f" {last_good} (entries removed from the end)",
                    )
                )
            elif tip_sequence < last_good:
                failures.append(
                    (
                        tip_sequence + 1,
                        f"entries after the chain tip ({tip_sequence}) were added out of band",
                    )
                )
            elif tip_hash != self._hash_at(tip_sequence):
                failures.append((tip_sequence, "the chain tip's hash does not match the chain"))
        first_bad: int | None = None
        problem: str | None = None
        if failures:
            first_bad, problem = min(failures, key=lambda failure: failure[0])
        return VerificationReport(
            ok=not failures,
            entries_verified=last_good,
            last_sequence=last_good,
            head_hash=self._hash_at(last_good),
            heads_verified=heads_verified,
            key_source=key_source,
            first_bad_sequence=first_bad,
            problem=problem,
            notes=tuple(notes),
        )

    def _check_head(self, head: HeadRecord, last_good: int) -> tuple[int, str] | None:
        sequence = head.sequence
        if self._pinned_key is not None and head.signer_public_key != self._pinned_key:
            return (
                sequence,
                f"signed head at sequence {sequence} is signed by {head.signer_public_key.hex()},"
                " not the pinned coordinator key (forged head)",
            )
        if not verify_signature(
            head.signer_public_key,
            head.signature,
            chain_head_message(head.network_id, sequence, head.head_hash),
        ):
            return (
                sequence,
                f"signed head at sequence {sequence} has an invalid signature (forged head)",
            )
        if sequence > last_good:
            return (
                last_good + 1,
                f"a signed head vouches for sequence {sequence} but the chain ends at"
                f" {last_good} (entries removed)",
            )
        if self._hash_at(sequence) != head.head_hash:
            return (
                sequence,
                f"the chain does not match the signed head at sequence {sequence}"
                " (entries up to it were rewritten)",
            )
        return None


def verify_records(
    entries: Iterable[EntryRecord],
    heads: Iterable[HeadRecord],
    *,
    tip: tuple[int, bytes] | None = None,
    pinned_key: bytes | None = None,
) -> VerificationReport:
    """Verify entries (in stored order), signed heads and, optionally, the claimed tip."""
    verifier = ChainVerifier(pinned_key)
    for entry in entries:
        verifier.add_entry(entry)
        if verifier.failed:
            break
    for head in heads:
        verifier.add_head(head)
    if tip is not None:
        verifier.set_tip(*tip)
    return verifier.finish()


class ExportFormatError(ValueError):
    """The export file is not in the ``rollnet.ledger.export`` format."""


@dataclass(frozen=True, slots=True)
class SpanResult:
    """What :func:`verify_span` found in one byte range of an export file."""

    #: Sequence and prev hash of the span's first entry (None: the span has no entries).
    first_sequence: int | None
    first_prev_hash: bytes
    #: Recomputed hashes of the entries verified, in order, 32 bytes each.
    hashes: bytes
    #: The first failing entry in the span, if any (entries after it were not checked).
    failure: tuple[int, str] | None
    heads: list[HeadRecord]


#: Exports at least this large are verified by several processes (one span each).
PARALLEL_THRESHOLD_BYTES = 64 * 1024 * 1024


def verify_span(path: str, start: int, end: int) -> SpanResult:
    """Verify the lines that begin in bytes ``[start, end)`` of an export (after its header).

    Entry hashes and the links between consecutive entries are checked here; the link into the
    span's first entry is checked when spans are stitched (:meth:`ChainVerifier.absorb_span`).
    The checks are those of :meth:`ChainVerifier.add_entry_fields`, inlined: this loop is the
    verifier's hot path. Raises :class:`ExportFormatError` on a malformed line.
    """
    # raw_decode skips json.loads's per-call set-up (measurably faster per line); checking that
    # the value spans the whole stripped line keeps loads's strictness.
    decode = json.JSONDecoder().raw_decode
    fromhex = bytes.fromhex
    first_sequence: int | None = None
    first_prev_hash = GENESIS_HASH
    expected = 0
    prev_hash = GENESIS_HASH
    prev_hex = ""
    hashes = bytearray()
    failure: tuple[int, str] | None = None
    heads: list[HeadRecord] = []
    with open(path, "rb") as lines:
        lines.seek(start)
        position = start
        for raw in lines:
            if position >= end:
                break
            offset = position
            position += len(raw)
            # Once an entry failed only heads still matter (they can follow the entries).
            if failure is not None and b'"signed_head"' not in raw:
                continue
            try:
                text = raw.decode().strip()
                record, end_of_value = decode(text)
                if end_of_value != len(text):
                    raise ValueError("data after the JSON value")
                kind_of_line = record["type"]
                if kind_of_line == "entry":
                    sequence = record["sequence"]
                    if first_sequence is None:
                        first_sequence = expected = sequence
                        prev_hex = record["prev_hash"]
                        prev_hash = first_prev_hash = fromhex(prev_hex)
                    if sequence != expected:
                        failure = _sequence_failure(expected, sequence)
                        continue
                    if record["prev_hash"] != prev_hex:
                        failure = _link_failure(sequence)
                        continue
                    try:
                        canonical = encode_entry(
                            sequence,
                            record["time_us"],
                            record["node_id"],
                            record["kind"],
                            record["amount"],
                            record["commitment_id"],
                            record["verdict_id"],
                            record["memo"],
                        )
                    except (ValueError, TypeError, AttributeError) as exc:
                        failure = _encoding_failure(sequence, exc)
                        continue
                    computed = blake3(prev_hash + canonical).digest()
                    prev_hex = computed.hex()
                    if prev_hex != record["entry_hash"]:
                        failure = _hash_failure(sequence)
                        continue
                    hashes += computed
                    prev_hash = computed
                    expected += 1
                elif kind_of_line == "signed_head":
                    heads.append(
                        HeadRecord(
                            network_id=record["network_id"],
                            sequence=int(record["sequence"]),
                            head_hash=fromhex(record["head_hash"]),
                            signer_public_key=fromhex(record["signer_public_key"]),
                            signature=fromhex(record["signature"]),
                        )
                    )
                else:
                    raise ExportFormatError(f"unknown line type {kind_of_line!r}")
            except (KeyError, TypeError, ValueError) as exc:  # incl. JSON and Unicode errors
                raise ExportFormatError(f"{path}: malformed line at byte {offset}: {exc}") from exc
    return SpanResult(
        first_sequence=first_sequence,
        first_prev_hash=first_prev_hash,
        hashes=bytes(hashes),
        failure=failure,
        heads=heads,
    )


def _read_header(path: Path | str) -> tuple[tuple[int, bytes], int]:
    """The tip the header claims and the byte offset where the body starts."""
    with open(path, "rb") as lines:
        header_raw = lines.readline()
        body_start = lines.tell()
    try:
        header = json.loads(header_raw)
    except json.JSONDecodeError as exc:
        raise ExportFormatError(f"{path}: first line is not JSON: {exc}") from exc
    if (
        not isinstance(header, dict)
        or header.get("type") != "header"
        or header.get("format") != EXPORT_FORMAT
    ):
        raise ExportFormatError(f"{path}: not a {EXPORT_FORMAT} file")
    if header.get("version") != EXPORT_VERSION:
        raise ExportFormatError(f"{path}: unsupported export version {header.get('version')}")
    try:
        tip = (int(header["tip_sequence"]), bytes.fromhex(header["tip_hash"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ExportFormatError(f"{path}: malformed header: {exc}") from exc
    return tip, body_start


def _span_bounds(path: Path | str, body_start: int, spans: int) -> list[tuple[int, int]]:
    """Split the body into ``spans`` byte ranges, each starting at the beginning of a line."""
    size = os.path.getsize(path)
    cuts = [body_start]
    with open(path, "rb") as lines:
        for i in range(1, spans):
            target = body_start + (size - body_start) * i // spans
            if target <= cuts[-1]:
                continue
            lines.seek(target - 1)
            lines.readline()  # finish the line that straddles the cut
            if lines.tell() < size and lines.tell() > cuts[-1]:
                cuts.append(lines.tell())
    cuts.append(size)
    return list(itertools.pairwise(cuts))


def verify_export(
    path: Path | str, *, pinned_key: bytes | None = None, workers: int | None = None
) -> VerificationReport:
    """Verify a JSON Lines export written by ``rollnet ledger export``.

    Large exports are verified by ``workers`` processes (default: one per CPU for files of at
    least :data:`PARALLEL_THRESHOLD_BYTES`, else one), each hashing one span of the file; the
    spans are stitched in order, so the result is identical to a sequential pass.
    """
    tip, body_start = _read_header(path)
    if workers is None:
        big = os.path.getsize(path) >= PARALLEL_THRESHOLD_BYTES
        workers = min(os.cpu_count() or 1, 8) if big else 1
    verifier = ChainVerifier(pinned_key)
    verifier.set_tip(*tip)
    bounds = _span_bounds(path, body_start, max(workers, 1))
    if workers <= 1 or len(bounds) == 1:
        for start, end in bounds:
            verifier.absorb_span(verify_span(str(path), start, end))
        return verifier.finish()
    # spawn, not fork: the caller may be multi-threaded (a server, a test runner). The calling
    # process verifies the first span itself while the workers take the others.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=len(bounds) - 1, mp_context=context) as pool:
        futures = [pool.submit(verify_span, str(path), start, end) for start, end in bounds[1:]]
        verifier.absorb_span(verify_span(str(path), *bounds[0]))
        for future in futures:
            verifier.absorb_span(future.result())
    return verifier.finish()
