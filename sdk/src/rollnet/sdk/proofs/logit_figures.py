"""Every per-token figure the numeric checks need, from ONE blocked pass over the logits.

The sampling check (Gumbel margins and tolerances), the log-probability check (the chosen
token's log-probability and the ``L`` its honest interval is built from), the per-node
statistics (entropy and ``Var(log p)``) and the termination check (the EOS set's probability)
each used to walk the ``[tokens, V]`` logits on their own, with an ``exp`` over the vocabulary
each time. :func:`token_figures` walks them once, a bounded block of rows at a time, reusing the
one float64 copy, the one noise array and the one ``exp`` per block, and the checks consume its
per-token arrays (:func:`rollnet.sdk.proofs.sampling.check_sampling_batch`,
:func:`rollnet.sdk.proofs.statistics.rollout_statistics_batch`,
:meth:`TokenFigures.logprob_bounds`). Each figure is computed with the same float64 operations
in the same order as the separate function that defines it, so the figures are identical
(tested against those functions).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rollnet.sdk.proofs.sampling import (
    LogprobBounds,
    _stacked_rows,
    check_seed,
    negated_gumbel_noise,
)
from rollnet.sdk.proofs.thresholds import Thresholds, logit_tolerances, logprob_bounds

FloatArray = npt.NDArray[np.float64]


_BLOCK_ELEMENTS = 1 << 16
"""Logits per block of the pass (512 KiB of float64 per temporary): the pass holds about ten
block-sized temporaries, which then stay in a core's L2 cache. Measured at V = 32,000 (512
rows, one core, load average 18-21): 280-285 ms per pass against 323-374 ms for blocks of
2**18 and 318 ms for 2**17; no difference at V = 101. The figures are per row, so any block
size gives the same bits."""


@dataclass(frozen=True)
class TokenFigures:
    """Per token of many rollouts' completions stacked end to end, at one temperature.

    Rows of a rollout with a token id outside the vocabulary are not computed: margin 0,
    tolerance 1 and NaN elsewhere (its sampling check fails on the id alone)."""

    temperature: float
    """The sampling temperature the figures are at."""
    eos_token_ids: frozenset[int]
    """The EOS set :attr:`eos_probability` is of."""
    lengths: npt.NDArray[np.int64]
    """Completion tokens per rollout."""
    out_of_vocabulary: npt.NDArray[np.bool_]
    """Per rollout: some token id is outside ``[0, V)``."""
    margins: FloatArray
    """Seeded Gumbel score of the chosen token minus the best other score
    (:func:`~rollnet.sdk.proofs.sampling.sampling_margins`)."""
    tolerances: FloatArray
    """The row's sampling tolerance, ``logit_tolerance / T`` (score units)."""
    logprobs: FloatArray
    """``log_softmax(logits / T)`` of the chosen token
    (:func:`~rollnet.sdk.proofs.sampling.token_logprobs`)."""
    others: FloatArray
    """``L = log(sum over the other tokens of e^(s_j - s_c))``: the honest interval's input."""
    entropy: FloatArray
    """``H`` of the row's sampling distribution."""
    variance: FloatArray
    """``Var(log p)`` under it."""
    eos_probability: FloatArray
    """The EOS set's probability in the row (0 when no EOS ids were given)."""

    @property
    def starts(self) -> npt.NDArray[np.int64]:
        """Each rollout's first row, and the total at the end."""
        return np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)

    def rows(self, rollout: int) -> slice:
        """The rows of one rollout."""
        start = int(self.lengths[:rollout].sum())
        return slice(start, start + int(self.lengths[rollout]))

    def logprob_bounds(self, rollout: int) -> LogprobBounds:
        """:func:`~rollnet.sdk.proofs.sampling.token_logprob_bounds` of one rollout."""
        rows = self.rows(rollout)
        with np.errstate(invalid="ignore"):  # NaN figures give NaN bounds, which fail
            lower, upper = logprob_bounds(self.others[rows], self.tolerances[rows])
        return LogprobBounds(self.logprobs[rows].copy(), lower, upper)

    def eos_probability_bounds(self, rollout: int) -> tuple[float, float]:
        """:func:`~rollnet.sdk.proofs.termination.eos_probability_bounds` of the rollout's last
        row (its EOS set's probability and the highest the error model allows)."""
        probability, upper = self._eos_bounds(np.asarray([self.rows(rollout).stop - 1]))
        return float(probability[0]), float(upper[0])

    def final_eos_probability_bounds(self) -> tuple[FloatArray, FloatArray]:
        """:meth:`eos_probability_bounds` of every rollout at once (the same elementwise
        arithmetic over every last row); NaN for a rollout with no rows."""
        filled = self.lengths > 0
        probability = np.full(self.lengths.size, np.nan)
        upper = np.full(self.lengths.size, np.nan)
        probability[filled], upper[filled] = self._eos_bounds((self.starts[1:] - 1)[filled])
        return probability, upper

    def _eos_bounds(self, rows: npt.NDArray[np.int64]) -> tuple[FloatArray, FloatArray]:
        probability = self.eos_probability[rows]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            others = np.log1p(-probability) - np.log(probability)
            _, upper = logprob_bounds(others, self.tolerances[rows])
        return probability, np.exp(np.minimum(upper, 0.0))


def token_figures(
    logits: Sequence[npt.ArrayLike],
    completion_ids: Sequence[Sequence[int]],
    *,
    seeds: Sequence[int],
    temperature: float,
    thresholds: Thresholds,
    eos_token_ids: Collection[int] = frozenset(),
) -> TokenFigures:
    """:class:`TokenFigures` of many rollouts (``[tokens, V]`` completion rows each, one
    vocabulary), one pass over the logits a bounded block of rows at a time."""
    if not len(logits) == len(completion_ids) == len(seeds):
        raise ValueError("one logits array, completion and seed per rollout")
    if not temperature > 0:
        raise ValueError("token figures need a temperature > 0")
    arrays = [np.asarray(z) for z in logits]
    if any(z.ndim != 2 for z in arrays) or len({z.shape[1] for z in arrays}) > 1:
        raise ValueError("logits must be [tokens, vocabulary] with one vocabulary")
    lengths = np.asarray([len(ids) for ids in completion_ids], dtype=np.int64)
    if any(z.shape[0] != n for z, n in zip(arrays, lengths.tolist(), strict=True)):
        raise ValueError("logits rows must equal the completion length")
    for seed in seeds:
        check_seed(seed)
    vocab = arrays[0].shape[1] if arrays else 0
    # The order termination.eos_probabilities sums in (the same set iterates the same way).
    eos = list(eos_token_ids)
    if any(not 0 <= e < vocab for e in eos):
        raise ValueError("EOS token id out of the vocabulary")
    ids = np.fromiter(itertools.chain.from_iterable(completion_ids), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    bad = (ids < 0) | (ids >= vocab)
    counts = np.concatenate([[0], np.cumsum(bad, dtype=np.int64)])
    out_of_vocabulary = (counts[starts[1:]] - counts[starts[:-1]]) > 0
    total = int(ids.size)
    margins = np.zeros(total, dtype=np.float64)
    tolerances = np.ones(total, dtype=np.float64)
    rest = [np.full(total, np.nan) for _ in range(4)]
    eos_probability = np.full(total, np.nan if eos else 0.0)
    rows = np.flatnonzero(np.repeat(~out_of_vocabulary, lengths))
    if rows.size:
        kept = [z for z, skip in zip(arrays, out_of_vocabulary.tolist(), strict=True) if not skip]
        seed_rows = np.repeat(np.asarray(seeds, dtype=np.int64), lengths)[rows]
        positions = (np.arange(total, dtype=np.int64) - np.repeat(starts[:-1], lengths))[rows]
        figures = _one_pass(
            kept, ids[rows], seed_rows, positions, temperature, thresholds, eos, vocab
        )
        margins[rows], tolerances[rows] = figures[0], figures[1]
        for target, values in zip(rest, figures[2:6], strict=True):
            target[rows] = values
        if eos:
            eos_probability[rows] = figures[6]
    logprobs, others, entropy, variance = rest
    return TokenFigures(
        temperature=temperature,
        eos_token_ids=frozenset(eos_token_ids),
        lengths=lengths,
        out_of_vocabulary=out_of_vocabulary,
        margins=margins,
        tolerances=tolerances,
        logprobs=logprobs,
        others=others,
        entropy=entropy,
        variance=variance,
        eos_probability=eos_probability,
    )


def _one_pass(
    arrays: Sequence[npt.NDArray[Any]],
    chosen: npt.NDArray[np.int64],
    seeds: npt.NDArray[np.int64],
    positions: npt.NDArray[np.int64],
    temperature: float,
    thresholds: Thresholds,
    eos: list[int],
    vocab: int,
) -> list[FloatArray]:
    total = int(chosen.size)
    out = [np.empty(total, dtype=np.float64) for _ in range(7)]
    margins, tolerances, logprobs, others, entropy, variance, eos_probability = out
    offsets = np.concatenate([[0], np.cumsum([a.shape[0] for a in arrays])]).astype(np.int64)
    step = max(1, _BLOCK_ELEMENTS // vocab)
    # Overflowing or NaN logits give non-finite figures, which the checks fail: no warnings.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for start in range(0, total, step):
            stop = min(start + step, total)
            block = slice(start, stop)
            rows = np.arange(stop - start)
            ids = chosen[block]
            scaled = _stacked_rows(arrays, offsets, start, stop)
            tolerances[block] = logit_tolerances(scaled, thresholds) / temperature
            scaled /= temperature
            # The sampling margins: scores = s + g = s - (-g), in the noise array.
            work = negated_gumbel_noise(seeds[block], positions[block], vocab)
            np.subtract(scaled, work, out=work)
            chosen_score = work[rows, ids]
            work[rows, ids] = -np.inf
            margins[block] = chosen_score - work.max(axis=1)
            # The softmax: one exp of the max-shifted scaled logits, reused by every figure.
            scaled -= scaled.max(axis=1, keepdims=True)
            chosen_shifted = scaled[rows, ids]
            weights = np.exp(scaled, out=work)
            norm = weights.sum(axis=1)
            log_norm = np.log(norm)
            logprobs[block] = chosen_shifted - log_norm
            if eos:
                eos_probability[block] = np.exp(scaled[:, eos] - log_norm[:, None]).sum(axis=-1)
            chosen_weight = weights[rows, ids]
            weights[rows, ids] = 0.0
            others[block] = np.log(weights.sum(axis=-1)) - chosen_shifted
            weights[rows, ids] = chosen_weight
            first = np.einsum("ij,ij->i", weights, scaled) / norm
            weights *= scaled
            second = np.einsum("ij,ij->i", weights, scaled) / norm
            entropy[block] = log_norm - first
            variance[block] = np.maximum(second - first * first, 0.0)
    return out
