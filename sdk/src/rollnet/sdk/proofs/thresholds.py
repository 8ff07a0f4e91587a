"""Acceptance thresholds for the rollout checks, and the honest-error model the numeric checks
share; calibrated by ``bench/calibrate_proofs.py`` and ``bench/calibrate_temperature.py``.

Numbers and margins are recorded in ``docs/verification.md``. TOPLOC figures are per window:
any failing window rejects the rollout.

**The error model.** A worker's and a validator's logits for the same row differ by numeric
noise (kernels, batch shapes, KV cache, dtype). Per row, the model bounds how much any
*difference* of two logits may move between them::

    |Δ(z_i − z_j)| <= logit_tolerance = logit_error_relative · max_v |z_v| + logit_error_floor

(logit units; the relative term is a multiple of the dtype's unit roundoff, because rounding
and the propagated error of a dot product scale with the logits' magnitude). Every numeric
check derives its per-token tolerance from it, here and nowhere else:

* sampling: a token's Gumbel margin (score units, ``logits / T``) may be as low as
  ``-logit_tolerance / T`` (:func:`sampling_tolerances`);
* log-probabilities: ``log_softmax(z / T)_c = -softplus(L)`` with
  ``L = logsumexp_{j != c}((z_j − z_c) / T)``, monotone in every difference, so the honest value
  lies in ``[-softplus(L + δ), -softplus(L − δ)]`` with ``δ = logit_tolerance / T``
  (:func:`logprob_bounds`): as wide as ``±δ`` where the chosen token is improbable or near-tied,
  and tight (``≈ δ · (1 − p)``) where it dominates. Plus :data:`LOGPROB_EVALUATION_SLACK` for
  the worker's own float32 evaluation and transport;
* termination: an EOS "won its draw" when its margin is at least its row's sampling tolerance,
  and the EOS-probability floor is compared with the highest probability the error model
  allows (the same bound on the EOS set's log-probability).

The tolerance is fixed in logit units, so in score units it grows as ``1 / T``: at a tiny
temperature the checks cannot tell apart tokens whose logits differ by less than the honest noise,
and do not pretend to.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Thresholds:
    """Per-check limits; a figure beyond its limit rejects the rollout."""

    max_exp_mismatches: int
    """Per window: top-k positions whose bf16 exponent differs (out of 128)."""
    max_mant_err_mean: float
    """Per window: mean |mantissa difference| over exponent-matching positions (0..127 units)."""
    max_mant_err_median: float
    """Per window: median |mantissa difference| over exponent-matching positions."""
    max_sign_mismatches: int
    """Per window: exponent-matching positions whose sign differs."""
    max_unexplained_mismatches: int | None
    """Per window: mismatches at values far from a bf16 rounding boundary (fp32 validators
    only; ``None`` disables the check, as needed when the validator itself runs in bf16)."""
    min_boundary_distance: float
    """How far (in bf16 ULPs, 0-0.5) from a rounding boundary a mismatch is unexplained."""
    logit_error_relative: float
    """Error model: honest ``|Δ(z_i − z_j)|`` per unit of the row's ``max |z|`` (a multiple of
    the dtype's unit roundoff)."""
    logit_error_floor: float
    """Error model: honest ``|Δ(z_i − z_j)|`` at any magnitude (logit units)."""
    min_eos_probability: float
    """Termination: least probability (at the sampling temperature) of a final EOS that did not
    clearly win its draw, compared with the highest the error model allows."""


FLOAT32_UNIT_ROUNDOFF = 2.0**-24
BFLOAT16_UNIT_ROUNDOFF = 2.0**-8

FLOAT32_RELATIVE = 2**10 * FLOAT32_UNIT_ROUNDOFF
"""fp32: 1,024 unit roundoffs (6.1e-5) of ``max |z|``. Measured on CPU: at most 15 (9e-7);
the headroom is for deeper models and other kernels (``docs/verification.md``)."""
FLOAT32_FLOOR = 1e-5
BFLOAT16_RELATIVE = 8 * BFLOAT16_UNIT_ROUNDOFF
"""bf16: 8 unit roundoffs (2^-5 = 0.031) of ``max |z|``. Measured on CPU: at most 5.5 in any row
and about 2 on rows with large logits (``docs/verification.md``)."""
BFLOAT16_FLOOR = 2**-6

LOGPROB_EVALUATION_SLACK = 1e-6
"""Absolute slack (nats) on a log-probability for the worker's float32 ``log_softmax`` and the
float32 wire format, on top of :data:`LOGPROB_RELATIVE_SLACK` times its magnitude."""
LOGPROB_RELATIVE_SLACK = 2.0**-21


TOPLOC_PAPER = Thresholds(
    max_exp_mismatches=38,
    max_mant_err_mean=10.0,
    max_mant_err_median=8.0,
    max_sign_mismatches=128,
    max_unexplained_mismatches=None,
    min_boundary_distance=0.5,
    logit_error_relative=2**-4,
    logit_error_floor=2**-5,
    min_eos_probability=1e-4,
)
"""The TOPLOC paper's bf16 GPU thresholds (error model and EOS limit are ours): for reference."""

FLOAT32 = Thresholds(
    max_exp_mismatches=8,
    max_mant_err_mean=0.25,
    max_mant_err_median=1.0,
    max_sign_mismatches=2,
    max_unexplained_mismatches=0,
    min_boundary_distance=2e-3,
    logit_error_relative=FLOAT32_RELATIVE,
    logit_error_floor=FLOAT32_FLOOR,
    min_eos_probability=1e-4,
)
"""Calibrated for IEEE fp32 inference (worker and validator; TF32 off), on CPU."""

BFLOAT16 = Thresholds(
    max_exp_mismatches=12,
    max_mant_err_mean=3.0,
    max_mant_err_median=2.0,
    max_sign_mismatches=2,
    max_unexplained_mismatches=None,
    min_boundary_distance=0.5,
    logit_error_relative=BFLOAT16_RELATIVE,
    logit_error_floor=BFLOAT16_FLOOR,
    min_eos_probability=1e-4,
)
"""Calibrated for bf16 inference (worker and validator both in bf16), on CPU."""


def thresholds_for(dtype: str) -> Thresholds:
    """The calibrated thresholds for an inference dtype name (``float32`` or ``bfloat16``)."""
    table = {"float32": FLOAT32, "fp32": FLOAT32, "bfloat16": BFLOAT16, "bf16": BFLOAT16}
    try:
        return table[dtype]
    except KeyError:
        raise ValueError(f"no calibrated thresholds for dtype {dtype!r}") from None


FloatArray = npt.NDArray[np.float64]


def logit_tolerances(logits: npt.ArrayLike, thresholds: Thresholds) -> FloatArray:
    """Per row of ``logits`` (``[..., V]``): the honest bound on ``|Δ(z_i − z_j)|`` in logit
    units. NaN for a row holding NaN (a check compares with it so that NaN fails)."""
    z = np.asarray(logits)
    # max |z| as two reductions, without an |z| temporary the size of the logits.
    return logit_tolerances_of_extremes(z.max(axis=-1), z.min(axis=-1), thresholds)


def logit_tolerances_of_extremes(
    highest: npt.ArrayLike, lowest: npt.ArrayLike, thresholds: Thresholds
) -> FloatArray:
    """:func:`logit_tolerances` from each row's largest and smallest logit (for a caller that
    has found them already)."""
    magnitude = np.maximum(highest, np.negative(lowest)).astype(np.float64)
    return np.asarray(
        thresholds.logit_error_relative * magnitude + thresholds.logit_error_floor,
        dtype=np.float64,
    )


def sampling_tolerances(
    logits: npt.ArrayLike, temperature: float, thresholds: Thresholds
) -> FloatArray:
    """Per row: how far below the best other score (``logits / T + g``) an honestly sampled
    token's score may fall under the validator's logits: ``logit_tolerance / T``."""
    if not temperature > 0:
        raise ValueError("sampling tolerances need a temperature > 0")
    return logit_tolerances(logits, thresholds) / temperature


def softplus(x: npt.ArrayLike) -> FloatArray:
    """``log(1 + exp(x))``, exact in float64 at any magnitude (``inf`` at ``inf``)."""
    return np.asarray(np.logaddexp(0.0, np.asarray(x, dtype=np.float64)), dtype=np.float64)


def logprob_bounds(
    others: npt.ArrayLike, score_tolerance: npt.ArrayLike
) -> tuple[FloatArray, FloatArray]:
    """Lowest and highest honest log-probability of a token (or a token set).

    ``others`` is ``L = logsumexp_{j outside}((z_j − z_chosen) / T)`` under the validator's
    logits (the log-probability is ``-softplus(L)``) and ``score_tolerance`` is
    ``logit_tolerance / T``: every difference may move by that much, and the log-probability
    is monotone in each. Includes the evaluation slack; the lower bound is at most 0 only by
    the slack.
    """
    lower_arg = np.asarray(others, dtype=np.float64) + np.asarray(score_tolerance)
    upper_arg = np.asarray(others, dtype=np.float64) - np.asarray(score_tolerance)
    with np.errstate(invalid="ignore"):
        lower = -softplus(lower_arg)
        upper = -softplus(upper_arg)
    # Slack on finite bounds only: an infinite bound (a probability of exactly 0 in float64)
    # stays infinite rather than turning into NaN.
    lower -= LOGPROB_EVALUATION_SLACK + LOGPROB_RELATIVE_SLACK * np.abs(_finite(lower))
    upper += LOGPROB_EVALUATION_SLACK + LOGPROB_RELATIVE_SLACK * np.abs(_finite(upper))
    return lower, upper


def _finite(values: FloatArray) -> FloatArray:
    return np.asarray(np.where(np.isinf(values), 0.0, values), dtype=np.float64)
