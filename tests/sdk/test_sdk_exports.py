"""The public surface of ``rollnet.sdk``: a snapshot, and a light import."""

from __future__ import annotations

import json
import subprocess
import sys
from types import ModuleType

import pytest

import rollnet.sdk
from rollnet.sdk import batches, domains, prompts, testing, version

EXPORTS = [
    "ALL_METHODS",
    "AUDIENCE_HEADER",
    "Aborted",
    "AlreadyExists",
    "BODY_HASH_HEADER",
    "Backoff",
    "BlobClient",
    "BlobIntegrityError",
    "BlobServiceShards",
    "Cancelled",
    "CheckpointClient",
    "CheckpointStore",
    "CheckpointVerificationError",
    "CommitmentClient",
    "ConnectionConfig",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_NETWORK_ID",
    "DataLoss",
    "DeadlineExceeded",
    "ERROR_DOMAIN",
    "ErrorReason",
    "FATAL_REASONS",
    "FailedPrecondition",
    "FieldViolation",
    "Identity",
    "Internal",
    "InvalidArgument",
    "KEY_HEADER",
    "KeyFileError",
    "KeyResolver",
    "KnownKey",
    "LeaseContext",
    "LeaseLost",
    "LeaseReport",
    "LedgerClient",
    "Metadata",
    "NONCE_HEADER",
    "NodeClient",
    "NodeConfig",
    "NodeFatalError",
    "NodeReport",
    "NodeSession",
    "NonceCache",
    "NotFound",
    "OutOfRange",
    "Outbox",
    "PROTOCOL_VERSION",
    "PathViolation",
    "PendingSubmission",
    "PermissionDenied",
    "REASON_CODES",
    "REGISTER_NODE",
    "REREGISTER_REASONS",
    "RequestSigner",
    "RequestVerifier",
    "ResourceExhausted",
    "RetryPolicy",
    "RollnetClient",
    "RollnetError",
    "RolloutClient",
    "RolloutGenerator",
    "SIGNATURE_HEADER",
    "SIGNING_HEADERS",
    "SealedBatch",
    "ShardSource",
    "SignedHeaders",
    "StopRequested",
    "TIMESTAMP_HEADER",
    "TaskClient",
    "TlsConfig",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "ValidationClient",
    "VerificationError",
    "VerifiedCaller",
    "VerifierConfig",
    "Worker",
    "WorkerConfig",
    "WorkerFatalError",
    "abort",
    "backoff_delay",
    "batch_binding_digest",
    "body_digest",
    "build_status",
    "checkpoint_path_error",
    "checkpoint_path_violations",
    "current_caller",
    "current_request_id",
    "default_hardware",
    "default_method_policy",
    "error_type",
    "from_rpc_error",
    "is_retryable",
    "method_path",
    "node_id_from_public_key",
    "open_channel",
    "run_until_signalled",
    "seal_batch",
    "signed_bytes",
    "signing_interceptors",
    "verify_checkpoint",
    "verify_receipt",
    "verify_signature",
]


def test_exports_snapshot() -> None:
    assert sorted(rollnet.sdk.__all__) == EXPORTS
    for name in rollnet.sdk.__all__:
        assert hasattr(rollnet.sdk, name), name


#: The public modules of the SDK that ``rollnet.sdk`` does not re-export whole, and their
#: ``__all__`` (sorted, whitespace-separated).
MODULE_EXPORTS = {
    batches: """BatchProblem BatchRule BatchTerms SealedBatch batch_binding_digest binding_digest
        check commitment_request encode_batch rollout_batch rollout_digests seal seal_batch""",
    domains: """BATCH_BINDING_DOMAIN CHALLENGE_DOMAIN CHALLENGE_DRAW_DOMAIN CHECKPOINT_DOMAIN
        COMMITMENT_DOMAIN CONFIG_DIGEST_DOMAIN DRAW_DOMAIN LEDGER_ENTRY_DOMAIN LEDGER_HEAD_DOMAIN
        NODE_ID_DOMAIN PACKAGE_DIGEST_DOMAIN PROOF_DOMAIN RECEIPT_DOMAIN SEED_DOMAIN
        SIGNING_DOMAIN TASKS_DIGEST_DOMAIN TOKENS_DOMAIN""",
    prompts: "AssignedPrompt PromptTokenizer encode_problem encode_prompt",
    testing: "NETWORK_ID connect free_port wait_until wait_until_blocking",
    version: "PROTOCOL_MAJOR PROTOCOL_MINOR RELEASE_SERIES software_version",
}


@pytest.mark.parametrize("module", MODULE_EXPORTS, ids=lambda module: module.__name__)
def test_public_module_exports_snapshot(module: ModuleType) -> None:
    assert sorted(module.__all__) == MODULE_EXPORTS[module].split()
    for name in module.__all__:
        assert hasattr(module, name), name


def test_no_domain_is_another_or_begins_another() -> None:
    """Bytes made under one domain can be taken for another's only if one domain is a prefix
    of the other (the str domains count as their UTF-8 bytes)."""
    values = {
        name: value if isinstance(value, bytes) else value.encode()
        for name in domains.__all__
        for value in [getattr(domains, name)]
    }
    for name, value in values.items():
        for other, other_value in values.items():
            assert name == other or not other_value.startswith(value), (name, other)


@pytest.mark.slow
def test_import_is_light() -> None:
    """Importing the SDK must not pull in torch, SQLAlchemy, vLLM or transformers."""
    code = (
        "import json, sys, rollnet.sdk; "
        "print(json.dumps(sorted(m for m in ('torch', 'sqlalchemy', 'vllm', 'transformers') "
        "if m in sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(result.stdout) == []
