"""Acceptance thresholds for the rollout checks, calibrated by ``bench/calibrate_proofs.py``.

Numbers and margins are recorded in ``docs/verification.md``. TOPLOC figures are per window:
any failing window rejects the rollout.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    sampling_tolerance: float
    """Gumbel check: a token passes if its score is >= the best other score minus this."""
    min_eos_probability: float
    """Termination: least validator probability (at the sampling temperature) of a final EOS."""


TOPLOC_PAPER = Thresholds(
    max_exp_mismatches=38,
    max_mant_err_mean=10.0,
    max_mant_err_median=8.0,
    max_sign_mismatches=128,
    max_unexplained_mismatches=None,
    min_boundary_distance=0.5,
    sampling_tolerance=1e-2,
    min_eos_probability=1e-4,
)
"""The TOPLOC paper's bf16 GPU thresholds (sampling and EOS limits are ours): for reference."""

FLOAT32 = Thresholds(
    max_exp_mismatches=8,
    max_mant_err_mean=0.25,
    max_mant_err_median=1.0,
    max_sign_mismatches=2,
    max_unexplained_mismatches=0,
    min_boundary_distance=2e-3,
    sampling_tolerance=1e-3,
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
    sampling_tolerance=0.05,
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
