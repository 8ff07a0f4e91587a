"""Validation jobs and verdicts.

A validation job is leased to a validator exactly like a task is leased to a worker
(``FOR UPDATE SKIP LOCKED`` on PostgreSQL, the single writer on SQLite; fencing token = attempt).
A verdict is stored in the same transaction that completes the job, and only by the holder of
the job's current, unexpired lease.
"""

from __future__ import annotations

import secrets
import struct
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, or_, select, update
from sqlalchemy.orm import Session

from rollnet.ledger import tasks
from rollnet.ledger.attempts import EndedLease, record_attempts
from rollnet.ledger.enums import AttemptOutcome, TaskState, ValidationJobState
from rollnet.ledger.leases import LeaseClaim, LeaseOutcome, claim_outcome, new_lease_id
from rollnet.ledger.models import Blob, Commitment, ValidationJob, Verdict, table_of
from rollnet.ledger.prepared import prepared_insert


@dataclass(frozen=True, slots=True)
class LeasedValidationJob:
    """A validation job handed to a validator, with its lease."""

    job_id: str
    commitment_id: str
    lease_id: str
    fencing_token: int
    lease_deadline: datetime


def enqueue_validation_job(
    session: Session,
    *,
    job_id: str,
    commitment_id: str,
    now: datetime,
    check_probability: float = 1.0,
) -> None:
    """Queue the validation of ``commitment_id`` (one job per commitment), chosen for
    validation with ``check_probability`` (in (0, 1])."""
    _INSERT_JOB.run(
        session,
        {
            "id": job_id,
            "commitment_id": commitment_id,
            "state": ValidationJobState.QUEUED,
            "attempt": 0,
            "fencing_token": 0,
            "check_probability": check_probability,
            "created_at": now,
            "updated_at": now,
        },
    )


def lease_next_validation_job(
    session: Session, *, node_id: str, now: datetime, lease_duration: timedelta
) -> LeasedValidationJob | None:
    """Lease the oldest queued validation job to validator ``node_id``, atomically."""
    job_id = session.scalar(
        select(ValidationJob.id)
        .where(ValidationJob.state == ValidationJobState.QUEUED)
        .order_by(ValidationJob.created_at, ValidationJob.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    if job_id is None:
        return None
    lease_id = new_lease_id()
    deadline = now + lease_duration
    row = session.execute(
        update(ValidationJob)
        .where(ValidationJob.id == job_id, ValidationJob.state == ValidationJobState.QUEUED)
        .values(
            state=ValidationJobState.LEASED,
            attempt=ValidationJob.attempt + 1,
            fencing_token=ValidationJob.attempt + 1,
            lease_id=lease_id,
            lease_holder=node_id,
            lease_deadline=deadline,
            updated_at=now,
        )
        .returning(ValidationJob.commitment_id, ValidationJob.fencing_token)
        .execution_options(synchronize_session=False)
    ).one_or_none()
    if row is None:  # pragma: no cover - the row is locked (PostgreSQL) or we are the writer
        return None
    return LeasedValidationJob(
        job_id=job_id,
        commitment_id=row.commitment_id,
        lease_id=lease_id,
        fencing_token=row.fencing_token,
        lease_deadline=deadline,
    )


def submit_verdict(
    session: Session,
    claim: LeaseClaim,
    *,
    verdict_id: str,
    accepted: bool,
    reasons: Sequence[str],
    check_figures: Mapping[str, Any],
    awarded_work: int,
    validated_logprobs: bytes | None = None,
) -> LeaseOutcome:
    """Complete a leased job (``claim.work_id``) and store its verdict, if the validator
    (``claim.node_id``) holds the current lease.

    ``validated_logprobs`` is :func:`pack_logprobs` of the validator's recomputed
    log-probabilities (``None`` when it sent none)."""
    now = claim.now
    commitment_id = session.execute(
        update(ValidationJob)
        .where(
            ValidationJob.id == claim.work_id,
            ValidationJob.state == ValidationJobState.LEASED,
            ValidationJob.lease_id == claim.lease_id,
            ValidationJob.fencing_token == claim.fencing_token,
            ValidationJob.lease_holder == claim.node_id,
            ValidationJob.lease_deadline > now,
        )
        .values(state=ValidationJobState.DONE, updated_at=now)
        .returning(ValidationJob.commitment_id)
        .execution_options(synchronize_session=False)
    ).scalar_one_or_none()
    if commitment_id is None:
        return _refusal(session, claim)
    session.add(
        Verdict(
            id=verdict_id,
            validation_job_id=claim.work_id,
            commitment_id=commitment_id,
            validator_id=claim.node_id,
            accepted=accepted,
            reasons=list(reasons),
            check_figures=dict(check_figures),
            awarded_work=awarded_work,
            decided_at=now,
            validated_logprobs=validated_logprobs,
        )
    )
    session.flush()
    return LeaseOutcome.OK


_COUNT = struct.Struct("<I")


def pack_logprobs(rollouts: Iterable[Sequence[float]]) -> bytes:
    """The stored form of per-rollout log-probabilities: little-endian ``uint32`` rollout
    count, one ``uint32`` value count per rollout, then every value as ``float32`` in order.

    Values must be float32-representable (they come off the wire as ``float``); 4 bytes per
    token, the same as the wire, and read back without parsing anything but two arrays.
    """
    rows = [array("f", values) for values in rollouts]
    counts = array("I", (len(row) for row in rows))
    values = array("f")
    for row in rows:
        values.extend(row)
    if sys.byteorder == "big":  # pragma: no cover - stored little-endian everywhere
        counts.byteswap()
        values.byteswap()
    return _COUNT.pack(len(rows)) + counts.tobytes() + values.tobytes()


def unpack_logprobs(data: bytes) -> list[list[float]]:
    """The per-rollout log-probabilities :func:`pack_logprobs` stored; ``ValueError`` when the
    bytes are not exactly what it writes."""
    damaged = ValueError("packed log-probabilities are truncated or padded")
    if len(data) < _COUNT.size or len(data) % 4:
        raise damaged
    (rollouts,) = _COUNT.unpack_from(data)
    head = _COUNT.size + 4 * rollouts
    if head > len(data):
        raise damaged
    counts = array("I")
    counts.frombytes(data[_COUNT.size : head])
    values = array("f")
    values.frombytes(data[head:])
    if sys.byteorder == "big":  # pragma: no cover
        counts.byteswap()
        values.byteswap()
    if sum(counts) != len(values):
        raise damaged
    out: list[list[float]] = []
    start = 0
    for count in counts:
        out.append(values[start : start + count].tolist())
        start += count
    return out


def _refusal(session: Session, claim: LeaseClaim) -> LeaseOutcome:
    """Why :func:`submit_verdict`'s UPDATE matched nothing (read right after it)."""
    job = session.get(ValidationJob, claim.work_id, populate_existing=True)
    if job is None:
        return LeaseOutcome.UNKNOWN
    outcome = claim_outcome(
        claim,
        job,
        handed_in=job.state is ValidationJobState.DONE,
        leased=job.state is ValidationJobState.LEASED,
    )
    # OK here means the UPDATE would have matched: only a race with the deadline gets here.
    return LeaseOutcome.LEASE_EXPIRED if outcome is LeaseOutcome.OK else outcome


def requeue_expired_validation_jobs(
    session: Session, *, now: datetime, max_attempts: int
) -> tasks.RequeueResult:
    """Take back every job lease whose deadline has passed: requeue, or fail after the cap.

    Validators are allow-listed, so a job that keeps coming back is not a validator cheating but
    a job none can finish (its inputs cannot be had, or it takes validators down with it): after
    ``max_attempts`` leases it is FAILED rather than retried forever, and settled (see
    :func:`settle_failed_jobs`).
    """
    return _take_back(session, ValidationJob.lease_deadline <= now, now, max_attempts)


def settle_failed_jobs(session: Session, job_ids: Sequence[str], *, now: datetime) -> list[str]:
    """Settle FAILED validation jobs: each one's task is FAILED and its work queued again.

    Nobody could check the work, so there is neither credit nor slash; the prompts still need
    rollouts, so a fresh copy of the task is queued. Returns the new tasks' ids. Jobs taken back
    by :func:`requeue_expired_validation_jobs` and :func:`requeue_validation_jobs_of_node` are
    settled there; settling again changes nothing.
    """
    fresh: list[str] = []
    for job_id in job_ids:
        commitment = session.scalars(
            select(Commitment)
            .join(ValidationJob, ValidationJob.commitment_id == Commitment.id)
            .where(ValidationJob.id == job_id, ValidationJob.state == ValidationJobState.FAILED)
        ).one_or_none()
        if commitment is None:
            continue
        task_id = commitment.task_id
        if any(
            tasks.transition_task(
                session, task_id, from_state=state, to_state=TaskState.FAILED, now=now
            )
            for state in (TaskState.SUBMITTED, TaskState.VALIDATING)
        ):
            ended = EndedLease(
                task_id, commitment.node_id, commitment.lease_id, commitment.fencing_token
            )
            record_attempts(session, [ended], outcome=AttemptOutcome.UNVALIDATED, now=now)
            new_task_id = secrets.token_hex(12)
            tasks.requeue_copy(session, task_id, new_task_id=new_task_id, now=now)
            fresh.append(new_task_id)
    return fresh


def get_verdict_for_commitment(session: Session, commitment_id: str) -> Verdict | None:
    """The verdict on ``commitment_id``, if one was submitted."""
    return session.scalars(
        select(Verdict).where(Verdict.commitment_id == commitment_id).limit(1)
    ).one_or_none()


def get_job(session: Session, job_id: str) -> ValidationJob | None:
    """The validation job with ``job_id``, if any."""
    return session.get(ValidationJob, job_id)


def requeue_validation_jobs_of_node(
    session: Session, node_id: str, *, now: datetime, max_attempts: int
) -> tasks.RequeueResult:
    """Take back every job lease ``node_id`` holds (it left or went offline); fail and settle
    after the cap, as :func:`requeue_expired_validation_jobs` does."""
    return _take_back(session, ValidationJob.lease_holder == node_id, now, max_attempts)


def _take_back(
    session: Session, condition: Any, now: datetime, max_attempts: int
) -> tasks.RequeueResult:
    rows = session.execute(
        update(ValidationJob)
        .where(ValidationJob.state == ValidationJobState.LEASED, condition)
        .values(
            state=case(
                (ValidationJob.attempt >= max_attempts, ValidationJobState.FAILED),
                else_=ValidationJobState.QUEUED,
            ),
            updated_at=now,
        )
        .returning(ValidationJob.id, ValidationJob.state)
        .execution_options(synchronize_session=False)
    ).all()
    failed = sorted(r.id for r in rows if r.state == ValidationJobState.FAILED)
    settle_failed_jobs(session, failed, now=now)
    return tasks.RequeueResult(
        requeued=sorted(r.id for r in rows if r.state == ValidationJobState.QUEUED), failed=failed
    )


def count_rejected_commitments(session: Session, node_id: str) -> int:
    """How many of ``node_id``'s commitments a validator rejected."""
    from sqlalchemy import func

    count = session.scalar(
        select(func.count())
        .select_from(Verdict)
        .join(Commitment, Commitment.id == Verdict.commitment_id)
        .where(Commitment.node_id == node_id, Verdict.accepted.is_(False))
    )
    return int(count or 0)


def has_queued_validation_job(session: Session) -> bool:
    """Whether a validation job waits (a cheap read before trying to lease one)."""
    return (
        session.scalar(
            select(ValidationJob.id)
            .where(ValidationJob.state == ValidationJobState.QUEUED)
            .limit(1)
        )
        is not None
    )


_INSERT_JOB = prepared_insert(
    table_of(ValidationJob),
    [
        "id",
        "commitment_id",
        "state",
        "attempt",
        "fencing_token",
        "check_probability",
        "created_at",
        "updated_at",
    ],
)


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """A validation job that ended (DONE or FAILED), in the order jobs ended."""

    job_id: str
    ended_at: datetime
    #: The rollout batch's digest (hex) when the job earned no credit (rejected, or FAILED) and
    #: the batch has not been pruned yet; None otherwise.
    uncredited_blob: str | None


def finished_jobs(
    session: Session,
    *,
    ended_before: datetime,
    after: tuple[datetime, str] | None,
    limit: int,
) -> list[FinishedJob]:
    """Validation jobs that ended before ``ended_before``, after the position ``after`` (ended
    at, job id) in (ended at, id) order: at most ``limit``, each with its batch if that batch
    is uncredited work not pruned yet (what the retention sweep deletes)."""
    ended = ValidationJob.state.in_((ValidationJobState.DONE, ValidationJobState.FAILED))
    window = [ended, ValidationJob.updated_at < ended_before]
    if after is not None:
        at, job_id = after
        window.append(
            or_(
                ValidationJob.updated_at > at,
                and_(ValidationJob.updated_at == at, ValidationJob.id > job_id),
            )
        )
    uncredited = and_(
        Blob.pruned_at.is_(None),
        or_(ValidationJob.state == ValidationJobState.FAILED, Verdict.accepted.is_(False)),
    )
    rows = session.execute(
        select(
            ValidationJob.id,
            ValidationJob.updated_at,
            case((uncredited, Blob.hash), else_=None),
        )
        .join(Commitment, Commitment.id == ValidationJob.commitment_id)
        .join(Blob, Blob.hash == Commitment.rollout_blob_hash)
        .outerjoin(Verdict, Verdict.validation_job_id == ValidationJob.id)
        .where(*window)
        .order_by(ValidationJob.updated_at, ValidationJob.id)
        .limit(limit)
    )
    return [FinishedJob(job_id, at, blob) for job_id, at, blob in rows]
