"""Rollout batches of commitments: reading a stored batch within its task's bounds, and
checking it against the commitment that names it."""

from __future__ import annotations

from google.protobuf.message import DecodeError

from rollnet.ledger.tasks import TaskTerms
from rollnet.reference.coordinator.blobstore import BlobStore
from rollnet.reference.coordinator.dispatch import PROMPT_TOKENS
from rollnet.reference.coordinator.refusal import Refusal
from rollnet.sdk.commitments import max_batch_bytes
from rollnet.sdk.errors import ErrorReason
from rollnet.sdk.proofs.binding import SEED_DOMAIN, derive_sampling_seed, proof_digest
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


def check_batch(
    batch: rollout_pb2.RolloutBatch,
    request: commitment_service_pb2.SubmitCommitmentRequest,
    node_id: str,
    task: TaskTerms,
    network_id: str,
) -> None:
    """Refuse (``ROLLOUT_BATCH_INVALID``, naming up to eight problems) a batch that does not
    match the commitment of ``node_id`` that names it, or the task's terms."""
    problems: list[str] = []
    if batch.task_id != request.task_id:
        problems.append("batch.task_id differs from the commitment's task")
    if batch.lease_id != request.lease_id or batch.fencing_token != request.fencing_token:
        problems.append("batch lease differs from the commitment's lease")
    if batch.node_id != node_id:
        problems.append("batch.node_id is not the submitting node")
    if batch.checkpoint_step != task.checkpoint_step:
        problems.append(
            f"batch.checkpoint_step {batch.checkpoint_step} != task's {task.checkpoint_step}"
        )
    spec = task.sampling
    expected = len(task.prompt_ids) * int(spec["samples_per_prompt"])
    if len(batch.rollouts) != expected:
        problems.append(f"batch holds {len(batch.rollouts)} rollouts, task asks {expected}")
    if len(request.rollouts) != len(batch.rollouts):
        problems.append("commitment lists a different number of rollouts than the batch")
    max_new_tokens = int(spec["max_new_tokens"])
    samples = int(spec["samples_per_prompt"])
    task_id = request.task_id
    prompt_tokens: list[int] | None = spec.get(PROMPT_TOKENS)
    for index, (rollout, digest) in enumerate(zip(batch.rollouts, request.rollouts, strict=False)):
        # Checked here, not only by a validator: a commitment that is not spot-checked is
        # credited for its prompt and completion tokens, so both are bounded by what the
        # coordinator knows: each prompt's recorded length, and max_new_tokens.
        prompt = index // samples
        if prompt_tokens is not None and prompt < len(prompt_tokens):
            if rollout.prompt_index != prompt:
                problems.append(
                    f"rollouts[{index}].prompt_index is {rollout.prompt_index}; the "
                    f"rollout order puts prompt {prompt} there"
                )
            elif len(rollout.prompt_token_ids) != prompt_tokens[prompt]:
                problems.append(
                    f"rollouts[{index}] has {len(rollout.prompt_token_ids)} prompt tokens; "
                    f"prompt {prompt} has {prompt_tokens[prompt]} with the task's checkpoint"
                )
        if len(rollout.completion_token_ids) > max_new_tokens:
            problems.append(
                f"rollouts[{index}] has {len(rollout.completion_token_ids)} completion "
                f"tokens, the task allows {max_new_tokens}"
            )
        if proof_digest(rollout.toploc_proof) != digest.proof_blake3:
            problems.append(f"rollouts[{index}].proof_blake3 does not match the batch")
        if rollout.sampling_seed != digest.sampling_seed:
            problems.append(f"rollouts[{index}].sampling_seed does not match the batch")
        elif rollout.sampling_seed != derive_sampling_seed(network_id, task_id, index):
            # Checked here too, not only by a validator: unchecked work is credited.
            problems.append(
                f"rollouts[{index}].sampling_seed is not the task's seed "
                f"{derive_sampling_seed(network_id, task_id, index)}: BLAKE3("
                f'"{SEED_DOMAIN}", network id, task id, rollout index)[:8] >> 1 '
                "(docs/verification.md, Binding)"
            )
        if len(rollout.completion_token_ids) != digest.completion_tokens:
            problems.append(f"rollouts[{index}].completion_tokens does not match the batch")
        if len(problems) > 8:
            break
    if problems:
        raise Refusal(ErrorReason.ROLLOUT_BATCH_INVALID, "; ".join(problems[:8]))
