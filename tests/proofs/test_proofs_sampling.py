"""Seeded Gumbel-max noise (numpy and torch, bit for bit) and the sampling check."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rollnet.sdk.proofs import sampling
from rollnet.sdk.proofs.report import Reason
from rollnet.sdk.proofs.thresholds import FLOAT32

MASK = 0xFFFFFFFF


def reference_hash(seed: int, position: int, token: int) -> int:
    """The noise hash written with Python's unbounded integers (the specification)."""

    def mix(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x7FEB352D) & MASK
        x ^= x >> 15
        x = (x * 0x846CA68B) & MASK
        return x ^ (x >> 16)

    h = mix((seed & MASK) ^ 0x243F6A88)
    h = mix(h ^ (seed >> 32))
    h = mix(h ^ position)
    return mix(h ^ token)


SEEDS = [0, 1, 12345, 2**32 - 1, 2**32, 2**62 + 7, 2**63 - 1]


def test_numpy_hash_matches_the_specification() -> None:
    positions = [0, 1, 31, 2**31 + 5, 2**32 - 1]
    for seed in SEEDS:
        for position in positions:
            bits = sampling.noise_bits([seed], [position], 300)[0]
            assert bits.tolist() == [reference_hash(seed, position, t) for t in range(300)]


def test_torch_noise_is_bit_identical_to_numpy() -> None:
    torch = pytest.importorskip("torch")
    from rollnet.sdk.proofs import sampling_torch

    rng = np.random.default_rng(0)
    seeds = np.array(SEEDS + [int(s) for s in rng.integers(0, 2**63 - 1, 57)], dtype=np.int64)
    positions = rng.integers(0, 4096, size=seeds.size)
    ours = sampling.noise_bits(seeds, positions, 1000)
    theirs = sampling_torch.noise_bits(torch.from_numpy(seeds), torch.from_numpy(positions), 1000)
    assert np.array_equal(ours, theirs.numpy())
    g_np = sampling.gumbel_noise(seeds, positions, 1000)
    g_torch = sampling_torch.gumbel_noise(
        torch.from_numpy(seeds), torch.from_numpy(positions), 1000
    )
    assert np.abs(g_np - g_torch.numpy()).max() < 1e-12


def test_uniforms_of_uint32_words_equal_the_definition() -> None:
    """``(t + 0.5) / 2**24`` of the top 24 bits ``t``, for every ``t`` (the uint32 path builds
    ``(2t + 1) * 2**-25`` instead), whatever the low 8 bits; the int64 path agrees."""
    chunk = 1 << 20
    for start in range(0, 1 << 24, chunk):
        tops = np.arange(start, start + chunk, dtype=np.uint32)
        low = (tops * np.uint32(0x9E3779B1)) >> np.uint32(24)  # every low byte, scrambled
        words = (tops << np.uint32(8)) | low
        expected = (tops.astype(np.float64) + 0.5) / 2.0**24
        uniforms = sampling.uniforms_from_bits(words)
        assert uniforms.dtype == np.float64
        assert np.array_equal(uniforms, expected)
        sample = words[::997]
        np.testing.assert_array_equal(
            sampling.uniforms_from_bits(sample.astype(np.int64)), expected[::997], strict=True
        )


def test_uniforms_are_open_interval_and_gumbel_is_standard() -> None:
    bits = np.array([0, MASK], dtype=np.int64)
    u = sampling.uniforms_from_bits(bits)
    assert 0 < u[0] < u[1] < 1
    noise = sampling.gumbel_noise(np.arange(200), np.zeros(200, dtype=np.int64), 1000)
    assert abs(noise.mean() - 0.5772) < 0.01  # Euler-Mascheroni constant
    assert abs(noise.std() - math.pi / math.sqrt(6)) < 0.01


def test_gumbel_max_draws_follow_the_softmax() -> None:
    logits = np.array([2.0, 1.0, 0.0, -1.0, 0.5])
    temperature = 0.7
    draws = 40_000
    scores = logits / temperature + sampling.gumbel_noise(
        np.full(draws, 99), np.arange(draws), logits.size
    )
    counts = np.bincount(scores.argmax(axis=1), minlength=logits.size)
    expected = np.exp(logits / temperature) / np.exp(logits / temperature).sum() * draws
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 25  # 4 degrees of freedom: p ~ 5e-5


def _sampled(logits: np.ndarray, seed: int, temperature: float) -> list[int]:
    chosen: list[int] = sampling.gumbel_scores(logits, seed, temperature).argmax(axis=1).tolist()
    return chosen


def test_honest_tokens_pass_and_an_altered_token_fails() -> None:
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((50, 101)).astype(np.float32) * 2
    tokens = _sampled(logits, 7, 0.8)
    ok = sampling.check_sampling(logits, tokens, seed=7, temperature=0.8, thresholds=FLOAT32)
    assert ok.passed
    assert float(ok.figures["min_margin"]) >= 0
    wrong = list(tokens)
    wrong[20] = (wrong[20] + 1) % 101
    bad = sampling.check_sampling(logits, wrong, seed=7, temperature=0.8, thresholds=FLOAT32)
    assert (bad.passed, bad.reason) == (False, Reason.TOKEN_NOT_SAMPLED)
    assert bad.figures["first_violation"] == 20
    other_seed = sampling.check_sampling(
        logits, tokens, seed=8, temperature=0.8, thresholds=FLOAT32
    )
    assert not other_seed.passed


def test_tolerance_absorbs_small_logit_noise_only() -> None:
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((64, 50))
    tokens = _sampled(logits, 3, 1.0)
    noisy = logits + rng.standard_normal(logits.shape) * 1e-6
    assert sampling.check_sampling(
        noisy, tokens, seed=3, temperature=1.0, thresholds=FLOAT32
    ).passed


def test_invalid_inputs() -> None:
    with pytest.raises(ValueError, match="temperature"):
        sampling.gumbel_scores(np.zeros((1, 3)), 1, 0.0)
    with pytest.raises(ValueError, match="seed"):
        sampling.check_seed(-1)
    with pytest.raises(ValueError, match="seed"):
        sampling.check_seed(2**63)
    out_of_range = sampling.check_sampling(
        np.zeros((1, 3)), [5], seed=1, temperature=1.0, thresholds=FLOAT32
    )
    assert out_of_range.reason is Reason.TOKEN_OUT_OF_VOCABULARY


def test_non_finite_margins_fail_instead_of_passing() -> None:
    # A NaN or overflowing logit makes margins NaN: "NaN < -tolerance" is False, so a check
    # written that way would pass any token at all.
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((20, 30))
    tokens = _sampled(logits, 4, 1.0)
    assert sampling.check_sampling(logits, tokens, seed=4, temperature=1.0, thresholds=FLOAT32)
    poisoned = logits.copy()
    poisoned[7, 3] = np.nan
    result = sampling.check_sampling(poisoned, tokens, seed=4, temperature=1.0, thresholds=FLOAT32)
    assert (result.passed, result.reason) == (False, Reason.TOKEN_NOT_SAMPLED)
    assert result.figures["first_violation"] == 7
    assert result.figures["non_finite_margins"] == 1
    # A temperature so small that logits / T overflow: every finite check is lost.
    tiny = sampling.check_sampling(logits, tokens, seed=4, temperature=1e-310, thresholds=FLOAT32)
    assert not tiny.passed


def test_the_final_tokens_margin_is_reported() -> None:
    rng = np.random.default_rng(6)
    logits = rng.standard_normal((12, 40))
    tokens = _sampled(logits, 9, 0.7)
    result = sampling.check_sampling(logits, tokens, seed=9, temperature=0.7, thresholds=FLOAT32)
    expected = sampling.sampling_margins(logits, tokens, seed=9, temperature=0.7)[-1]
    assert result.figures["final_margin"] == pytest.approx(expected)
    assert float(result.figures["final_margin"]) >= 0
