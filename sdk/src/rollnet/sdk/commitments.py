"""The bytes that bind a commitment to its network, node, task and lease, and receipt checks.

Workers compute :func:`batch_binding_digest` before ``SubmitCommitment``; the coordinator
recomputes it and refuses a mismatch (``COMMITMENT_BINDING_INVALID``). The coordinator signs
:func:`receipt_message`; a worker checks the receipt it keeps with :func:`verify_receipt`.
Both are specified byte for byte in ``docs/protocol.md`` ("Other signed bytes").
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rollnet.sdk.identity import verify_signature
from rollnet.sdk.proofs.binding import domain_digest
from rollnet.v1 import commitment_pb2

BATCH_BINDING_DOMAIN = "rollnet/v1/batch-commitment"
"""Domain string of the batch binding digest."""

RECEIPT_DOMAIN = b"rollnet-receipt-v1\n"
"""Prefix of the bytes a receipt signature covers."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def batch_binding_digest(
    network_id: str, node_id: str, task_id: str, lease_id: str, fencing_token: int, blob: bytes
) -> bytes:
    """The commitment's binding digest: BLAKE3 over network, node, task, lease, token and blob."""
    return domain_digest(
        BATCH_BINDING_DOMAIN, [network_id, node_id, task_id, lease_id, fencing_token, blob]
    )


def receipt_message(commitment_id: str, binding: bytes, received_at: datetime) -> bytes:
    """The bytes a receipt signature covers (``received_at`` in whole Unix microseconds)."""
    # Integer arithmetic: float seconds can round a microsecond away.
    micros = (received_at - _EPOCH) // timedelta(microseconds=1)
    return (
        RECEIPT_DOMAIN
        + commitment_id.encode()
        + b"\n"
        + binding.hex().encode()
        + b"\n"
        + str(micros).encode()
    )


def verify_receipt(receipt: commitment_pb2.Receipt, coordinator_public_key: bytes) -> bool:
    """Whether ``receipt`` is signed by ``coordinator_public_key`` over its own fields."""
    if receipt.coordinator_public_key != coordinator_public_key:
        return False
    received_at = receipt.received_at.ToDatetime(tzinfo=UTC)
    message = receipt_message(receipt.commitment_id, receipt.binding_digest, received_at)
    return verify_signature(coordinator_public_key, receipt.signature, message)


PROMPT_BYTES_PER_ROLLOUT = 1 << 20
"""What :func:`max_batch_bytes` allows per rollout for its prompt and fields (1 MiB: prompts of
~200,000 tokens)."""
BYTES_PER_COMPLETION_TOKEN = 16
"""What :func:`max_batch_bytes` allows per completion token: its id (a varint, <= 5 bytes) and
its behaviour log-probability (4 bytes), with room to spare."""


def max_batch_bytes(rollouts: int, max_new_tokens: int) -> int:
    """The largest ``RolloutBatch`` a task of ``rollouts`` rollouts may be answered with.

    ``rollouts x (1 MiB + 16 B x max_new_tokens + the TOPLOC proof of max_new_tokens) + 64 KiB``.
    Honest batches are far below it; a larger one is refused without being read (by the
    coordinator at SubmitCommitment, and by a validator before it downloads the blob), so
    padding a batch cannot make either parse or hold gigabytes.
    """
    from rollnet.sdk.proofs.toploc import proof_size

    per_rollout = (
        PROMPT_BYTES_PER_ROLLOUT
        + BYTES_PER_COMPLETION_TOKEN * max_new_tokens
        + proof_size(max_new_tokens)
    )
    return rollouts * per_rollout + (64 << 10)


__all__ = [
    "BATCH_BINDING_DOMAIN",
    "BYTES_PER_COMPLETION_TOKEN",
    "PROMPT_BYTES_PER_ROLLOUT",
    "RECEIPT_DOMAIN",
    "batch_binding_digest",
    "max_batch_bytes",
    "receipt_message",
    "verify_receipt",
]
