"""rollnet coordinator state and the hash-chained contribution ledger.

Submodules hold the details: :mod:`~rollnet.ledger.models` (tables),
:mod:`~rollnet.ledger.engine` (engines), :mod:`~rollnet.ledger.migrate` (alembic),
:mod:`~rollnet.ledger.chain` (appends, signed heads, balances), :mod:`~rollnet.ledger.verify`
(independent verifier), repositories :mod:`~rollnet.ledger.nodes`, :mod:`~rollnet.ledger.tasks`,
:mod:`~rollnet.ledger.validation`, :mod:`~rollnet.ledger.artifacts`,
:mod:`~rollnet.ledger.idempotency`.
"""

from rollnet.ledger.chain import (
    AppendedEntry,
    ChainTip,
    NewEntry,
    SignedHead,
    append_entries,
    balance,
    balances,
    chain_tip,
    latest_signed_head,
    list_entries,
    sign_chain_head,
)
from rollnet.ledger.engine import Readiness, check_ready, create_engine, session_factory
from rollnet.ledger.enums import EntryKind, NodeRole, NodeState, TaskState, ValidationJobState
from rollnet.ledger.export import export_jsonl, verify_database
from rollnet.ledger.group_commit import GroupCommitAppender
from rollnet.ledger.leases import LeaseOutcome
from rollnet.ledger.migrate import check_models_match, upgrade_to_head
from rollnet.ledger.tasks import LeasedTask, NewTask, lease_next_task, submit_task
from rollnet.ledger.validation import LeasedValidationJob, lease_next_validation_job
from rollnet.ledger.verify import VerificationReport, verify_export

__all__ = [
    "AppendedEntry",
    "ChainTip",
    "EntryKind",
    "GroupCommitAppender",
    "LeaseOutcome",
    "LeasedTask",
    "LeasedValidationJob",
    "NewEntry",
    "NewTask",
    "NodeRole",
    "NodeState",
    "Readiness",
    "SignedHead",
    "TaskState",
    "ValidationJobState",
    "VerificationReport",
    "append_entries",
    "balance",
    "balances",
    "chain_tip",
    "check_models_match",
    "check_ready",
    "create_engine",
    "export_jsonl",
    "latest_signed_head",
    "lease_next_task",
    "lease_next_validation_job",
    "list_entries",
    "session_factory",
    "sign_chain_head",
    "submit_task",
    "upgrade_to_head",
    "verify_database",
    "verify_export",
]
