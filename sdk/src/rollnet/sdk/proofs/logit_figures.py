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

import contextlib
import itertools
import sys
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rollnet.sdk.proofs.sampling import (
    MASK32,
    LogprobBounds,
    _mix32,
    _row_keys,
    check_seed,
    mix_into,
    negated_noise_of_bits,
)
from rollnet.sdk.proofs.thresholds import Thresholds, logit_tolerances_of_extremes, logprob_bounds

FloatArray = npt.NDArray[np.float64]


_BLOCK_ELEMENTS = 1 << 18
"""Logits per block of the pass (2 MiB of float64 per buffer; the buffers are allocated once
per pass). 2**16 was faster when each block allocated ~10 fresh temporaries (L2); with the
buffers reused and the noise bounds' per-block numpy calls, 2**18 is: at V = 32,000 (128
rows, best of 5 taking turns, CPU, load average 7-8) 4.84 against 5.73 ns per entry on flat
logits and 3.47 against 4.15 on peaked ones; the same at V = 101. At V = 151,936 a block
is one row either way. The figures are per row, so any block size gives the same bits."""


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
    step = min(max(1, _BLOCK_ELEMENTS // vocab), total)
    buffers = _Buffers(step, vocab)
    keys = _row_keys(seeds, positions)  # the hash of (seed, position), once per row
    unbounded_blocks = 0
    # Overflowing or NaN logits give non-finite figures, which the checks fail: no warnings.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for start in range(0, total, step):
            stop = min(start + step, total)
            block = slice(start, stop)
            rows = np.arange(stop - start)
            ids = chosen[block]
            scaled = _copy_rows(arrays, offsets, start, stop, buffers.scaled[: stop - start])
            # The best other column of each row (the first NaN if any) and the row's extremes:
            # the tolerance's max |z|, the softmax's shift and the noise bound's anchor.
            chosen_logit = scaled[rows, ids]
            scaled[rows, ids] = -np.inf
            rival = scaled.argmax(axis=1)
            scaled[rows, ids] = chosen_logit
            highest = np.maximum(scaled[rows, rival], chosen_logit)
            lowest = scaled.min(axis=1)
            tolerances[block] = (
                logit_tolerances_of_extremes(highest, lowest, thresholds) / temperature
            )
            if temperature != 1.0:  # x / 1.0 == x: no pass
                scaled /= temperature
            no_nan = not np.isnan(lowest).any()
            if unbounded_blocks:  # the bounds failed just before: rows alike, skip them
                unbounded_blocks -= 1
                margins[block] = _whole_row_margins(scaled, ids, keys[block], buffers, hashed=False)
            else:
                margins[block], bounded = _margins(scaled, ids, rival, no_nan, keys[block], buffers)
                unbounded_blocks = 0 if bounded else _RETRY_BOUNDS_AFTER
            # The softmax: one exp of the max-shifted scaled logits, reused by every figure.
            # Division by T > 0 rounds monotonically, so the row's max of ``scaled`` is still at
            # the rival or the chosen column: the shift equals scaled.max(axis=1).
            scaled -= np.maximum(scaled[rows, rival], scaled[rows, ids])[:, None]
            chosen_shifted = scaled[rows, ids]
            weights = np.exp(scaled, out=buffers.work[: stop - start])
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


class _Buffers:
    """The pass's block-sized arrays, allocated once: fresh ones per block cost page faults
    (measured: 2x the pass's CPU time at V = 151,936, where a block is one 1.2 MB row)."""

    def __init__(self, rows: int, vocab: int) -> None:
        self.scaled = np.empty((rows, vocab), dtype=np.float64)
        self.work = np.empty((rows, vocab), dtype=np.float64)
        self.bits = np.empty((rows, vocab), dtype=np.uint32)
        self.scratch = np.empty((rows, vocab), dtype=np.uint32)
        self.above = np.empty((rows, vocab), dtype=np.bool_)
        self.columns = np.arange(vocab, dtype=np.uint32)
        self.sample = np.arange(0, vocab, _SAMPLE_STRIDE, dtype=np.int64)


def _copy_rows(
    arrays: Sequence[npt.NDArray[Any]],
    offsets: npt.NDArray[np.int64],
    start: int,
    stop: int,
    out: FloatArray,
) -> FloatArray:
    """Rows ``start:stop`` of the arrays stacked end to end, into ``out`` as float64
    (``_stacked_rows`` without allocating)."""
    index = int(np.searchsorted(offsets, start, side="right")) - 1
    filled = 0
    while start < stop:
        local = start - int(offsets[index])
        take = min(stop - start, arrays[index].shape[0] - local)
        np.copyto(out[filled : filled + take], arrays[index][local : local + take])
        filled += take
        start += take
        index += 1
    return out


_NOISE_CEILING = float(-negated_noise_of_bits(np.asarray([MASK32], dtype=np.uint32))[0])
"""The largest Gumbel noise a 24-bit uniform gives, ``-log(-log(1 - 2**-25))`` ≈ 17.33, computed
with the noise's own operations."""

_LEVEL_BITS = 12
_NOISE_LEVELS = -negated_noise_of_bits(
    np.arange(1 << _LEVEL_BITS, dtype=np.uint32) << np.uint32(32 - _LEVEL_BITS)
)
"""The noise at every 4,096th uniform (``t = k * 2**12`` of the 2**24), increasing: the noise
is monotone in the hash's top 24 bits (tested over all 2**24), so a hash whose top 24 bits are
at most ``k * 2**12`` gives noise at most ``_NOISE_LEVELS[k]``."""

_SAMPLE_STRIDE = 61
"""Every 61st column's exact score gives the lower bound on the best other score, and its
logits estimate how many columns a bound leaves."""

_MIN_SAMPLE = 32
"""Below 32 sampled columns (V < 1,953) the bounds' fixed costs per block outweigh them."""


@contextlib.contextmanager
def without_noise_bounds() -> Iterator[None]:
    """Within it, the logits pass takes every column's seeded noise, as before the bounds: the
    same figures at the old cost, for benchmarks that print the two side by side."""
    global _MIN_SAMPLE
    saved = _MIN_SAMPLE
    _MIN_SAMPLE = sys.maxsize
    try:
        yield
    finally:
        _MIN_SAMPLE = saved


_RETRY_BOUNDS_AFTER = 7
"""Blocks that take every column's noise without trying the bounds after a block where they
failed (neighbouring rows of a rollout have alike logits; trying costs ~10 % of a block)."""

_SKIP_FRACTION = 0.125
"""A bound that leaves more than this share of the columns: every column's noise is cheaper
than gathering them."""


def _margins(
    scaled: FloatArray,
    ids: npt.NDArray[np.int64],
    rival: npt.NDArray[np.int64],
    no_nan: bool,
    keys: npt.NDArray[np.uint32],
    buffers: _Buffers,
) -> tuple[FloatArray, bool]:
    """Per row of ``scaled`` (``logits / T``): the chosen column's seeded Gumbel score minus the
    best other score, exactly :func:`~rollnet.sdk.proofs.sampling.sampling_margins`' numbers.

    ``best``, the exact score of the rival (the largest other logit) and of every 61st column,
    is a lower bound on the best other score; a column whose score cannot exceed ``best``
    cannot change it, so only the others get their noise (the same operations on the same bits,
    so the same values), and the maximum over them and ``best`` is the best other score:

    * the noise is at most :data:`_NOISE_CEILING` (≈ 17.33): a column with ``s_j + 17.33``
      below ``best`` needs no hash (trained models' logits, tens of units apart);
    * else every column is hashed, and a column whose hash is at most the level with noise
      ``<= best - s_rival`` needs no logarithms (near-flat logits, e.g. random weights: the
      bar is a few units of noise, which ~2 % of the hashes pass).

    Small vocabularies, blocks holding NaN (``no_nan`` false) or an infinite score, and blocks
    where neither bound leaves fewer than :data:`_SKIP_FRACTION` of the columns take every
    column's noise. Also whether a bound was used."""
    count = ids.size
    rows = np.arange(count)
    if buffers.sample.size < _MIN_SAMPLE or not no_nan or bool((rival == ids).any()):
        return _whole_row_margins(scaled, ids, keys, buffers, hashed=False), False
    # One noise evaluation for the sampled columns, the rival and the chosen column.
    sample = buffers.sample
    picked = np.empty((count, sample.size + 2), dtype=np.int64)
    picked[:, :-2] = sample
    picked[:, -2] = rival
    picked[:, -1] = ids
    values = scaled[rows[:, None], picked]
    scores = values - _noise_at(keys[:, None], picked)
    chosen_score = scores[:, -1].copy()
    scores[picked == ids[:, None]] = -np.inf  # the chosen column is not a rival
    best = scores[:, :-1].max(axis=1)
    sampled = values[:, :-2]
    if not bool(np.isfinite(best).all()):
        return _whole_row_margins(scaled, ids, keys, buffers, hashed=False), False
    # s_j < line means s_j + g_j < best - slack / 2 in exact arithmetic (the slack, ~1e-9
    # relative, covers the rounding of ``line``), so the rounded score is below ``best``.
    line = best - _NOISE_CEILING
    line -= 1e-9 * (1.0 + np.abs(line))
    if np.count_nonzero(sampled >= line[:, None]) <= _SKIP_FRACTION * sampled.size:
        above = np.greater_equal(scaled, line[:, None], out=buffers.above[:count])
    else:
        # s_j <= s_rival, so a column can only beat ``best`` with noise above ``bar``.
        bar = best - scaled[rows, rival]
        bar -= 1e-9 * (1.0 + np.abs(bar))
        level = np.searchsorted(_NOISE_LEVELS, bar, side="right") - 1
        hashed = _hash_rows(keys, buffers)
        if np.mean(1.0 - level / _NOISE_LEVELS.size) > _SKIP_FRACTION:
            return _whole_row_margins(scaled, ids, keys, buffers, hashed=True), False
        # Candidates: top 24 bits above level * 2**12 (level -1, a bar below every noise
        # value, which only the slack can give: every column).
        lowest_kept = np.maximum(((level.astype(np.int64) << _LEVEL_BITS) + 1) << 8, 0)
        above = np.greater_equal(
            hashed, lowest_kept.astype(np.uint32)[:, None], out=buffers.above[:count]
        )
    above[rows, ids] = False
    # flatnonzero: ~10x faster than a 2-D nonzero, in row-major order.
    where = np.flatnonzero(above)
    where_rows = where // above.shape[1]
    where_columns = where - where_rows * above.shape[1]
    scores = scaled[where_rows, where_columns] - _noise_at(keys[where_rows], where_columns)
    others = best
    filled = np.flatnonzero(np.bincount(where_rows, minlength=count))
    if filled.size:
        firsts = np.searchsorted(where_rows, filled)
        others[filled] = np.maximum(others[filled], np.maximum.reduceat(scores, firsts))
    return np.asarray(chosen_score - others, dtype=np.float64), True


def _noise_at(keys: npt.NDArray[np.uint32], columns: npt.NDArray[np.int64]) -> FloatArray:
    """``log(-log u)`` of the given (row key, column) pairs (broadcast together)."""
    return negated_noise_of_bits(_mix32(keys ^ columns.astype(np.uint32)))


def _hash_rows(keys: npt.NDArray[np.uint32], buffers: _Buffers) -> npt.NDArray[np.uint32]:
    """The 32-bit hashes of every column of the rows' keys, in the bits buffer."""
    count = keys.size
    bits = np.bitwise_xor(keys[:, None], buffers.columns[None, :], out=buffers.bits[:count])
    return mix_into(bits, buffers.scratch[:count])


def _whole_row_margins(
    scaled: FloatArray,
    ids: npt.NDArray[np.int64],
    keys: npt.NDArray[np.uint32],
    buffers: _Buffers,
    *,
    hashed: bool,
) -> FloatArray:
    count = ids.size
    rows = np.arange(count)
    bits = buffers.bits[:count] if hashed else _hash_rows(keys, buffers)
    work = negated_noise_of_bits(bits, buffers.work[:count], buffers.scratch[:count])
    # scores = s + g = s - (-g), in the noise array.
    np.subtract(scaled, work, out=work)
    chosen_score = work[rows, ids]
    work[rows, ids] = -np.inf
    return np.asarray(chosen_score - work.max(axis=1), dtype=np.float64)
