"""Rollout batches of commitments: reading a stored batch within its task's bounds, and
checking it against the commitment that names it."""

from __future__ import annotations

from google.protobuf.message import DecodeError

from rollnet.ledger.tasks import TaskTerms
from rollnet.reference.coordinator.blobstore import BlobStore
from rollnet.reference.coordinator.dispatch import PROMPT_TOKENS
from rollnet.reference.coordinator.refusal import Refusal
from rollnet.sdk import batches
from rollnet.sdk.batches import BatchTerms
from rollnet.sdk.commitments import max_batch_bytes
from rollnet.sdk.errors import ErrorReason
from rollnet.sdk.proofs.binding import LeaseBinding
from rollnet.v1 import commitment_service_pb2, rollout_pb2

_ROLLOUTS_FIELD = 6
"""``RolloutBatch.rollouts``' field number."""


def count_rollouts(data: bytes, limit: int) -> int:
    """The ``rollouts`` entries of a serialized ``RolloutBatch``, counted on the wire up to
    ``limit`` (the scan stops there) without parsing them; ``-1`` when the bytes are not a
    well-formed message (a truncated or impossible field)."""
    view = memoryview(data)
    position, count, size = 0, 0, len(data)

    def varint() -> int:
        nonlocal position
        value, shift = 0, 0
        while True:
            if position >= size or shift > 63:
                raise ValueError("truncated varint")
            byte = view[position]
            position += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    try:
        while position < size and count < limit:
            tag = varint()
            field, wire = tag >> 3, tag & 7
            if wire == 0:
                varint()
            elif wire == 1:
                position += 8
            elif wire == 5:
                position += 4
            elif wire == 2:
                length = varint()  # before the add: varint() moves the position itself
                position += length
                if field == _ROLLOUTS_FIELD:
                    count += 1
            else:  # groups (3, 4) are not in this schema; 6 and 7 do not exist
                return -1
            if position > size:
                return -1
    except ValueError:
        return -1
    return count


def batch_terms(task: TaskTerms) -> tuple[int, int]:
    """The rollouts a task's batch holds, and the most bytes it may take."""
    rollouts = len(task.prompt_ids) * int(task.sampling["samples_per_prompt"])
    return rollouts, max_batch_bytes(rollouts, int(task.sampling["max_new_tokens"]))


def load_batch(
    blobs: BlobStore, digest: bytes, terms: tuple[int, int]
) -> tuple[rollout_pb2.RolloutBatch, int]:
    """The stored batch ``digest`` parsed, and its size, refused (``ROLLOUT_BATCH_INVALID``)
    unless it is within ``terms`` (:func:`batch_terms`): counted on the wire before it is
    parsed."""
    expected, limit = terms
    size = blobs.size(digest)
    if size > limit:
        raise Refusal(
            ErrorReason.ROLLOUT_BATCH_INVALID,
            f"rollout blob is {size} bytes, a batch for this task is at most {limit}",
        )
    _, data = blobs.read_range(digest, 0, 0)
    # Counted on the wire before anything is built: a blob of many tiny rollouts grows
    # ~50x when parsed (2 bytes each on the wire, ~110 in memory).
    count = count_rollouts(data, limit=expected + 1)
    if count < 0:
        raise Refusal(ErrorReason.ROLLOUT_BATCH_INVALID, "rollout blob is not a RolloutBatch")
    if count != expected:
        more = "more than " if count > expected else ""
        raise Refusal(
            ErrorReason.ROLLOUT_BATCH_INVALID,
            f"batch holds {more}{min(count, expected)} rollouts, {expected} expected",
        )
    try:
        return rollout_pb2.RolloutBatch.FromString(data), len(data)
    except DecodeError as error:
        raise Refusal(
            ErrorReason.ROLLOUT_BATCH_INVALID, f"rollout blob is not a RolloutBatch: {error}"
        ) from None


def commitment_binding(
    network_id: str, node_id: str, request: commitment_service_pb2.SubmitCommitmentRequest
) -> LeaseBinding:
    """The lease ``node_id`` claims to have done the work of ``request`` under."""
    return LeaseBinding(
        network_id, node_id, request.task_id, request.lease_id, request.fencing_token
    )


def check_batch(
    batch: rollout_pb2.RolloutBatch,
    request: commitment_service_pb2.SubmitCommitmentRequest,
    node_id: str,
    task: TaskTerms,
    network_id: str,
) -> None:
    """Refuse (``ROLLOUT_BATCH_INVALID``, naming up to eight problems) a batch that does not
    match the commitment of ``node_id`` that names it, or the task's terms: the SDK's rules
    (:func:`rollnet.sdk.batches.check`), with the completion and prompt lengths the coordinator
    knows. They are checked here, not only by a validator: a commitment that is not spot-checked
    is credited for its prompt and completion tokens."""
    spec = task.sampling
    binding = commitment_binding(network_id, node_id, request)
    terms = BatchTerms(
        task_id=task.id,
        prompt_ids=[int(prompt) for prompt in task.prompt_ids],
        samples_per_prompt=int(spec["samples_per_prompt"]),
        checkpoint_step=task.checkpoint_step,
        max_new_tokens=int(spec["max_new_tokens"]),
        prompt_lengths=spec.get(PROMPT_TOKENS),
    )
    problems = batches.check(binding, terms, batch, request.rollouts, limit=8)
    if problems:
        raise Refusal(
            ErrorReason.ROLLOUT_BATCH_INVALID, "; ".join(problem.message for problem in problems)
        )
