"""``token_figures`` (one pass over the logits) gives exactly the separate checks' figures.

The references are the functions each check used on its own: the sampling margins and
tolerances, ``token_logprob_bounds``, the statistics' distribution moments and the EOS
probability bounds. Every figure must be equal bit for bit (NaN where they give NaN), on random
logits of several magnitudes, rows with ``-inf`` (masked tokens) and rows holding NaN.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from rollnet.sdk.proofs import logit_figures, sampling, statistics, termination
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


# -- the noise bounds (only the columns that can still beat a bound get their noise) ----------

WIDE_VOCAB = 4096  # above the bounds' minimum (32 sampled columns), 64 rows per block


def test_the_noise_is_monotone_in_the_hash_and_the_same_gathered() -> None:
    """Over all 2**24 uniforms: the computed noise never decreases as the hash's top 24 bits
    grow (what both bounds rely on), its largest value is the ceiling, the levels are its
    values at every 4,096th uniform, and any subset computed on its own gives the same bits."""
    chunk = 1 << 20
    previous = -np.inf
    for start in range(0, 1 << 24, chunk):
        tops = np.arange(start, start + chunk, dtype=np.uint32)
        noise = -sampling.negated_noise_of_bits((tops << np.uint32(8)) | np.uint32(0x5A))
        assert noise[0] >= previous
        assert (np.diff(noise) > 0).all()
        previous = float(noise[-1])
        levels = logit_figures._NOISE_LEVELS[start >> 12 : (start + chunk) >> 12]
        _same(levels, noise[:: 1 << 12])
        picked = np.random.default_rng(start).choice(chunk, 1001, replace=False)
        gathered = -sampling.negated_noise_of_bits((tops[picked] << np.uint32(8)).copy())
        _same(gathered, noise[picked])
    assert previous == logit_figures._NOISE_CEILING


def _honest_choices(z: npt.NDArray[np.float32], seed: int, temperature: float) -> list[int]:
    """What a worker drawing by the protocol's Gumbel-max picks from these logits."""
    return [int(i) for i in sampling.gumbel_scores(z, seed, temperature).argmax(axis=1)]


def _peaked(rng: np.random.Generator, rows: int) -> npt.NDArray[np.float32]:
    """Trained-model-like rows: a bulk and a few plausible tokens far above it."""
    z = rng.standard_normal((rows, WIDE_VOCAB)) * 2.0
    for row in range(rows):
        z[row, rng.choice(WIDE_VOCAB, 4, replace=False)] += 28.0 + rng.standard_normal(4)
    return z.astype(np.float32)


@pytest.mark.parametrize(
    ("case", "temperature", "path"),
    [
        ("flat", 1.0, "hash"),  # random-weight logits: few hashes pass the level
        ("peaked", 1.0, "bound"),  # the bulk is more than 17.33 below the bound
        ("sharp", 0.25, "bound"),  # a low temperature spreads the scores
        ("masked", 1.0, "bound"),  # -inf columns never pass
        ("spread", 1.0, "every"),  # neither bound leaves few columns
    ],
)
def test_bounded_margins_equal_the_definition(
    case: str, temperature: float, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(len(case))
    rows = 150  # three blocks
    if case == "flat":
        z = (rng.standard_normal((rows, WIDE_VOCAB)) * 0.3).astype(np.float32)
    elif case == "sharp":
        z = (rng.standard_normal((rows, WIDE_VOCAB)) * 3.0).astype(np.float32)
    elif case == "spread":
        z = (rng.standard_normal((rows, WIDE_VOCAB)) * 4.0).astype(np.float32)
    else:
        z = _peaked(rng, rows)
    if case == "masked":  # top-k style: most of the bulk masked, the plausible tokens kept
        masked = np.zeros_like(z, dtype=np.bool_)
        masked[:, rng.choice(WIDE_VOCAB, 3000, replace=False)] = True
        z[masked & (z < 20.0)] = -np.inf
    seed = int(rng.integers(0, 2**63 - 1))
    ids = _honest_choices(z, seed, temperature)
    ids[3] = 61 * 5  # a sampled column, excluded from the bound
    ids[4] = int(rng.integers(0, WIDE_VOCAB))  # not the worker's draw: a negative margin
    ids[5] = int(np.argmax(np.where(np.isfinite(z[5]), -z[5], -np.inf)))  # the least likely
    calls = {"margins": 0, "hash": 0, "every": 0}

    def counted(name: str, function: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return function(*args, **kwargs)

        return wrapper

    for name, attribute in (("margins", "_margins"), ("hash", "_hash_rows")):
        monkeypatch.setattr(
            logit_figures, attribute, counted(name, getattr(logit_figures, attribute))
        )
    monkeypatch.setattr(
        logit_figures,
        "_whole_row_margins",
        counted("every", logit_figures._whole_row_margins),
    )
    figures = token_figures([z], [ids], seeds=[seed], temperature=temperature, thresholds=FLOAT32)
    _same(figures.margins, sampling.sampling_margins(z, ids, seed, temperature))
    _same(figures.tolerances, sampling_tolerances(z, temperature, FLOAT32))
    _same(figures.logprobs, sampling.token_logprobs(z, ids, temperature))
    _, entropy, variance = statistics._distribution_moments(
        [z], np.asarray(ids, dtype=np.int64), temperature
    )
    _same(figures.entropy, entropy)
    _same(figures.variance, variance)
    assert figures.margins[4] < 0  # the check can fail through the bounds
    blocks = -(-rows // (logit_figures._BLOCK_ELEMENTS // WIDE_VOCAB))
    assert blocks > 1
    expected = {
        "bound": {"margins": blocks, "hash": 0, "every": 0},
        "hash": {"margins": blocks, "hash": blocks, "every": 0},
        "every": {"margins": 1, "every": blocks},  # not retried after failing
    }[path]
    assert {name: calls[name] for name in expected} == expected


def test_rows_the_bounds_cannot_take_fall_back_exactly() -> None:
    """A NaN row, a row whose other columns are all -inf, an infinite logit: every column's
    noise for their blocks, the same margins (NaN where the definition gives NaN)."""
    rng = np.random.default_rng(5)
    z = _peaked(rng, 64)
    seed = 99
    ids = _honest_choices(z, seed, 1.0)
    z[1, 7] = np.nan
    z[20, :] = -np.inf
    z[20, ids[20]] = 3.0
    z[40, 9] = np.inf
    figures = token_figures([z], [ids], seeds=[seed], temperature=1.0, thresholds=FLOAT32)
    _same(figures.margins, sampling.sampling_margins(z, ids, seed, 1.0))
    assert np.isnan(figures.margins[1])
    assert figures.margins[20] == np.inf
    assert np.isfinite(figures.margins[0])
