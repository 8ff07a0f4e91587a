"""Independent verification of the hash-chained ledger.

Recomputes every entry hash from the entry's own fields (never trusting the stored hash), checks
that each entry links to its predecessor and that sequence numbers run 1, 2, 3, … without gaps,
and checks every signed chain head: its Ed25519 signature, and that the chain still has the
signed hash at the signed sequence. Verification of an export needs only this module,
:mod:`rollnet.ledger.canonical`, ``blake3`` and ``cryptography`` — no database and no
coordinator code.

The first bad sequence number is reported: the first entry that fails its checks, or the sequence
of the first signed head the chain contradicts (or that is forged), whichever is lower.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from rollnet.ledger.canonical import (
    GENESIS_HASH,
    HASH_SIZE,
    canonical_entry_bytes,
    chain_hash,
    chain_head_message,
)
from rollnet.ledger.export_format import EXPORT_FORMAT, EXPORT_VERSION


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


class ChainVerifier:
    """Streaming verifier: feed entries in sequence order and heads in any order, then finish.

    Memory: 32 bytes per entry (the recomputed hashes, kept to check heads signed at any
    sequence).
    """

    def __init__(self, pinned_key: bytes | None = None) -> None:
        if pinned_key is not None and len(pinned_key) != HASH_SIZE:
            raise ValueError("a pinned Ed25519 public key is 32 bytes")
        self._pinned_key = pinned_key
        self._expected = 1
        self._prev_hash = GENESIS_HASH
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
            self._entry_failure = (
                expected,
                f"expected entry {expected} but found sequence {sequence}"
                " (entries missing, reordered or duplicated)",
            )
            return
        if prev_hash != self._prev_hash:
            self._entry_failure = (
                sequence,
                f"prev_hash of entry {sequence} is not the hash of entry {sequence - 1}"
                " (entries reordered, removed or replaced)",
            )
            return
        try:
            canonical = canonical_entry_bytes(
                sequence=sequence,
                time_us=time_us,
                node_id=node_id,
                kind=kind,
                amount=amount,
                commitment_id=commitment_id,
                verdict_id=verdict_id,
                memo=memo,
            )
        except (ValueError, TypeError, AttributeError) as exc:
            self._entry_failure = (sequence, f"entry {sequence} cannot be encoded: {exc}")
            return
        computed = chain_hash(prev_hash, canonical)
        if computed != entry_hash:
            self._entry_failure = (
                sequence,
                f"entry {sequence}'s contents do not hash to its entry_hash (entry altered)",
            )
            return
        self._hashes += computed
        self._prev_hash = computed
        self._expected = expected + 1

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
        for head in sorted(self._heads, key=lambda h: h.sequence):
            head_failure = self._check_head(head, last_good)
            if head_failure is not None:
                failures.append(head_failure)
            else:
                heads_verified += 1
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
        try:
            key = Ed25519PublicKey.from_public_bytes(head.signer_public_key)
            key.verify(
                head.signature, chain_head_message(head.network_id, sequence, head.head_hash)
            )
        except (InvalidSignature, ValueError):
            return (
                sequence,
                f"signed head at sequence {sequence} has an invalid signature (forged head)",
            )
        if sequence > last_good:
            if self._entry_failure is not None:
                # The chain already failed earlier; this head cannot be compared.
                return None
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


def verify_export(path: Path | str, *, pinned_key: bytes | None = None) -> VerificationReport:
    """Verify a JSON Lines export written by ``rollnet ledger export``."""
    verifier = ChainVerifier(pinned_key)
    loads = json.loads
    fromhex = bytes.fromhex
    add_entry = verifier.add_entry_fields
    with open(path, encoding="utf-8") as lines:
        header_raw = lines.readline()
        try:
            header = loads(header_raw)
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
        verifier.set_tip(int(header["tip_sequence"]), fromhex(header["tip_hash"]))
        for line_number, line in enumerate(lines, start=2):
            # Once an entry failed only heads still matter (they can follow the entries).
            if verifier.failed and '"signed_head"' not in line:
                continue
            try:
                record = loads(line)
                kind_of_line = record["type"]
                if kind_of_line == "entry":
                    add_entry(
                        record["sequence"],
                        record["time_us"],
                        record["node_id"],
                        record["kind"],
                        record["amount"],
                        record["commitment_id"],
                        record["verdict_id"],
                        record["memo"],
                        fromhex(record["prev_hash"]),
                        fromhex(record["entry_hash"]),
                    )
                elif kind_of_line == "signed_head":
                    verifier.add_head(
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
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ExportFormatError(f"{path}:{line_number}: malformed line: {exc}") from exc
    return verifier.finish()
