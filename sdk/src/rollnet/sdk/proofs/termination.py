"""Termination check: a rollout ends with a probable EOS or at the length limit, never truncated."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import numpy.typing as npt

from rollnet.sdk.proofs.report import CheckName, CheckResult, Figure, Reason
from rollnet.sdk.proofs.sampling import log_softmax
from rollnet.sdk.proofs.thresholds import Thresholds

FINISH_EOS = "eos"
"""Finish reason: the last token is an end-of-sequence token."""
FINISH_LENGTH = "length"
"""Finish reason: the completion reached ``max_new_tokens``."""


def eos_probabilities(
    last_logits: npt.ArrayLike, eos_token_ids: Collection[int], temperature: float
) -> npt.NDArray[np.float64]:
    """Probability (at ``temperature``) of the EOS tokens under each row of logits ``[N, V]``."""
    rows = np.asarray(last_logits, dtype=np.float64)
    logprobs = log_softmax(rows / temperature)
    return np.asarray(np.exp(logprobs[..., list(eos_token_ids)]).sum(axis=-1), dtype=np.float64)


def check_termination(
    completion_ids: Sequence[int],
    *,
    finish_reason: str,
    eos_token_ids: Collection[int],
    max_new_tokens: int,
    last_logits: npt.ArrayLike,
    temperature: float,
    thresholds: Thresholds,
    eos_probability: float | None = None,
    eos_margin: float | None = None,
) -> CheckResult:
    """The rollout ends with a probable EOS, or at exactly the length limit; no EOS before the end.

    ``last_logits`` are the validator's logits [V] at the row that chose the final token;
    ``eos_probability``, when given, is :func:`eos_probabilities` of them, computed in advance
    (for many rollouts at once) and used instead.

    ``eos_margin`` is the final token's seeded Gumbel-max margin from the sampling check, when
    known. A final EOS that won that draw by at least the sampling tolerance was sampled, and
    honest sampling draws an EOS of any probability now and then: the probability floor then
    does not apply (it would reject honest rollouts at a rate of up to one per
    ``1 / min_eos_probability`` EOS draws). It applies where the sampling check cannot tell
    (the EOS won within the tolerance, or no margin is given).
    """
    length = len(completion_ids)
    figures: dict[str, Figure] = {"completion_tokens": length, "max_new_tokens": max_new_tokens}

    def fail(reason: Reason, detail: str) -> CheckResult:
        return CheckResult(CheckName.TERMINATION, False, reason, figures, detail)

    if length == 0:
        return fail(Reason.EMPTY_COMPLETION, "completion is empty")
    if length > max_new_tokens:
        return fail(Reason.TOO_LONG, "completion is longer than the limit")
    early = [i for i, t in enumerate(completion_ids[:-1]) if t in eos_token_ids]
    if early:
        figures["first_eos"] = early[0]
        return fail(Reason.EOS_BEFORE_END, "EOS inside the completion")
    ends_with_eos = completion_ids[-1] in eos_token_ids
    if ends_with_eos:
        if eos_probability is None:
            eos_probability = float(eos_probabilities(last_logits, eos_token_ids, temperature))
        eos_prob = eos_probability
        figures["eos_probability"] = eos_prob
        if finish_reason != FINISH_EOS:
            return fail(Reason.FINISH_REASON_MISMATCH, "ends with EOS but claims another reason")
        sampled = eos_margin is not None and eos_margin >= thresholds.sampling_tolerance
        # Written so that NaN fails (an EOS probability that is not a number proves nothing).
        if not sampled and not eos_prob >= thresholds.min_eos_probability:
            return fail(Reason.EOS_IMPROBABLE, "final EOS is improbable under the model")
        return CheckResult(CheckName.TERMINATION, True, None, figures)
    if length < max_new_tokens:
        return fail(Reason.TRUNCATED, "ends without EOS before the length limit")
    if finish_reason != FINISH_LENGTH:
        return fail(Reason.FINISH_REASON_MISMATCH, "hit the length limit but claims another reason")
    return CheckResult(CheckName.TERMINATION, True, None, figures)
