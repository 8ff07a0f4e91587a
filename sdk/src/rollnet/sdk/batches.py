"""Sealing and checking a rollout batch: the protocol's rules for one, in one place.

A worker answers a leased task with a ``RolloutBatch`` blob and a ``SubmitCommitment`` request
naming it; :func:`seal` builds both and refuses rollouts any other side would refuse. The
coordinator (at SubmitCommitment) and a validator (before its proofs) judge a stored batch with
:func:`check`, which lists every rule it breaks as a :class:`BatchProblem`. Both take the
:class:`~rollnet.sdk.proofs.binding.LeaseBinding` the work was leased under.

The builders :func:`encode_batch`, :func:`rollout_digests` and :func:`commitment_request` are
what :func:`seal` is made of, without its checks: tests and adversaries use them to make
batches an honest worker never sends. The bytes are specified in ``docs/protocol.md`` and
pinned by ``protos/rollnet/v1/vectors.json``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import blake3

from rollnet.sdk.domains import BATCH_BINDING_DOMAIN, SEED_DOMAIN
from rollnet.sdk.proofs.binding import (
    LeaseBinding,
    commitment_digest,
    derive_sampling_seed,
    domain_digest,
    proof_digest,
)
from rollnet.v1 import commitment_pb2, commitment_service_pb2, common_pb2, rollout_pb2, task_pb2


def batch_binding_digest(
    network_id: str, node_id: str, task_id: str, lease_id: str, fencing_token: int, blob: bytes
) -> bytes:
    """The commitment's binding digest: BLAKE3 over network, node, task, lease, token and blob."""
    return domain_digest(
        BATCH_BINDING_DOMAIN, [network_id, node_id, task_id, lease_id, fencing_token, blob]
    )


def binding_digest(binding: LeaseBinding, blob_blake3: bytes) -> bytes:
    """:func:`batch_binding_digest` of ``binding`` and the batch blob's BLAKE3."""
    return batch_binding_digest(
        binding.network_id,
        binding.node_id,
        binding.task_id,
        binding.lease_id,
        binding.fencing_token,
        blob_blake3,
    )


@dataclass(frozen=True)
class BatchTerms:
    """What the task asks of a batch, as the side checking it knows the task."""

    task_id: str
    prompt_ids: Sequence[int]
    samples_per_prompt: int
    checkpoint_step: int
    max_new_tokens: int | None = None
    """Completion tokens a rollout may hold; ``None``: not checked here (a validator checks it
    per rollout)."""
    prompt_lengths: Sequence[int] | None = None
    """Prompt tokens of each prompt with the task's checkpoint, where the checking side knows
    them (the coordinator credits unchecked work by them); ``None``, or prompts past its end:
    not checked."""

    @classmethod
    def of_task(cls, task: task_pb2.Task) -> BatchTerms:
        """The terms of ``task`` (completion and prompt lengths unchecked)."""
        return cls(
            task_id=task.task_id,
            prompt_ids=tuple(task.prompt_ids),
            samples_per_prompt=task.samples_per_prompt,
            checkpoint_step=task.checkpoint_step,
        )

    @property
    def rollout_count(self) -> int:
        """Rollouts the task asks for: ``len(prompt_ids) * samples_per_prompt``."""
        return len(self.prompt_ids) * self.samples_per_prompt


class BatchRule(enum.StrEnum):
    """A rule a batch and its commitment can break."""

    TASK = "task"
    LEASE = "lease"
    NODE = "node"
    CHECKPOINT_STEP = "checkpoint_step"
    ROLLOUT_COUNT = "rollout_count"
    ORDER = "order"
    PROMPT_ID = "prompt_id"
    PROMPT_LENGTH = "prompt_length"
    COMPLETION_LENGTH = "completion_length"
    DIGEST_COUNT = "commitment_rollouts"
    SEED_MISMATCH = "sampling_seed"
    SEED_NOT_DERIVED = "seed_not_derived"
    COMPLETION_TOKENS_MISMATCH = "completion_tokens"
    PROOF_MISMATCH = "proof_blake3"


_DIGEST_RULES = frozenset(
    {BatchRule.SEED_MISMATCH, BatchRule.COMPLETION_TOKENS_MISMATCH, BatchRule.PROOF_MISMATCH}
)


@dataclass(frozen=True)
class BatchProblem:
    """One rule a batch breaks: which, for which rollout (``None``: the whole batch), and why."""

    rule: BatchRule
    rollout_index: int | None
    message: str

    @property
    def note(self) -> str:
        """The short name a validator's verdict notes carry: ``task``, ``rollouts[3].order``;
        the three per-rollout digest mismatches are all ``rollouts[i].digest``."""
        name = "digest" if self.rule in _DIGEST_RULES else self.rule.value
        if self.rollout_index is None:
            return name
        return f"rollouts[{self.rollout_index}].{name}"


def check(
    binding: LeaseBinding,
    terms: BatchTerms,
    batch: rollout_pb2.RolloutBatch,
    digests: Sequence[commitment_pb2.RolloutDigest],
    *,
    limit: int | None = None,
) -> list[BatchProblem]:
    """Every rule ``batch`` and the commitment's per-rollout ``digests`` break (empty: none).

    The batch must name the binding's task, lease, fencing token and node and the task's
    checkpoint; hold one rollout per prompt and sample in ``(prompt_index, sample_index)``
    order, each answering its prompt id, sampled with its derived seed
    (:func:`~rollnet.sdk.proofs.binding.derive_sampling_seed`) and within the terms' lengths;
    and the commitment must list one digest per rollout whose seed, completion length and
    proof digest are the rollout's. A wrong count stops the check there. ``limit``: stop after
    that many problems.
    """
    problems: list[BatchProblem] = []

    def add(rule: BatchRule, index: int | None, message: str) -> bool:
        problems.append(BatchProblem(rule, index, message))
        return limit is not None and len(problems) >= limit

    if batch.task_id != binding.task_id or terms.task_id != binding.task_id:
        add(BatchRule.TASK, None, "batch.task_id differs from the commitment's task")
    if batch.lease_id != binding.lease_id or batch.fencing_token != binding.fencing_token:
        add(BatchRule.LEASE, None, "batch lease differs from the commitment's lease")
    if batch.node_id != binding.node_id:
        add(BatchRule.NODE, None, "batch.node_id is not the submitting node")
    if batch.checkpoint_step != terms.checkpoint_step:
        add(
            BatchRule.CHECKPOINT_STEP,
            None,
            f"batch.checkpoint_step {batch.checkpoint_step} != task's {terms.checkpoint_step}",
        )
    samples, expected = terms.samples_per_prompt, terms.rollout_count
    rollouts = batch.rollouts
    if samples < 1 or expected == 0 or len(rollouts) != expected:
        add(
            BatchRule.ROLLOUT_COUNT,
            None,
            f"batch holds {len(rollouts)} rollouts, task asks {expected}",
        )
        return problems[:limit]
    if limit is not None and len(problems) >= limit:
        return problems
    lengths, max_new_tokens = terms.prompt_lengths, terms.max_new_tokens
    for index, rollout in enumerate(rollouts):
        prompt, sample = divmod(index, samples)
        if (rollout.prompt_index, rollout.sample_index) != (prompt, sample):
            message = (
                f"rollouts[{index}] is (prompt_index {rollout.prompt_index}, sample_index "
                f"{rollout.sample_index}); the rollout order puts ({prompt}, {sample}) there"
            )
            if add(BatchRule.ORDER, index, message):
                return problems
        elif rollout.prompt_id != terms.prompt_ids[prompt]:
            message = (
                f"rollouts[{index}] answers prompt id {rollout.prompt_id}; prompt {prompt} "
                f"is {terms.prompt_ids[prompt]}"
            )
            if add(BatchRule.PROMPT_ID, index, message):
                return problems
        elif (
            lengths is not None
            and prompt < len(lengths)
            and len(rollout.prompt_token_ids) != lengths[prompt]
        ):
            message = (
                f"rollouts[{index}] has {len(rollout.prompt_token_ids)} prompt tokens; "
                f"prompt {prompt} has {lengths[prompt]} with the task's checkpoint"
            )
            if add(BatchRule.PROMPT_LENGTH, index, message):
                return problems
        if max_new_tokens is not None and len(rollout.completion_token_ids) > max_new_tokens:
            message = (
                f"rollouts[{index}] has {len(rollout.completion_token_ids)} completion "
                f"tokens, the task allows {max_new_tokens}"
            )
            if add(BatchRule.COMPLETION_LENGTH, index, message):
                return problems
    if len(digests) != len(rollouts):
        add(
            BatchRule.DIGEST_COUNT,
            None,
            "commitment lists a different number of rollouts than the batch",
        )
        return problems[:limit]
    for index, (rollout, digest) in enumerate(zip(rollouts, digests, strict=True)):
        found: list[tuple[BatchRule, str]] = []
        if rollout.sampling_seed != digest.sampling_seed:
            found.append(
                (BatchRule.SEED_MISMATCH, f"rollouts[{index}].sampling_seed does not match")
            )
        else:
            seed = derive_sampling_seed(binding.network_id, binding.task_id, index)
            if rollout.sampling_seed != seed:
                found.append(
                    (
                        BatchRule.SEED_NOT_DERIVED,
                        f"rollouts[{index}].sampling_seed is not the task's seed {seed}: "
                        f'BLAKE3("{SEED_DOMAIN}", network id, task id, rollout index)[:8] >> 1 '
                        "(docs/verification.md, Binding)",
                    )
                )
        if len(rollout.completion_token_ids) != digest.completion_tokens:
            found.append(
                (
                    BatchRule.COMPLETION_TOKENS_MISMATCH,
                    f"rollouts[{index}].completion_tokens does not match",
                )
            )
        if proof_digest(rollout.toploc_proof) != digest.proof_blake3:
            found.append(
                (BatchRule.PROOF_MISMATCH, f"rollouts[{index}].proof_blake3 does not match")
            )
        for rule, message in found:
            if add(rule, index, message):
                return problems
    return problems


def rollout_batch(
    binding: LeaseBinding, checkpoint_step: int, rollouts: Sequence[rollout_pb2.Rollout]
) -> rollout_pb2.RolloutBatch:
    """The ``RolloutBatch`` of ``rollouts`` (in the order given) under ``binding``."""
    return rollout_pb2.RolloutBatch(
        task_id=binding.task_id,
        lease_id=binding.lease_id,
        fencing_token=binding.fencing_token,
        node_id=binding.node_id,
        checkpoint_step=checkpoint_step,
        rollouts=rollouts,
    )


def encode_batch(
    binding: LeaseBinding, checkpoint_step: int, rollouts: Sequence[rollout_pb2.Rollout]
) -> bytes:
    """The blob of :func:`rollout_batch`: its deterministic serialization (fields in number
    order, packed repeated scalars). Any encoding of the same message is accepted, since the
    commitment names the blob by the BLAKE3 of the bytes actually uploaded."""
    return rollout_batch(binding, checkpoint_step, rollouts).SerializeToString(deterministic=True)


def rollout_digests(
    binding: LeaseBinding, blob_blake3: bytes, rollouts: Sequence[rollout_pb2.Rollout]
) -> list[commitment_pb2.RolloutDigest]:
    """The commitment's per-rollout digests, each signed over ``binding`` (the rollout's index
    is its place in ``rollouts``)."""
    return [
        commitment_pb2.RolloutDigest(
            sampling_seed=rollout.sampling_seed,
            proof_blake3=proof_digest(rollout.toploc_proof),
            completion_tokens=len(rollout.completion_token_ids),
            commitment_digest=commitment_digest(
                binding,
                blob_blake3=blob_blake3,
                rollout_index=index,
                sampling_seed=rollout.sampling_seed,
                prompt_ids=rollout.prompt_token_ids,
                completion_ids=rollout.completion_token_ids,
                proof=rollout.toploc_proof,
            ),
        )
        for index, rollout in enumerate(rollouts)
    ]


def commitment_request(
    binding: LeaseBinding, blob: common_pb2.BlobRef, rollouts: Sequence[rollout_pb2.Rollout]
) -> commitment_service_pb2.SubmitCommitmentRequest:
    """The ``SubmitCommitment`` request naming the uploaded batch ``blob`` of ``rollouts``
    (``request_id`` left for the caller to set)."""
    return commitment_service_pb2.SubmitCommitmentRequest(
        lease_id=binding.lease_id,
        fencing_token=binding.fencing_token,
        task_id=binding.task_id,
        rollout_batch=blob,
        rollouts=rollout_digests(binding, blob.blake3, rollouts),
        claimed_work=commitment_pb2.WorkClaim(
            prefill_tokens=sum(len(r.prompt_token_ids) for r in rollouts),
            decode_tokens=sum(len(r.completion_token_ids) for r in rollouts),
        ),
        binding_digest=binding_digest(binding, blob.blake3),
    )


@dataclass(frozen=True)
class SealedBatch:
    """A finished task ready to upload and commit."""

    batch: bytes
    """The rollout batch blob: the ``RolloutBatch``, serialized deterministically."""
    request: commitment_service_pb2.SubmitCommitmentRequest
    """The commitment naming it; ``request_id`` is left for the caller to set."""


def seal(
    binding: LeaseBinding, task: task_pb2.Task, rollouts: Sequence[rollout_pb2.Rollout]
) -> SealedBatch:
    """The batch blob and commitment request for ``rollouts`` of ``task`` leased as ``binding``.

    The rollouts must be in ``(prompt_index, sample_index)`` order, one per prompt and sample,
    each answering its prompt id and sampled with its derived seed: ``ValueError`` naming what
    is wrong otherwise (what :func:`check` refuses, other than completion and prompt lengths).
    """
    if task.task_id != binding.task_id:
        raise ValueError(f"task {task.task_id!r} is not the leased task {binding.task_id!r}")
    expected = len(task.prompt_ids) * task.samples_per_prompt
    if len(rollouts) != expected:
        raise ValueError(f"generator returned {len(rollouts)} rollouts, task asks {expected}")
    batch = rollout_batch(binding, task.checkpoint_step, rollouts)
    data = batch.SerializeToString(deterministic=True)
    blob = common_pb2.BlobRef(blake3=blake3.blake3(data).digest(), size=len(data))
    request = commitment_request(binding, blob, rollouts)
    problems = check(binding, BatchTerms.of_task(task), batch, request.rollouts, limit=8)
    if problems:
        raise ValueError("; ".join(problem.message for problem in problems))
    return SealedBatch(batch=data, request=request)


def seal_batch(
    *,
    network_id: str,
    node_id: str,
    task: task_pb2.Task,
    lease: task_pb2.Lease,
    rollouts: Sequence[rollout_pb2.Rollout],
) -> SealedBatch:
    """:func:`seal`, with the binding spelled out (the rollnet 0.1 signature, kept for callers
    of it)."""
    binding = LeaseBinding(
        network_id=network_id,
        node_id=node_id,
        task_id=task.task_id,
        lease_id=lease.lease_id,
        fencing_token=lease.fencing_token,
    )
    return seal(binding, task, rollouts)


__all__ = [
    "BatchProblem",
    "BatchRule",
    "BatchTerms",
    "SealedBatch",
    "batch_binding_digest",
    "binding_digest",
    "check",
    "commitment_request",
    "encode_batch",
    "rollout_batch",
    "rollout_digests",
    "seal",
    "seal_batch",
]
