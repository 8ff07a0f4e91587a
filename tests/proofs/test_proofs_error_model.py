"""The error model of the numeric checks (``rollnet.sdk.proofs.thresholds``): per-row logit
tolerances, the sampling tolerance in score units, the log-probability interval and the EOS
bounds; honest perturbations inside the model pass at any temperature, larger ones fail."""

from __future__ import annotations

import numpy as np
import pytest

from rollnet.sdk import proofs
from rollnet.sdk.proofs import BFLOAT16, FLOAT32, Reason, sampling
from rollnet.sdk.proofs.thresholds import (
    logit_tolerances,
    logprob_bounds,
    sampling_tolerances,
)

TEMPERATURES = (0.001, 0.01, 0.13, 1.0, 2.0)


def test_tolerances_follow_magnitude_dtype_and_temperature() -> None:
    row = np.array([[0.5, -2.0, 1.0], [40.0, -3.0, 0.0]])
    logit = logit_tolerances(row, BFLOAT16)
    expected = BFLOAT16.logit_error_relative * np.array([2.0, 40.0]) + BFLOAT16.logit_error_floor
    np.testing.assert_allclose(logit, expected)
    for temperature in TEMPERATURES:
        scaled = sampling_tolerances(row, temperature, BFLOAT16)
        np.testing.assert_allclose(scaled, logit / temperature)
    assert (logit_tolerances(row, FLOAT32) < logit / 100).all()
    with np.errstate(invalid="ignore"):
        assert np.isnan(logit_tolerances(np.array([[np.nan, 1.0]]), FLOAT32)).all()
    with pytest.raises(ValueError, match="temperature"):
        sampling_tolerances(row, 0.0, FLOAT32)


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("thresholds", [FLOAT32, BFLOAT16], ids=["float32", "bfloat16"])
def test_honest_log_probabilities_lie_in_their_interval(
    temperature: float, thresholds: proofs.Thresholds
) -> None:
    # A worker whose logits differ from the validator's by at most half the row's tolerance
    # each (so every difference moves by at most the tolerance) reports a log-probability
    # inside the validator's interval, at every temperature; the extreme perturbation (chosen
    # down, all others up) lands on the boundary.
    rng = np.random.default_rng(int(temperature * 1000))
    vocab, rows = 64, 400
    z = rng.standard_normal((rows, vocab)) * rng.choice([0.2, 3.0, 30.0], size=(rows, 1))
    z[::7, 1] = z[::7, 0] + 1e-4  # near-ties, where tiny temperatures swing log-probs
    ids = rng.integers(0, vocab, size=rows)
    ids[::7] = 0
    bounds = proofs.token_logprob_bounds(z, ids.tolist(), temperature, thresholds)
    np.testing.assert_allclose(bounds.values, proofs.token_logprobs(z, ids.tolist(), temperature))
    half = logit_tolerances(z, thresholds)[:, None] / 2
    for _ in range(5):
        noisy = z + rng.uniform(-1, 1, z.shape) * half
        claimed = proofs.token_logprobs(noisy, ids.tolist(), temperature)
        assert bounds.contains(claimed).all()
        assert (bounds.excess(claimed) <= 1.0).all()
    worst = z + half
    worst[np.arange(rows), ids] -= 2 * half[:, 0]
    lowest = proofs.token_logprobs(worst, ids.tolist(), temperature)
    np.testing.assert_allclose(lowest, bounds.lower, rtol=1e-6, atol=2e-6)
    # Beyond the tolerance (twice as far on every difference): outside, somewhere.
    beyond = z + 2 * half
    beyond[np.arange(rows), ids] -= 4 * half[:, 0]
    assert not bounds.contains(proofs.token_logprobs(beyond, ids.tolist(), temperature)).all()


def test_the_interval_is_tight_for_a_dominant_token_and_wide_at_a_near_tie() -> None:
    # T = 0.001, bf16 tolerance on logits of magnitude 1: a token 1 logit ahead has
    # log-probability ~ -e^-1000 and an interval of nearly zero width; two tokens 1e-4 apart
    # have log-probabilities -0.64 / -0.74 that honest noise can move anywhere in [-tol/T, 0].
    z = np.array([[1.0, 0.0, -1.0], [1.0, 1.0 - 1e-4, -1.0]])
    bounds = proofs.token_logprob_bounds(z, [0, 0], 0.001, BFLOAT16)
    assert bounds.upper[0] - bounds.lower[0] < 1e-5
    assert bounds.contains([-1e-6 / 2, -0.1])[1]
    assert bounds.contains([0.0, -20.0]).all()
    assert not bounds.contains([-0.5, 0.0])[0]  # a dominant token shaded by 0.5 nats


def test_logprob_bounds_order_and_nan() -> None:
    lower, upper = logprob_bounds(np.array([-5.0, 0.0, 5.0]), np.array([0.1, 0.1, 0.1]))
    assert (lower < upper).all()
    assert (upper <= 1e-6).all()
    with np.errstate(invalid="ignore"):
        lower, upper = logprob_bounds(np.array([np.nan]), np.array([0.1]))
    bounds = sampling.LogprobBounds(np.array([np.nan]), lower, upper)
    assert not bounds.contains([-1.0]).any()


@pytest.mark.parametrize("temperature", [0.001, 0.13, 1.0])
def test_the_sampling_check_allows_the_tolerance_and_not_more(temperature: float) -> None:
    # Row 0's chosen token loses its seeded draw by 0.9 (then 1.1) of its row's tolerance.
    rng = np.random.default_rng(5)
    vocab = 32
    z = rng.standard_normal((1, vocab)) * 4
    seed = 12345
    scores = sampling.gumbel_scores(z, seed, temperature)
    order = np.argsort(scores[0])
    best, second = int(order[-1]), int(order[-2])
    tolerance = float(sampling_tolerances(z, temperature, BFLOAT16)[0])
    for fraction, passes in ((0.9, True), (1.1, False)):
        shifted = z.copy()
        # Put the runner-up `fraction` tolerances (score units) behind the winner.
        gap = scores[0, best] - scores[0, second]
        shifted[0, second] += (gap - fraction * tolerance) * temperature
        result = proofs.check_sampling(
            shifted, [second], seed=seed, temperature=temperature, thresholds=BFLOAT16
        )
        tolerance_here = float(result.figures["final_tolerance"])
        assert tolerance_here == pytest.approx(
            float(sampling_tolerances(shifted, temperature, BFLOAT16)[0])
        )
        assert result.passed is passes, result
        assert float(result.figures["min_margin_fraction"]) == pytest.approx(
            -fraction * tolerance / tolerance_here, rel=1e-3
        )


def test_a_near_tied_eos_at_a_tiny_temperature_is_not_improbable() -> None:
    # The validator's logits put EOS 0.01 below the top token at T = 0.001: its probability is
    # e^-10 < 1e-4 there, but within the bf16 tolerance it could have been the top token, so
    # the floor (applied to the upper bound) does not reject; 1 logit below, it does.
    eos = 0
    for gap, passes in ((0.01, True), (1.0, False)):
        row = np.array([1.0 - gap, 1.0, -1.0, 0.0])
        probability, upper = proofs.eos_probability_bounds(row[None], {eos}, 0.001, BFLOAT16)
        assert probability[0] < BFLOAT16.min_eos_probability
        assert bool(upper[0] >= BFLOAT16.min_eos_probability) is passes
        result = proofs.check_termination(
            [5, eos],
            finish_reason="eos",
            eos_token_ids=frozenset({eos}),
            max_new_tokens=8,
            last_logits=row,
            temperature=0.001,
            thresholds=BFLOAT16,
            eos_margin=-0.5 * float(sampling_tolerances(row, 0.001, BFLOAT16)),
        )
        assert result.passed is passes
        if not passes:
            assert result.reason is Reason.EOS_IMPROBABLE
        assert float(result.figures["eos_probability_upper"]) == pytest.approx(float(upper[0]))
        assert np.isfinite(upper[0])
