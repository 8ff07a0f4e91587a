"""``token_figures`` (one pass over the logits) gives exactly the separate checks' figures.

The references are the functions each check used on its own: the sampling margins and
tolerances, ``token_logprob_bounds``, the statistics' distribution moments and the EOS
probability bounds. Every figure must be equal bit for bit (NaN where they give NaN), on random
logits of several magnitudes, rows with ``-inf`` (masked tokens) and rows holding NaN.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from rollnet.sdk.proofs import sampling, statistics, termination
from rollnet.sdk.proofs.logit_figures import token_figures
from rollnet.sdk.proofs.thresholds import BFLOAT16, FLOAT32, Thresholds, sampling_tolerances

VOCAB = 97
EOS = frozenset({0, 5})


def _same(actual: npt.NDArray[np.float64], expected: npt.NDArray[np.float64]) -> None:
    np.testing.assert_array_equal(actual, expected, strict=True)


def _rollouts(
    rng: np.random.Generator, dtype: type[np.floating[npt.NBitBase]]
) -> tuple[list[npt.NDArray[np.floating[npt.NBitBase]]], list[list[int]], list[int]]:
    logits, completions, seeds = [], [], []
    for number, length in enumerate((1, 7, 40, 3, 0, 25)):
        scale = (0.5, 4.0, 30.0)[number % 3]
        z = (rng.standard_normal((length, VOCAB)) * scale).astype(dtype)
        if length > 2:
            z[1, rng.choice(VOCAB, 20, replace=False)] = -np.inf  # masked tokens
            z[2, 3] = np.nan
        logits.append(z)
        completions.append(rng.integers(0, VOCAB, length).tolist())
        seeds.append(int(rng.integers(0, 2**63 - 1)))
    completions[1][-1] = 5  # ends with EOS
    return logits, completions, seeds


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("temperature", "thresholds"), [(1.0, FLOAT32), (0.7, BFLOAT16)])
def test_fused_figures_equal_the_separate_functions(
    dtype: type[np.floating[npt.NBitBase]], temperature: float, thresholds: Thresholds
) -> None:
    logits, completions, seeds = _rollouts(np.random.default_rng(19), dtype)
    figures = token_figures(
        logits,
        completions,
        seeds=seeds,
        temperature=temperature,
        thresholds=thresholds,
        eos_token_ids=EOS,
    )
    assert figures.temperature == temperature
    assert figures.eos_token_ids == EOS
    assert not figures.out_of_vocabulary.any()
    for number, (z, ids, seed) in enumerate(zip(logits, completions, seeds, strict=True)):
        rows = figures.rows(number)
        margins = sampling.sampling_margins(z, ids, seed, temperature) if ids else np.zeros(0)
        _same(figures.margins[rows], margins)
        tolerances = sampling_tolerances(z, temperature, thresholds)
        _same(figures.tolerances[rows], tolerances)
        expected = sampling.token_logprob_bounds(z, ids, temperature, thresholds)
        bounds = figures.logprob_bounds(number)
        _same(bounds.values, expected.values)
        _same(bounds.lower, expected.lower)
        _same(bounds.upper, expected.upper)
        _same(figures.logprobs[rows], sampling.token_logprobs(z, ids, temperature))
        if ids:
            chosen, entropy, variance = statistics._distribution_moments(
                [z], np.asarray(ids, dtype=np.int64), temperature
            )
            _same(figures.logprobs[rows], chosen)
            _same(figures.entropy[rows], entropy)
            _same(figures.variance[rows], variance)
            low, high = termination.eos_probability_bounds(z[-1], EOS, temperature, thresholds)
            assert figures.eos_probability_bounds(number) == pytest.approx(
                (float(low[0]), float(high[0])), rel=0, abs=0, nan_ok=True
            )
    # The NaN row gives NaN figures, and the -inf row finite ones.
    assert np.isnan(figures.logprobs[figures.rows(2)][2])
    assert np.isfinite(figures.logprobs[figures.rows(2)][1])
    # The checks' results from the figures equal the separate functions' (repr: NaN figures).
    assert repr(sampling.sampling_results(figures)) == repr(
        sampling.check_sampling_batch(
            logits, completions, seeds=seeds, temperature=temperature, thresholds=thresholds
        )
    )
    assert repr(
        statistics.rollout_statistics_from_figures(figures, logits, completions, seeds)
    ) == repr(
        statistics.rollout_statistics_batch(
            logits,
            completions,
            seeds=seeds,
            temperature=temperature,
            thresholds=thresholds,
            eos_token_ids=EOS,
        )
    )


def test_a_rollout_out_of_the_vocabulary_is_marked_not_computed() -> None:
    rng = np.random.default_rng(3)
    logits = [rng.standard_normal((4, VOCAB)), rng.standard_normal((3, VOCAB))]
    completions = [[1, 2, VOCAB, 3], [4, 5, 6]]
    figures = token_figures(logits, completions, seeds=[1, 2], temperature=1.0, thresholds=FLOAT32)
    assert figures.out_of_vocabulary.tolist() == [True, False]
    assert sampling.sampling_results(figures) == sampling.check_sampling_batch(
        logits, completions, seeds=[1, 2], temperature=1.0, thresholds=FLOAT32
    )
    with pytest.raises(ValueError, match="out of the vocabulary"):
        statistics.rollout_statistics_from_figures(figures, logits, completions, [1, 2])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 0.0}, "temperature > 0"),
        ({"seeds": [-1]}, "seed"),
        ({"eos_token_ids": frozenset({VOCAB})}, "EOS token id"),
        ({"completion_ids": [[1, 2]]}, "completion length"),
    ],
)
def test_bad_input_is_refused(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {
        "completion_ids": [[1, 2, 3]],
        "seeds": [7],
        "temperature": 1.0,
        "thresholds": FLOAT32,
    }
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        token_figures([np.zeros((3, VOCAB))], **arguments)  # type: ignore[arg-type]
