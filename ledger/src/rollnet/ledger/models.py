"""SQLAlchemy 2.0 models: everything the coordinator persists.

The database is the coordinator's only state, so every invariant that can be a constraint is one:
real primary and foreign keys, CHECK constraints on enum columns and ranges, UNIQUE constraints on
natural keys. Enum-valued columns hold short strings (see :mod:`rollnet.ledger.enums`).

Tables: ``nodes``, ``tasks``, ``blobs``, ``commitments``, ``validation_jobs``, ``verdicts``,
``checkpoints``, ``ledger_entries``, ``ledger_chain_tip`` (one row: the head every append
serialises on), ``ledger_signed_heads``, ``step_rewards``, ``idempotency_records``,
``request_nonces``, ``task_attempts``, ``rollout_fingerprints`` and ``node_statistics``.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from rollnet.ledger._columns import UTCDateTime
from rollnet.ledger.enums import (
    AttemptOutcome,
    EntryKind,
    NodeRole,
    NodeState,
    TaskState,
    ValidationJobState,
)

#: Constraint names are derived, never left to the database, so migrations stay reviewable and
#: identical on SQLite and PostgreSQL.
NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: Length of a node id: 32 lowercase hex characters derived from the Ed25519 public key.
NODE_ID_LENGTH = 32
#: BLAKE3 digests and Ed25519 public keys are 32 bytes; Ed25519 signatures 64.
HASH_LENGTH = 32
SIGNATURE_LENGTH = 64


class Base(DeclarativeBase):
    """Declarative base of all rollnet tables."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {  # noqa: RUF012 - SQLAlchemy reads this class attribute
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
        list[str]: JSON(),
        list[int]: JSON(),
    }


_E = TypeVar("_E", bound=StrEnum)


class StrEnumColumn(TypeDecorator[_E]):
    """Stores a ``StrEnum`` as its short string value and reads it back as the member."""

    impl = String(16)
    cache_ok = True

    def __init__(self, enum_type: type[_E]) -> None:
        super().__init__()
        self.enum_type = enum_type

    def process_bind_param(self, value: _E | str | None, dialect: Dialect) -> str | None:
        if value is None:
            return None
        return self.enum_type(value).value

    def process_result_value(self, value: Any, dialect: Dialect) -> _E | None:
        if value is None:
            return None
        return self.enum_type(value)


def table_of(model: type[Base]) -> Table:
    """The Core table of a mapped class (``__table__`` is typed as a bare FromClause)."""
    return Base.metadata.tables[model.__tablename__]


def _one_of(column: str, enum_type: type[StrEnum]) -> CheckConstraint:
    values = ", ".join(f"'{member.value}'" for member in enum_type)
    return CheckConstraint(f"{column} IN ({values})", name=f"{column}_valid")


def _length_is(column: str, length: int) -> CheckConstraint:
    # length() counts characters of text and bytes of blobs/bytea on both engines.
    return CheckConstraint(f"length({column}) = {length}", name=f"{column}_length")


def _lease_complete(state_column: str = "state") -> CheckConstraint:
    return CheckConstraint(
        f"{state_column} <> 'leased' OR (lease_id IS NOT NULL AND lease_holder IS NOT NULL"
        " AND lease_deadline IS NOT NULL)",
        name="lease_complete",
    )


class Node(Base):
    """A registered worker, validator, trainer or operator."""

    __tablename__ = "nodes"
    __table_args__ = (
        _length_is("id", NODE_ID_LENGTH),
        _length_is("public_key", HASH_LENGTH),
        _one_of("role", NodeRole),
        _one_of("state", NodeState),
        CheckConstraint("trust >= 0 AND trust <= 1", name="trust_range"),
        CheckConstraint("accepted_streak >= 0", name="streak_non_negative"),
    )

    id: Mapped[str] = mapped_column(String(NODE_ID_LENGTH), primary_key=True)
    public_key: Mapped[bytes] = mapped_column(LargeBinary(HASH_LENGTH), unique=True)
    role: Mapped[NodeRole] = mapped_column(StrEnumColumn(NodeRole))
    state: Mapped[NodeState] = mapped_column(StrEnumColumn(NodeState))
    #: Trust in [0, 1]; governs how much of a node's work is sampled for validation.
    trust: Mapped[float] = mapped_column(Float)
    #: Consecutive accepted commitments since the last reject.
    accepted_streak: Mapped[int] = mapped_column(Integer)
    protocol_version: Mapped[str] = mapped_column(String(32))
    software_version: Mapped[str] = mapped_column(String(64))
    capabilities: Mapped[list[str]]
    hardware: Mapped[dict[str, Any]]
    pool: Mapped[str | None] = mapped_column(String(64))
    registered_at: Mapped[datetime]
    last_heartbeat_at: Mapped[datetime]
    state_changed_at: Mapped[datetime]
    #: When the node turns SUSPECT / OFFLINE if no heartbeat arrives: set by each heartbeat from
    #: the interval granted to that node (NULL: judged by the coordinator-wide interval).
    suspect_at: Mapped[datetime | None]
    offline_at: Mapped[datetime | None]
    #: Why the node was ejected, banned or deregistered (empty otherwise).
    state_reason: Mapped[str] = mapped_column(Text, default="")
    #: The checkpoint step the node reported in its last heartbeat (NULL: none reported yet).
    checkpoint_step: Mapped[int | None] = mapped_column(BigInteger)
    #: Rejected commitments forgiven when an operator reinstated the node after an ejection:
    #: ejection after repeated rejects counts only the rejects beyond these.
    rejects_forgiven: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class Task(Base):
    """A unit of rollout work: prompts from an environment, sampled at one checkpoint."""

    __tablename__ = "tasks"
    __table_args__ = (
        _one_of("state", TaskState),
        _lease_complete(),
        CheckConstraint("checkpoint_step >= 0", name="checkpoint_step_non_negative"),
        CheckConstraint("seed >= 0", name="seed_non_negative"),
        CheckConstraint("attempt >= 0", name="attempt_non_negative"),
        CheckConstraint("fencing_token = attempt", name="fencing_token_is_attempt"),
        # Leasing takes queued tasks in (created_at, id) order; the index must cover the whole
        # ORDER BY or every lease sorts all queued tasks created in the same batch.
        Index(None, "state", "created_at", "id"),
        Index(None, "lease_holder", "state"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    environment: Mapped[str] = mapped_column(String(64))
    checkpoint_step: Mapped[int] = mapped_column(BigInteger)
    prompt_ids: Mapped[list[str]]
    #: Seed of the worker's Gumbel-max sampling, fixed by the coordinator.
    seed: Mapped[int] = mapped_column(BigInteger)
    sampling: Mapped[dict[str, Any]]
    state: Mapped[TaskState] = mapped_column(StrEnumColumn(TaskState))
    #: Number of leases granted so far; the current lease's fencing token equals it.
    attempt: Mapped[int] = mapped_column(Integer)
    lease_id: Mapped[str | None] = mapped_column(String(64))
    lease_holder: Mapped[str | None] = mapped_column(ForeignKey("nodes.id"))
    lease_deadline: Mapped[datetime | None]
    fencing_token: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class TaskAttempt(Base):
    """One lease of a task that ended without credit, and why: the give-back history.

    Given back (FailTask), expired, taken back from a node that left, rejected, unvalidated or
    refused as a copy. Seeds derive from the task alone, so retrying never re-rolls them; this
    history says who retried what, how often, and why (GetTask, the dashboard, metrics).
    """

    __tablename__ = "task_attempts"
    __table_args__ = (
        _one_of("outcome", AttemptOutcome),
        CheckConstraint("fencing_token >= 1", name="fencing_token_positive"),
        Index(None, "task_id", "fencing_token"),
        Index(None, "node_id", "ended_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id"))
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"))
    lease_id: Mapped[str] = mapped_column(String(64))
    fencing_token: Mapped[int] = mapped_column(BigInteger)
    outcome: Mapped[AttemptOutcome] = mapped_column(StrEnumColumn(AttemptOutcome))
    #: The FailReason name of a give-back, or the reject reason (empty when none applies).
    reason: Mapped[str] = mapped_column(String(64))
    #: The worker's message, or other detail, cut to 200 characters.
    detail: Mapped[str] = mapped_column(Text)
    ended_at: Mapped[datetime]


class Blob(Base):
    """A content-addressed blob (rollouts, proofs), named by its BLAKE3 hex digest."""

    __tablename__ = "blobs"
    __table_args__ = (
        _length_is("hash", 2 * HASH_LENGTH),
        CheckConstraint("size >= 0", name="size_non_negative"),
    )

    hash: Mapped[str] = mapped_column(String(2 * HASH_LENGTH), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    #: Where the bytes live (a path under the data directory or an object-store URL).
    location: Mapped[str] = mapped_column(String(1024))
    uploader_id: Mapped[str | None] = mapped_column(ForeignKey("nodes.id"))
    created_at: Mapped[datetime]
    #: When the bytes were deleted under the retention of uncredited work (the batch of a
    #: rejected or unvalidatable commitment); the row stays, as the ledger names the digest.
    pruned_at: Mapped[datetime | None]


class Commitment(Base):
    """A worker's signed claim that a leased task's rollouts are in a blob."""

    __tablename__ = "commitments"
    __table_args__ = (
        # One commitment per lease: a replayed or duplicated submit cannot claim twice.
        UniqueConstraint("task_id", "fencing_token"),
        _length_is("signature", SIGNATURE_LENGTH),
        CheckConstraint("claimed_work >= 0", name="claimed_work_non_negative"),
        CheckConstraint("sampling_seed >= 0", name="sampling_seed_non_negative"),
        Index(None, "node_id"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id"))
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"))
    lease_id: Mapped[str] = mapped_column(String(64))
    fencing_token: Mapped[int] = mapped_column(BigInteger)
    rollout_blob_hash: Mapped[str] = mapped_column(ForeignKey("blobs.hash"))
    proof_blob_hash: Mapped[str | None] = mapped_column(ForeignKey("blobs.hash"))
    sampling_seed: Mapped[int] = mapped_column(BigInteger)
    claimed_work: Mapped[int] = mapped_column(BigInteger)
    request_id: Mapped[str] = mapped_column(String(128))
    signature: Mapped[bytes] = mapped_column(LargeBinary(SIGNATURE_LENGTH))
    received_at: Mapped[datetime]
    #: The commitment as received (a serialized ``rollnet.v1.Commitment``, per-rollout digests
    #: included), so validators see exactly what the worker committed to.
    record: Mapped[bytes | None] = mapped_column(LargeBinary)


class RolloutFingerprint(Base):
    """One committed rollout's token digests, indexed so the coordinator finds the same
    completion committed by another node (a copy) in one index probe per rollout."""

    __tablename__ = "rollout_fingerprints"
    __table_args__ = (
        _length_is("tokens_blake3", HASH_LENGTH),
        _length_is("completion_blake3", HASH_LENGTH),
        # With the log-probability: a likely rollout is a copy only of an improbable original
        # of the same tokens, found by one range probe however often the tokens recur.
        Index(None, "tokens_blake3", "logprob_sum"),
        Index(None, "completion_blake3"),
    )

    commitment_id: Mapped[str] = mapped_column(ForeignKey("commitments.id"), primary_key=True)
    rollout_index: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"))
    #: :func:`rollnet.sdk.proofs.tokens_digest` of the prompt and completion ids.
    tokens_blake3: Mapped[bytes] = mapped_column(LargeBinary(HASH_LENGTH))
    #: The same digest of the completion alone (an empty prompt).
    completion_blake3: Mapped[bytes] = mapped_column(LargeBinary(HASH_LENGTH))
    #: The sum of the rollout's behaviour log-probabilities as its worker claimed them: how
    #: likely an honest second sample is to repeat the completion.
    logprob_sum: Mapped[float] = mapped_column(Float)


class ValidationJob(Base):
    """Validation of one commitment, leased to validators the way tasks are leased to workers."""

    __tablename__ = "validation_jobs"
    __table_args__ = (
        _one_of("state", ValidationJobState),
        _lease_complete(),
        CheckConstraint("attempt >= 0", name="attempt_non_negative"),
        CheckConstraint("fencing_token = attempt", name="fencing_token_is_attempt"),
        CheckConstraint(
            "check_probability > 0 AND check_probability <= 1", name="check_probability_range"
        ),
        Index(None, "state", "created_at", "id"),
        # Finished jobs in the order they ended: the retention sweep walks them once.
        Index(None, "state", "updated_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    commitment_id: Mapped[str] = mapped_column(ForeignKey("commitments.id"), unique=True)
    state: Mapped[ValidationJobState] = mapped_column(StrEnumColumn(ValidationJobState))
    attempt: Mapped[int] = mapped_column(Integer)
    lease_id: Mapped[str | None] = mapped_column(String(64))
    lease_holder: Mapped[str | None] = mapped_column(ForeignKey("nodes.id"))
    lease_deadline: Mapped[datetime | None]
    fencing_token: Mapped[int] = mapped_column(BigInteger)
    check_probability: Mapped[float] = mapped_column(Float, server_default="1.0")
    """The probability with which the coordinator chose to validate the commitment (1 for a
    node without trust): a reject is slashed the claimed work divided by it."""
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class Verdict(Base):
    """A validator's decision on a commitment, with the figures of every check it ran."""

    __tablename__ = "verdicts"
    __table_args__ = (
        CheckConstraint("awarded_work >= 0", name="awarded_work_non_negative"),
        Index(None, "commitment_id"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    validation_job_id: Mapped[str] = mapped_column(ForeignKey("validation_jobs.id"), unique=True)
    commitment_id: Mapped[str] = mapped_column(ForeignKey("commitments.id"))
    validator_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"))
    accepted: Mapped[bool] = mapped_column(Boolean)
    #: Reason constants of failed checks (empty when accepted).
    reasons: Mapped[list[str]]
    #: Per-check figures, e.g. ``{"toploc": {"exp_mismatch_max": 3, ...}, "sampling": {...}}``.
    check_figures: Mapped[dict[str, Any]]
    awarded_work: Mapped[int] = mapped_column(BigInteger)
    decided_at: Mapped[datetime]
    #: The validator's recomputed log-probabilities of every completion token, per rollout
    #: (:func:`rollnet.ledger.validation.pack_logprobs`); NULL when it sent none (a reject, or
    #: a validator predating them).
    validated_logprobs: Mapped[bytes | None] = mapped_column(LargeBinary)


class Checkpoint(Base):
    """A published policy checkpoint: its signed manifest, verbatim."""

    __tablename__ = "checkpoints"
    __table_args__ = (
        CheckConstraint("step >= 0", name="step_non_negative"),
        _length_is("manifest_hash", 2 * HASH_LENGTH),
        _length_is("signature", SIGNATURE_LENGTH),
        _length_is("signer_public_key", HASH_LENGTH),
    )

    step: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    #: The manifest bytes exactly as signed, so anyone can re-check the signature.
    manifest: Mapped[bytes] = mapped_column(LargeBinary)
    manifest_hash: Mapped[str] = mapped_column(String(2 * HASH_LENGTH), unique=True)
    signature: Mapped[bytes] = mapped_column(LargeBinary(SIGNATURE_LENGTH))
    signer_public_key: Mapped[bytes] = mapped_column(LargeBinary(HASH_LENGTH))
    publisher_id: Mapped[str | None] = mapped_column(ForeignKey("nodes.id"))
    published_at: Mapped[datetime]


class LedgerEntry(Base):
    """One append-only, hash-chained contribution-ledger entry.

    ``entry_hash = BLAKE3(prev_hash ‖ canonical bytes)``, where the canonical bytes are specified
    in ``docs/ledger.md`` and implemented in :mod:`rollnet.ledger.canonical`.
    """

    __tablename__ = "ledger_entries"
    __table_args__ = (
        CheckConstraint("sequence >= 1", name="sequence_positive"),
        _one_of("kind", EntryKind),
        CheckConstraint(
            "(kind IN ('credit', 'validator_reward') AND amount >= 0)"
            " OR (kind = 'slash' AND amount <= 0) OR kind = 'adjustment'",
            name="amount_sign",
        ),
        _length_is("prev_hash", HASH_LENGTH),
        _length_is("entry_hash", HASH_LENGTH),
        Index(None, "node_id"),
    )

    sequence: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    recorded_at: Mapped[datetime]
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"))
    kind: Mapped[EntryKind] = mapped_column(StrEnumColumn(EntryKind))
    #: Signed 64-bit integer of work units.
    amount: Mapped[int] = mapped_column(BigInteger)
    commitment_id: Mapped[str | None] = mapped_column(ForeignKey("commitments.id"))
    verdict_id: Mapped[str | None] = mapped_column(ForeignKey("verdicts.id"))
    memo: Mapped[str] = mapped_column(Text)
    prev_hash: Mapped[bytes] = mapped_column(LargeBinary(HASH_LENGTH))
    entry_hash: Mapped[bytes] = mapped_column(LargeBinary(HASH_LENGTH), unique=True)


class LedgerChainTip(Base):
    """The single row every append locks: the last sequence number and its hash.

    Appends read and advance this row inside their transaction, so two coordinator replicas on
    one PostgreSQL can never fork the chain or reuse a sequence number.
    """

    __tablename__ = "ledger_chain_tip"
    __table_args__ = (
        CheckConstraint("id = 1", name="single_row"),
        CheckConstraint("sequence >= 0", name="sequence_non_negative"),
        _length_is("head_hash", HASH_LENGTH),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    sequence: Mapped[int] = mapped_column(BigInteger)
    head_hash: Mapped[bytes] = mapped_column(LargeBinary(HASH_LENGTH))


class SignedChainHead(Base):
    """A chain head (sequence, hash) signed by the coordinator's Ed25519 key."""

    __tablename__ = "ledger_signed_heads"
    __table_args__ = (
        UniqueConstraint("network_id", "sequence", "signer_public_key"),
        CheckConstraint("sequence >= 0", name="sequence_non_negative"),
        _length_is("head_hash", HASH_LENGTH),
        _length_is("signer_public_key", HASH_LENGTH),
        _length_is("signature", SIGNATURE_LENGTH),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    network_id: Mapped[str] = mapped_column(String(64))
    sequence: Mapped[int] = mapped_column(BigInteger)
    head_hash: Mapped[bytes] = mapped_column(LargeBinary(HASH_LENGTH))
    signer_public_key: Mapped[bytes] = mapped_column(LargeBinary(HASH_LENGTH))
    signature: Mapped[bytes] = mapped_column(LargeBinary(SIGNATURE_LENGTH))
    signed_at: Mapped[datetime]


class StepRewards(Base):
    """Validated rewards of accepted rollouts summed per trainer step (``rollout_step``).

    Kept up to date by every accepting verdict in its own transaction, so the reward curve is
    a read of one row per step rather than a pass over every verdict's figures.
    """

    __tablename__ = "step_rewards"
    __table_args__ = (
        CheckConstraint("rollout_step >= 0", name="step_non_negative"),
        CheckConstraint("rollouts >= 0", name="rollouts_non_negative"),
    )

    rollout_step: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    #: Accepted rollouts with a validated reward.
    rollouts: Mapped[int] = mapped_column(BigInteger)
    task_reward_sum: Mapped[float] = mapped_column(Float)
    total_reward_sum: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime]


class IdempotencyRecord(Base):
    """The stored response of a mutating request, keyed by (caller, method, request id)."""

    __tablename__ = "idempotency_records"
    __table_args__ = (Index(None, "created_at"),)

    caller_id: Mapped[str] = mapped_column(String(NODE_ID_LENGTH), primary_key=True)
    method: Mapped[str] = mapped_column(String(128), primary_key=True)
    request_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    response: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime]


class RequestNonce(Base):
    """A signed call's nonce, kept while its signature could still be accepted.

    The replay cache every replica and every restart shares: a call whose (signed timestamp,
    key, nonce) is here is a replay (a replay carries the same signed timestamp). The key leads
    with the signed timestamp, so new rows go to the end of one B-tree (no rowid table on
    SQLite, no second index) and the expired ones, pruned from its start, are one range.
    """

    __tablename__ = "request_nonces"
    __table_args__ = ({"sqlite_with_rowid": False},)

    #: The call's signed timestamp (``x-rollnet-timestamp``), Unix milliseconds.
    signed_ms: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    node_id: Mapped[str] = mapped_column(String(NODE_ID_LENGTH), primary_key=True)
    nonce: Mapped[str] = mapped_column(String(32), primary_key=True)


class NodeStatistics(Base):
    """A worker's per-node evidence: running sums of the validators' per-rollout statistics
    and the sequential tests' CUSUMs (``rollnet.sdk.proofs.statistics``).

    One row per worker, updated by each accepting verdict that carries statistics, in the
    verdict's transaction (the row is read FOR UPDATE). ``flagged_at`` is set once, when a test
    flags the node (it is then ejected with the test in its ``state_reason``).
    """

    __tablename__ = "node_statistics"
    __table_args__ = (
        CheckConstraint("tokens >= 0", name="tokens_non_negative"),
        CheckConstraint(
            "near_tie_losses >= 0 AND near_tie_wins >= 0 "
            "AND near_tie_losses + near_tie_wins <= tokens",
            name="near_tie_counts",
        ),
        CheckConstraint("logprob_variance >= 0", name="variance_non_negative"),
        CheckConstraint("eos_near_tie_losses >= 0 AND eos_near_tie_passes >= 0", name="eos_counts"),
        CheckConstraint(
            "dispersion_tokens >= 0 AND logprob_dispersion >= 0", name="dispersion_sums"
        ),
    )

    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"), primary_key=True)
    #: Completion tokens summarized.
    tokens: Mapped[int] = mapped_column(BigInteger)
    near_tie_losses: Mapped[int] = mapped_column(BigInteger)
    near_tie_wins: Mapped[int] = mapped_column(BigInteger)
    logprob_excess: Mapped[float] = mapped_column(Float)
    logprob_variance: Mapped[float] = mapped_column(Float)
    near_tie_cusum: Mapped[float] = mapped_column(Float)
    logprob_high_cusum: Mapped[float] = mapped_column(Float)
    logprob_low_cusum: Mapped[float] = mapped_column(Float)
    eos_near_tie_losses: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    eos_near_tie_passes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    eos_cusum: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    logprob_dispersion: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    dispersion_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    dispersion_cusum: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    #: When a test flagged the node (NULL: never), and which (``near_tie``, ``logprob_low``...).
    flagged_at: Mapped[datetime | None]
    flagged_test: Mapped[str] = mapped_column(String(32), default="")
    updated_at: Mapped[datetime]
