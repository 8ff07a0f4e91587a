"""What tasks and validation jobs share: lease ids and the outcome of using a lease."""

from __future__ import annotations

import secrets
from enum import StrEnum


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


def new_lease_id() -> str:
    """A fresh random lease id (128 bits, hex)."""
    return secrets.token_hex(16)
