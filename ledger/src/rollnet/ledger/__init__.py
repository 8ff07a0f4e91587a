"""rollnet coordinator state and the hash-chained contribution ledger.

Submodules hold the details: :mod:`~rollnet.ledger.models` (tables),
:mod:`~rollnet.ledger.engine` (engines), :mod:`~rollnet.ledger.migrate` (alembic),
:mod:`~rollnet.ledger.chain` (appends, signed heads, balances), :mod:`~rollnet.ledger.verify`
(independent verifier), repositories :mod:`~rollnet.ledger.nodes`, :mod:`~rollnet.ledger.tasks`,
:mod:`~rollnet.ledger.validation`, :mod:`~rollnet.ledger.artifacts`,
:mod:`~rollnet.ledger.idempotency`.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from rollnet.ledger.engine import create_engine, session_factory
    from rollnet.ledger.enums import EntryKind, NodeRole, NodeState, TaskState, ValidationJobState
    from rollnet.ledger.export import export_jsonl, verify_database
    from rollnet.ledger.group_commit import GroupCommitWriter
    from rollnet.ledger.leases import LeaseClaim, LeaseOutcome
    from rollnet.ledger.migrate import Readiness, check_models_match, check_ready, upgrade_to_head
    from rollnet.ledger.tasks import LeasedTask, NewTask, lease_next_task, submit_task
    from rollnet.ledger.validation import LeasedValidationJob, lease_next_validation_job
    from rollnet.ledger.verify import VerificationReport, verify_export

# Imported on first use (PEP 562): `import rollnet.ledger.verify` must stay light — verifying an
# export needs neither SQLAlchemy nor the models.
_EXPORTS: dict[str, str] = {
    "AppendedEntry": "rollnet.ledger.chain",
    "ChainTip": "rollnet.ledger.chain",
    "EntryKind": "rollnet.ledger.enums",
    "GroupCommitWriter": "rollnet.ledger.group_commit",
    "LeaseClaim": "rollnet.ledger.leases",
    "LeaseOutcome": "rollnet.ledger.leases",
    "LeasedTask": "rollnet.ledger.tasks",
    "LeasedValidationJob": "rollnet.ledger.validation",
    "NewEntry": "rollnet.ledger.chain",
    "NewTask": "rollnet.ledger.tasks",
    "NodeRole": "rollnet.ledger.enums",
    "NodeState": "rollnet.ledger.enums",
    "Readiness": "rollnet.ledger.migrate",
    "SignedHead": "rollnet.ledger.chain",
    "TaskState": "rollnet.ledger.enums",
    "ValidationJobState": "rollnet.ledger.enums",
    "VerificationReport": "rollnet.ledger.verify",
    "append_entries": "rollnet.ledger.chain",
    "balance": "rollnet.ledger.chain",
    "balances": "rollnet.ledger.chain",
    "chain_tip": "rollnet.ledger.chain",
    "check_models_match": "rollnet.ledger.migrate",
    "check_ready": "rollnet.ledger.migrate",
    "create_engine": "rollnet.ledger.engine",
    "export_jsonl": "rollnet.ledger.export",
    "latest_signed_head": "rollnet.ledger.chain",
    "lease_next_task": "rollnet.ledger.tasks",
    "lease_next_validation_job": "rollnet.ledger.validation",
    "list_entries": "rollnet.ledger.chain",
    "session_factory": "rollnet.ledger.engine",
    "sign_chain_head": "rollnet.ledger.chain",
    "submit_task": "rollnet.ledger.tasks",
    "upgrade_to_head": "rollnet.ledger.migrate",
    "verify_database": "rollnet.ledger.export",
    "verify_export": "rollnet.ledger.verify",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AppendedEntry",
    "ChainTip",
    "EntryKind",
    "GroupCommitWriter",
    "LeaseClaim",
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
