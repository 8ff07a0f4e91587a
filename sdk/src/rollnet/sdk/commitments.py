"""The bytes that bind a commitment to its network, node, task and lease, and receipt checks.

:func:`seal_batch` turns a leased task's rollouts into the rollout batch blob and the
``SubmitCommitment`` request that names it (per-rollout digests, claimed work, and the
:func:`batch_binding_digest`, which the coordinator recomputes and refuses on a mismatch,
``COMMITMENT_BINDING_INVALID``). The coordinator signs :func:`receipt_message`; a worker checks
the receipt it keeps with :func:`verify_receipt`. All are specified byte for byte in
``docs/protocol.md`` ("Other signed bytes") and pinned by ``protos/rollnet/v1/vectors.json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import blake3

from rollnet.sdk.identity import verify_signature
from rollnet.sdk.proofs.binding import (
    LeaseBinding,
    commitment_digest,
    derive_sampling_seed,
    domain_digest,
    proof_digest,
)
from rollnet.v1 import (
    commitment_pb2,
    commitment_service_pb2,
    common_pb2,
    rollout_pb2,
    task_pb2,
)

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


@dataclass(frozen=True)
class SealedBatch:
    """A finished task ready to upload and commit."""

    batch: bytes
    """The rollout batch blob: the ``RolloutBatch``, serialized deterministically."""
    request: commitment_service_pb2.SubmitCommitmentRequest
    """The commitment naming it; ``request_id`` is left for the caller to set."""


def seal_batch(
    *,
    network_id: str,
    node_id: str,
    task: task_pb2.Task,
    lease: task_pb2.Lease,
    rollouts: Sequence[rollout_pb2.Rollout],
) -> SealedBatch:
    """The batch blob and commitment request for ``rollouts`` of ``task`` under ``lease``.

    The batch holds the rollouts in the order given, which must be ``(prompt_index,
    sample_index)`` order, one per prompt and sample, each answering its prompt id and sampled
    with its lease-derived seed: ``ValueError`` otherwise (a validator would reject it, and the
    coordinator refuses some of it). The blob is the deterministic serialization (fields in
    number order, packed repeated scalars); any encoding of the same message is accepted, since
    the commitment names the blob by the BLAKE3 of the bytes actually uploaded.
    """
    samples = task.samples_per_prompt
    expected = len(task.prompt_ids) * samples
    if len(rollouts) != expected:
        raise ValueError(f"generator returned {len(rollouts)} rollouts, task asks {expected}")
    binding = LeaseBinding(
        network_id=network_id,
        node_id=node_id,
        task_id=task.task_id,
        lease_id=lease.lease_id,
        fencing_token=lease.fencing_token,
    )
    for index, rollout in enumerate(rollouts):
        prompt_index, sample = divmod(index, samples)
        if (rollout.prompt_index, rollout.sample_index) != (prompt_index, sample):
            raise ValueError(f"rollout {index} is out of (prompt_index, sample_index) order")
        if rollout.prompt_id != task.prompt_ids[prompt_index]:
            raise ValueError(f"rollout {index} answers the wrong prompt id")
        if rollout.sampling_seed != derive_sampling_seed(network_id, task.task_id, index):
            raise ValueError(f"rollout {index} was not sampled with its derived seed")
    batch = rollout_pb2.RolloutBatch(
        task_id=task.task_id,
        lease_id=lease.lease_id,
        fencing_token=lease.fencing_token,
        node_id=node_id,
        checkpoint_step=task.checkpoint_step,
        rollouts=rollouts,
    ).SerializeToString(deterministic=True)
    blob = common_pb2.BlobRef(blake3=blake3.blake3(batch).digest(), size=len(batch))
    request = commitment_service_pb2.SubmitCommitmentRequest(
        lease_id=lease.lease_id,
        fencing_token=lease.fencing_token,
        task_id=task.task_id,
        rollout_batch=blob,
        rollouts=[
            commitment_pb2.RolloutDigest(
                sampling_seed=r.sampling_seed,
                proof_blake3=proof_digest(r.toploc_proof),
                completion_tokens=len(r.completion_token_ids),
                commitment_digest=commitment_digest(
                    binding,
                    blob_blake3=blob.blake3,
                    rollout_index=index,
                    sampling_seed=r.sampling_seed,
                    prompt_ids=r.prompt_token_ids,
                    completion_ids=r.completion_token_ids,
                    proof=r.toploc_proof,
                ),
            )
            for index, r in enumerate(rollouts)
        ],
        claimed_work=commitment_pb2.WorkClaim(
            prefill_tokens=sum(len(r.prompt_token_ids) for r in rollouts),
            decode_tokens=sum(len(r.completion_token_ids) for r in rollouts),
        ),
        binding_digest=batch_binding_digest(
            network_id, node_id, task.task_id, lease.lease_id, lease.fencing_token, blob.blake3
        ),
    )
    return SealedBatch(batch=batch, request=request)


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
