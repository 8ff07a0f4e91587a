"""The public surface of ``rollnet.sdk``: a snapshot, and a light import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import rollnet.sdk

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
