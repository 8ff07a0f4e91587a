"""Blobs, commitments and checkpoints: immutable records, written once.

Writes are idempotent where the protocol retries: recording the same blob or checkpoint twice is
a no-op, recording a conflicting one is an error. The one later change is a blob's ``pruned_at``:
the bytes of uncredited work are deleted after a retention period, the row stays.

The statements on the commitment path (one per lease cycle) are built once at import and run as
Core statements: building and caching an ORM query costs more than SQLite takes to run it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.orm import Session

from rollnet.ledger.models import Blob, Checkpoint, Commitment, table_of
from rollnet.ledger.prepared import Prepared, prepared_insert


class ConflictError(ValueError):
    """A record with the same key but different contents already exists."""


def record_blob(
    session: Session,
    *,
    blake3_hex: str,
    size: int,
    location: str,
    uploader_id: str | None,
    now: datetime,
) -> None:
    """Record a stored blob; recording the same hash and size again is a no-op (one pruned
    meanwhile, whose bytes the caller has stored again, is no longer pruned)."""
    existing = _BLOB_SIZE.scalar(session, {"hash": blake3_hex})
    if existing is not None:
        if existing != size:
            raise ConflictError(f"blob {blake3_hex} already recorded with size {existing}")
        session.execute(
            update(Blob)
            .where(Blob.hash == blake3_hex, Blob.pruned_at.is_not(None))
            .values(pruned_at=None)
        )
        return
    _INSERT_BLOB.run(
        session,
        {
            "hash": blake3_hex,
            "size": size,
            "location": location,
            "uploader_id": uploader_id,
            "created_at": now,
            "pruned_at": None,
        },
    )


def mark_blobs_pruned(session: Session, blake3_hexes: Sequence[str], *, now: datetime) -> int:
    """Record that these blobs' bytes were deleted (rows kept); returns how many changed."""
    if not blake3_hexes:
        return 0
    result = session.execute(
        update(Blob)
        .where(Blob.hash.in_(list(blake3_hexes)), Blob.pruned_at.is_(None))
        .values(pruned_at=now)
        .execution_options(synchronize_session=False)
    )
    return int(getattr(result, "rowcount", 0) or 0)


def get_blob(session: Session, blake3_hex: str) -> Blob | None:
    """The blob with this BLAKE3 hex digest, if recorded."""
    return session.get(Blob, blake3_hex)


def unpruned_blobs(session: Session, blake3_hexes: Sequence[str]) -> set[str]:
    """Those of ``blake3_hexes`` whose blob is recorded and its bytes not pruned."""
    if not blake3_hexes:
        return set()
    return set(
        session.scalars(
            select(Blob.hash).where(Blob.hash.in_(list(blake3_hexes)), Blob.pruned_at.is_(None))
        )
    )


@dataclass(frozen=True, slots=True)
class NewCommitment:
    """A worker's signed commitment to the rollouts of one lease."""

    commitment_id: str
    task_id: str
    node_id: str
    lease_id: str
    fencing_token: int
    rollout_blob_hash: str
    proof_blob_hash: str | None
    sampling_seed: int
    claimed_work: int
    request_id: str
    signature: bytes
    #: The serialized protocol record of the commitment, stored verbatim.
    record: bytes | None = None


def record_commitment(session: Session, commitment: NewCommitment, *, now: datetime) -> None:
    """Store a commitment. The (task, fencing token) pair is unique: one commitment per lease."""
    _INSERT_COMMITMENT.run(
        session,
        {
            "id": commitment.commitment_id,
            "task_id": commitment.task_id,
            "node_id": commitment.node_id,
            "lease_id": commitment.lease_id,
            "fencing_token": commitment.fencing_token,
            "rollout_blob_hash": commitment.rollout_blob_hash,
            "proof_blob_hash": commitment.proof_blob_hash,
            "sampling_seed": commitment.sampling_seed,
            "claimed_work": commitment.claimed_work,
            "request_id": commitment.request_id,
            "signature": commitment.signature,
            "received_at": now,
            "record": commitment.record,
        },
    )


def get_commitment(session: Session, commitment_id: str) -> Commitment | None:
    """The commitment with this id, if any."""
    return session.get(Commitment, commitment_id)


def record_checkpoint(
    session: Session,
    *,
    step: int,
    manifest: bytes,
    manifest_hash: str,
    signature: bytes,
    signer_public_key: bytes,
    publisher_id: str | None,
    now: datetime,
) -> Checkpoint:
    """Store a signed checkpoint manifest; publishing the identical manifest again is a no-op."""
    existing = session.get(Checkpoint, step)
    if existing is not None:
        if existing.manifest_hash != manifest_hash:
            raise ConflictError(f"checkpoint step {step} already published with another manifest")
        return existing
    row = Checkpoint(
        step=step,
        manifest=manifest,
        manifest_hash=manifest_hash,
        signature=signature,
        signer_public_key=signer_public_key,
        publisher_id=publisher_id,
        published_at=now,
    )
    session.add(row)
    session.flush()
    return row


def get_checkpoint(session: Session, step: int) -> Checkpoint | None:
    """The checkpoint published for ``step``, if any."""
    return session.get(Checkpoint, step)


def manifests_after(session: Session, step: int) -> Iterator[tuple[int, bytes]]:
    """``(step, manifest)`` of every checkpoint published for a step above ``step``, in step
    order, read as they are iterated."""
    rows = session.execute(
        select(Checkpoint.step, Checkpoint.manifest)
        .where(Checkpoint.step > step)
        .order_by(Checkpoint.step)
    )
    return ((step, manifest) for step, manifest in rows)


def latest_checkpoint(session: Session) -> Checkpoint | None:
    """The checkpoint with the highest step, if any."""
    return session.scalars(select(Checkpoint).order_by(Checkpoint.step.desc()).limit(1)).first()


def find_commitment(session: Session, task_id: str, fencing_token: int) -> Commitment | None:
    """The commitment made under one lease attempt of a task, if any (at most one exists)."""
    found = _COMMITMENT_OF_LEASE.scalar(
        session, {"task_id": task_id, "fencing_token": fencing_token}
    )
    return None if found is None else session.get(Commitment, found)


def latest_checkpoint_step(session: Session) -> int | None:
    """The highest published step, without loading its manifest."""
    step = _LATEST_STEP.scalar(session, {})
    return None if step is None else int(step)


_BLOBS = table_of(Blob)
_COMMITMENTS = table_of(Commitment)
_BLOB_SIZE = Prepared(select(_BLOBS.c.size).where(_BLOBS.c.hash == bindparam("hash")))
_INSERT_BLOB = prepared_insert(_BLOBS)
_INSERT_COMMITMENT = prepared_insert(_COMMITMENTS)
_COMMITMENT_OF_LEASE = Prepared(
    select(_COMMITMENTS.c.id).where(
        _COMMITMENTS.c.task_id == bindparam("task_id"),
        _COMMITMENTS.c.fencing_token == bindparam("fencing_token"),
    )
)
_LATEST_STEP = Prepared(select(func.max(table_of(Checkpoint).c.step)))
