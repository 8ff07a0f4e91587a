"""Lifecycle enums of the coordinator's state, stored as short strings.

Each enum is a ``StrEnum`` so its value is what the database holds; every column that stores one
carries a CHECK constraint listing exactly these values (see :mod:`rollnet.ledger.models`).
"""

from __future__ import annotations

from enum import StrEnum


class NodeRole(StrEnum):
    """What a node may do in the network."""

    WORKER = "worker"
    VALIDATOR = "validator"
    TRAINER = "trainer"
    OPERATOR = "operator"
    RELAY = "relay"
    """Caches and serves checkpoints; reads only, never leases work."""


class NodeState(StrEnum):
    """Lifecycle of a registered node."""

    PENDING = "pending"
    ACTIVE = "active"
    SUSPECT = "suspect"
    OFFLINE = "offline"
    EJECTED = "ejected"
    BANNED = "banned"
    DEREGISTERED = "deregistered"


#: States from which a heartbeat may (re)activate a node. Ejected, banned and deregistered nodes
#: stay where they are: only an operator action can move them.
HEARTBEAT_REVIVABLE_STATES: frozenset[NodeState] = frozenset(
    {NodeState.PENDING, NodeState.ACTIVE, NodeState.SUSPECT, NodeState.OFFLINE}
)


class TaskState(StrEnum):
    """Lifecycle of a rollout task."""

    QUEUED = "queued"
    LEASED = "leased"
    SUBMITTED = "submitted"
    VALIDATING = "validating"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    FAILED = "failed"
    #: Ended unleased: while it was queued its checkpoint fell more than ``async_level`` steps
    #: behind the newest, so no worker may take it any more (the coordinator's sweep ends it).
    EXPIRED = "expired"


class AttemptOutcome(StrEnum):
    """How a task's lease ended without credit (a row of ``task_attempts``)."""

    #: The holder gave the task back (FailTask).
    GIVEN_BACK = "given_back"
    #: The lease deadline passed without a commitment.
    EXPIRED = "expired"
    #: Its holder went offline, was ejected or banned, or deregistered.
    TAKEN_BACK = "taken_back"
    #: A validator rejected the commitment made under the lease.
    REJECTED = "rejected"
    #: No validator could check the commitment (its validation was given up).
    UNVALIDATED = "unvalidated"
    #: The commitment was refused at intake as a copy of another node's rollouts.
    DUPLICATE = "duplicate"


class ValidationJobState(StrEnum):
    """Lifecycle of a validation job (leased to validators like tasks are leased to workers)."""

    QUEUED = "queued"
    LEASED = "leased"
    DONE = "done"
    #: Given up after its lease was taken back ``max_validation_attempts`` times (no validator
    #: could finish it: inputs unobtainable, or a job that takes validators down with it).
    FAILED = "failed"


class EntryKind(StrEnum):
    """Kinds of contribution-ledger entries."""

    #: Work units credited for an accepted commitment (positive).
    CREDIT = "credit"
    #: Work units taken for a rejected commitment (negative).
    SLASH = "slash"
    #: Work units paid to a validator for a verdict (positive).
    VALIDATOR_REWARD = "validator_reward"
    #: Operator correction; any sign. Corrections are new entries, never edits.
    ADJUSTMENT = "adjustment"
