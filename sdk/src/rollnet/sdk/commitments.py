"""Receipt checks and the size bound of a rollout batch.

Sealing and checking a batch live in :mod:`rollnet.sdk.batches` (:func:`~rollnet.sdk.batches.
seal`, :func:`~rollnet.sdk.batches.check`); their names are re-exported here for callers of
rollnet 0.1. The coordinator signs :func:`receipt_message`; a worker checks the receipt it
keeps with :func:`verify_receipt`. All are specified byte for byte in
``docs/protocol.md`` ("Other signed bytes") and pinned by ``protos/rollnet/v1/vectors.json``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rollnet.sdk.batches import SealedBatch, batch_binding_digest, seal_batch
from rollnet.sdk.domains import BATCH_BINDING_DOMAIN, RECEIPT_DOMAIN
from rollnet.sdk.identity import verify_signature
from rollnet.v1 import commitment_pb2

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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
    "SealedBatch",
    "batch_binding_digest",
    "max_batch_bytes",
    "receipt_message",
    "seal_batch",
    "verify_receipt",
]
