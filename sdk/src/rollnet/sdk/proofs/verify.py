"""``verify_rollout``: run every check on one rollout against the validator's re-prefill."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from rollnet.sdk.proofs.assigned import check_assigned_data
from rollnet.sdk.proofs.binding import LeaseBinding, check_binding
from rollnet.sdk.proofs.logit_figures import TokenFigures
from rollnet.sdk.proofs.report import CheckResult, VerificationReport
from rollnet.sdk.proofs.sampling import check_sampling_batch, sampling_results
from rollnet.sdk.proofs.termination import check_termination, eos_probability_bounds
from rollnet.sdk.proofs.thresholds import Thresholds
from rollnet.sdk.proofs.toploc import check_toploc_batch


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
    return verify_rollouts(
        [claim], [assignment], hidden_states=[hidden_states], logits=[logits], thresholds=thresholds
    )[0]


def verify_rollouts(
    claims: Sequence[RolloutClaim],
    assignments: Sequence[RolloutAssignment],
    *,
    hidden_states: Sequence[npt.ArrayLike],
    logits: Sequence[npt.ArrayLike],
    thresholds: Thresholds,
    figures: TokenFigures | None = None,
) -> list[VerificationReport]:
    """:func:`verify_rollout` for many rollouts (a validator's whole batch), with the same reports.

    Every check still runs on every rollout; the numeric ones are vectorized across rollouts:
    TOPLOC verifies all windows together, the sampling check regenerates the noise of every
    token in one pass, and the final-EOS probabilities are computed in one call.

    ``figures``, when given, are :func:`rollnet.sdk.proofs.logit_figures.token_figures` of these
    ``logits`` (every rollout at one temperature, with its EOS set), computed once for this and
    the caller's other checks: the sampling and termination checks read them instead of walking
    the logits again (same reports).
    """
    if not len(claims) == len(assignments) == len(hidden_states) == len(logits):
        raise ValueError("one assignment, hidden-state array and logits array per claim")
    hidden = [np.asarray(h) for h in hidden_states]
    scores = [np.asarray(z) for z in logits]
    for claim, h, z in zip(claims, hidden, scores, strict=True):
        length = len(claim.completion_ids)
        if h.shape[0] != length or z.shape[0] != length:
            raise ValueError(
                f"prefill rows (hidden {h.shape[0]}, logits {z.shape[0]}) "
                f"must equal the completion length {length}"
            )
    toploc = check_toploc_batch([c.proof for c in claims], hidden, thresholds)
    eos_probability: dict[int, float] = {}
    eos_probability_upper: dict[int, float] = {}
    eos_tolerance: dict[int, float] = {}
    if figures is not None:
        if any(
            a.temperature != figures.temperature or a.eos_token_ids != figures.eos_token_ids
            for a in assignments
        ) or figures.lengths.size != len(claims):
            raise ValueError("figures must be of these rollouts, their temperature and EOS set")
        sampling = dict(enumerate(sampling_results(figures)))
        probabilities, uppers = (a.tolist() for a in figures.final_eos_probability_bounds())
        final_tolerances = figures.tolerances[figures.starts[1:] - 1].tolist()
        for number, (claim, assignment) in enumerate(zip(claims, assignments, strict=True)):
            # A rollout with a token outside the vocabulary has no figures: the termination
            # check computes its own.
            ends = claim.completion_ids[-1:]
            ends_with_eos = bool(ends) and ends[0] in assignment.eos_token_ids
            if ends_with_eos and not figures.out_of_vocabulary[number]:
                eos_probability[number] = probabilities[number]
                eos_probability_upper[number] = uppers[number]
                eos_tolerance[number] = final_tolerances[number]
    else:
        sampling = {}
        by_temperature: dict[float, list[int]] = {}
        for number, assignment in enumerate(assignments):
            by_temperature.setdefault(assignment.temperature, []).append(number)
        for temperature, numbers in by_temperature.items():
            results = check_sampling_batch(
                [scores[n] for n in numbers],
                [claims[n].completion_ids for n in numbers],
                seeds=[claims[n].sampling_seed for n in numbers],
                temperature=temperature,
                thresholds=thresholds,
            )
            sampling.update(zip(numbers, results, strict=True))
        # Final-EOS probabilities, one call per (temperature, EOS set) for the rollouts that
        # end in EOS.
        eos_groups: dict[tuple[float, frozenset[int]], list[int]] = {}
        for number, (claim, assignment) in enumerate(zip(claims, assignments, strict=True)):
            if claim.completion_ids and claim.completion_ids[-1] in assignment.eos_token_ids:
                key = (assignment.temperature, assignment.eos_token_ids)
                eos_groups.setdefault(key, []).append(number)
        for (temperature, eos_ids), numbers in eos_groups.items():
            if len({scores[n].shape[1] for n in numbers}) == 1:
                last = np.stack([scores[n][-1] for n in numbers])
                low, high = eos_probability_bounds(last, eos_ids, temperature, thresholds)
                eos_probability.update(zip(numbers, low.tolist(), strict=True))
                eos_probability_upper.update(zip(numbers, high.tolist(), strict=True))
    reports = []
    for number, (claim, assignment) in enumerate(zip(claims, assignments, strict=True)):
        length = len(claim.completion_ids)
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
            last_logits=scores[number][-1] if length else np.zeros(0),
            temperature=assignment.temperature,
            thresholds=thresholds,
            eos_probability=eos_probability.get(number),
            eos_probability_upper=eos_probability_upper.get(number),
            eos_margin=_final_margin(sampling[number]),
            eos_tolerance=eos_tolerance.get(number),
        )
        reports.append(
            VerificationReport((binding, assigned, termination, toploc[number], sampling[number]))
        )
    return reports


def _final_margin(sampling: CheckResult) -> float | None:
    """The final token's sampling margin, when the sampling check computed one."""
    if sampling.reason is not None:
        return None
    value = sampling.figures.get("final_margin")
    return float(value) if isinstance(value, int | float) else None
