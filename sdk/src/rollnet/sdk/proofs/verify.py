"""``verify_rollout``: run every check on one rollout against the validator's re-prefill."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from rollnet.sdk.proofs.assigned import check_assigned_data
from rollnet.sdk.proofs.binding import LeaseBinding, check_binding
from rollnet.sdk.proofs.report import VerificationReport
from rollnet.sdk.proofs.sampling import check_sampling
from rollnet.sdk.proofs.termination import check_termination
from rollnet.sdk.proofs.thresholds import Thresholds
from rollnet.sdk.proofs.toploc import check_toploc


@dataclass(frozen=True)
class RolloutClaim:
    """What a worker submitted for one rollout: tokens (from the blob) and its commitment."""

    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    finish_reason: str
    proof: bytes
    sampling_seed: int
    rollout_index: int
    commitment_digest: bytes


@dataclass(frozen=True)
class RolloutAssignment:
    """What the validator knows without the worker: lease, blob, assigned prompt, settings."""

    lease: LeaseBinding
    blob_blake3: bytes
    assigned_prompt_ids: Sequence[int]
    temperature: float
    max_new_tokens: int
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)


def verify_rollout(
    claim: RolloutClaim,
    assignment: RolloutAssignment,
    *,
    hidden_states: npt.ArrayLike,
    logits: npt.ArrayLike,
    thresholds: Thresholds,
) -> VerificationReport:
    """Check one rollout and report every check's figures and the verdict.

    ``hidden_states`` [T, d] (floats or bf16 bit patterns) and ``logits`` [T, V] come from the
    validator's prefill of the *assigned* prompt followed by the claimed completion: row ``i`` is
    the position that predicts completion token ``i`` (so the prefill input is the prompt plus all
    but the last completion token). ``T`` must equal the completion length.
    """
    hidden = np.asarray(hidden_states)
    scores = np.asarray(logits)
    length = len(claim.completion_ids)
    if hidden.shape[0] != length or scores.shape[0] != length:
        raise ValueError(
            f"prefill rows (hidden {hidden.shape[0]}, logits {scores.shape[0]}) "
            f"must equal the completion length {length}"
        )
    binding = check_binding(
        assignment.lease,
        blob_blake3=assignment.blob_blake3,
        rollout_index=claim.rollout_index,
        claimed_seed=claim.sampling_seed,
        claimed_digest=claim.commitment_digest,
        prompt_ids=claim.prompt_ids,
        completion_ids=claim.completion_ids,
        proof=claim.proof,
    )
    assigned = check_assigned_data(assignment.assigned_prompt_ids, claim.prompt_ids)
    termination = check_termination(
        claim.completion_ids,
        finish_reason=claim.finish_reason,
        eos_token_ids=assignment.eos_token_ids,
        max_new_tokens=assignment.max_new_tokens,
        last_logits=scores[-1] if length else np.zeros(0),
        temperature=assignment.temperature,
        thresholds=thresholds,
    )
    toploc = check_toploc(claim.proof, hidden, thresholds)
    sampling = check_sampling(
        scores,
        claim.completion_ids,
        seed=claim.sampling_seed,
        temperature=assignment.temperature,
        thresholds=thresholds,
    )
    return VerificationReport((binding, assigned, termination, toploc, sampling))
