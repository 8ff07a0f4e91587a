"""What tasks and validation jobs share: lease ids, the claim to hold a lease, the outcome of
using one, and extending the leases nodes hold."""

from __future__ import annotations

import secrets
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import tuple_, update
from sqlalchemy.orm import Session

from rollnet.ledger.enums import TaskState, ValidationJobState
from rollnet.ledger.models import Task, ValidationJob


class LeaseOutcome(StrEnum):
    """Result of a lease-guarded write (submit, extend, give back, complete)."""

    #: The write happened.
    OK = "ok"
    #: No such task or job.
    UNKNOWN = "unknown"
    #: The lease matches but the work was already submitted (a duplicate).
    ALREADY_SUBMITTED = "already_submitted"
    #: The caller's lease id or fencing token is not the current one: the work was re-leased.
    STALE_LEASE = "stale_lease"
    #: The lease belongs to another node.
    WRONG_HOLDER = "wrong_holder"
    #: The lease is current but its deadline has passed.
    LEASE_EXPIRED = "lease_expired"
    #: The task or job is not leased (queued, failed, …) and the lease does not match.
    NOT_LEASED = "not_leased"


@dataclass(frozen=True, slots=True)
class LeaseClaim:
    """A node's claim, made at ``now``, to hold the current lease on a task or validation job:
    what every lease-guarded write checks before it writes."""

    #: The task's id, or the validation job's.
    work_id: str
    lease_id: str
    fencing_token: int
    #: The node that claims to hold the lease.
    node_id: str
    now: datetime


def claim_outcome(
    claim: LeaseClaim, work: Task | ValidationJob, *, handed_in: bool, leased: bool
) -> LeaseOutcome:
    """How ``claim`` stands against ``work``'s current lease (the row as read now): another
    lease or fencing token is stale, another node is the wrong holder, work already handed in
    (``handed_in``) is a duplicate; otherwise :func:`deadline_outcome`. ``OK``: the claim holds."""
    if work.lease_id != claim.lease_id or work.fencing_token != claim.fencing_token:
        return LeaseOutcome.STALE_LEASE
    if work.lease_holder != claim.node_id:
        return LeaseOutcome.WRONG_HOLDER
    if handed_in:
        return LeaseOutcome.ALREADY_SUBMITTED
    return deadline_outcome(leased, work.lease_deadline, claim.now)


def deadline_outcome(leased: bool, lease_deadline: datetime | None, now: datetime) -> LeaseOutcome:
    """The outcome of using a lease at ``now``: one whose deadline passed is expired whether or
    not a sweep took its work back yet; one taken back before (``leased`` false: given back,
    its node offline or ejected) is closed."""
    if lease_deadline is not None and lease_deadline <= now:
        return LeaseOutcome.LEASE_EXPIRED
    return LeaseOutcome.OK if leased else LeaseOutcome.NOT_LEASED


def new_lease_id() -> str:
    """A fresh random lease id (128 bits, hex)."""
    return secrets.token_hex(16)


def extend_leases(
    session: Session,
    holders: Collection[tuple[str, str]],
    *,
    now: datetime,
    lease_duration: timedelta,
) -> set[str]:
    """Extend many live task and validation-job leases at once to ``now + lease_duration``;
    ``holders`` are ``(lease id, holder node id)``.

    One UPDATE per kind; returns the lease ids that were live, held by the named node, and
    extended.
    """
    pairs = sorted(set(holders))
    if not pairs:
        return set()
    extended: set[str] = set()
    for model, leased in ((Task, TaskState.LEASED), (ValidationJob, ValidationJobState.LEASED)):
        rows = session.execute(
            update(model)
            .where(
                tuple_(model.lease_id, model.lease_holder).in_(pairs),
                model.state == leased,
                model.lease_deadline > now,
            )
            .values(lease_deadline=now + lease_duration, updated_at=now)
            .returning(model.lease_id)
            .execution_options(synchronize_session=False)
        )
        extended.update(row.lease_id for row in rows)
    return extended
