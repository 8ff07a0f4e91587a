"""Seeded Gumbel-max sampling: counter-based noise (numpy) and the validator's sampling check.

The noise for ``(seed, position, token)`` is a pure function of those integers, so a validator
can regenerate exactly what the worker used. The integer hash is defined on 32-bit words
(multiplies mod 2**32, shifts, xor): numpy computes it in uint64, and the torch twin in
:mod:`rollnet.sdk.proofs.sampling_torch` in int64 with 16-bit limb multiplies that cannot
overflow, so both give the same bits on any device (tested). Only the final ``-log(-log u)``
is floating point (float64); libm differences there are ~1e-16, far below the tolerance.

Hash: ``h = mix(mix(mix(mix(seed_lo ^ K) ^ seed_hi) ^ position) ^ token)`` with ``mix`` the
"lowbias32" integer finalizer (xorshift-multiply, constants 0x7FEB352D and 0x846CA68B), then
``u = (h >> 8 + 0.5) / 2**24`` in (0, 1) and ``g = -log(-log u)``.

The worker picks ``argmax(logits / T + g)`` at completion position ``i`` (0-based) with the
rollout's seed; the validator recomputes the scores from its own logits. Top-k / top-p would
compose by setting the scores of excluded tokens to ``-inf`` on both sides before the argmax (the
validator re-derives the same mask from its logits; a margin near the mask boundary needs the
same tolerance treatment as the argmax). Temperature must be > 0.

Tolerances follow the error model of :mod:`rollnet.sdk.proofs.thresholds`: per token, a margin
may be as low as ``-logit_tolerance / T`` (``thresholds.sampling_tolerances``), and a behaviour
log-probability must lie in the interval :func:`token_logprob_bounds` gives.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rollnet.sdk.proofs.report import CheckName, CheckResult, Figure, Reason
from rollnet.sdk.proofs.thresholds import (
    Thresholds,
    logit_tolerances,
    logprob_bounds,
)

if TYPE_CHECKING:
    from rollnet.sdk.proofs.logit_figures import TokenFigures

MASK32 = 0xFFFFFFFF
SEED_KEY = 0x243F6A88  # first digits of pi: separates the seed words from a zero input
MIX_MUL_1 = 0x7FEB352D
MIX_MUL_2 = 0x846CA68B
UNIFORM_BITS = 24
MAX_SEED = (1 << 63) - 1

Int64Array = npt.NDArray[np.int64]
UInt64Array = npt.NDArray[np.uint64]
UInt32Array = npt.NDArray[np.uint32]
FloatArray = npt.NDArray[np.float64]


def _mul32(x: UInt64Array, constant: int) -> UInt64Array:
    """``x * constant mod 2**32``. numpy multiplies uint64 natively and a 32-bit by 32-bit
    product fits, so this equals the 16-bit-limb product the torch twin needs for int64."""
    return (x * np.uint64(constant)) & np.uint64(MASK32)


def _mix(x: UInt64Array) -> UInt64Array:
    x = x ^ (x >> np.uint64(16))
    x = _mul32(x, MIX_MUL_1)
    x = x ^ (x >> np.uint64(15))
    x = _mul32(x, MIX_MUL_2)
    return x ^ (x >> np.uint64(16))


def check_seed(seed: int) -> int:
    """Validate a sampling seed (a non-negative 63-bit integer) and return it."""
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"sampling seed must be in [0, 2**63), got {seed}")
    return seed


def _mix32(x: UInt32Array) -> UInt32Array:
    """``_mix`` on native uint32 words: numpy's uint32 multiply wraps mod 2**32, which is the
    definition, so this gives the same bits with half the memory traffic and no masking."""
    x = x ^ (x >> np.uint32(16))
    x *= np.uint32(MIX_MUL_1)
    x ^= x >> np.uint32(15)
    x *= np.uint32(MIX_MUL_2)
    x ^= x >> np.uint32(16)
    return x


def _row_keys(seeds: npt.ArrayLike, positions: npt.ArrayLike) -> UInt32Array:
    """The hash of each (seed, position) pair, before the token id is mixed in."""
    seed_array = np.asarray(seeds, dtype=np.int64).reshape(-1)
    position_array = np.asarray(positions, dtype=np.int64).reshape(-1)
    if seed_array.shape != position_array.shape:
        raise ValueError("seeds and positions must have the same length")
    if (seed_array < 0).any() or (position_array < 0).any() or (position_array > MASK32).any():
        raise ValueError("seeds must be non-negative and positions in [0, 2**32)")
    seeds_u = seed_array.astype(np.uint64)
    h = _mix((seeds_u & np.uint64(MASK32)) ^ np.uint64(SEED_KEY))
    h = _mix(h ^ (seeds_u >> np.uint64(32)))
    return _mix(h ^ position_array.astype(np.uint64)).astype(np.uint32)


def _noise_bits32(seeds: npt.ArrayLike, positions: npt.ArrayLike, vocab_size: int) -> UInt32Array:
    h = _row_keys(seeds, positions)
    # The [N, V] stage dominates the cost: it runs on uint32 words.
    return _mix32(h[:, None] ^ np.arange(vocab_size, dtype=np.uint32)[None, :])


def noise_bits(seeds: npt.ArrayLike, positions: npt.ArrayLike, vocab_size: int) -> Int64Array:
    """32-bit hashes ``[N, V]`` for N (seed, position) pairs and every token id in [0, V)."""
    return _noise_bits32(seeds, positions, vocab_size).astype(np.int64)


def uniforms_from_bits(bits: Int64Array | UInt32Array) -> npt.NDArray[np.float64]:
    """Map 32-bit hashes to uniforms in (0, 1) with 24-bit resolution, never 0 or 1."""
    if bits.dtype == np.int64:
        shift = 32 - UNIFORM_BITS
        return ((bits >> shift).astype(np.float64) + 0.5) * (2.0**-UNIFORM_BITS)
    words = np.asarray(bits, dtype=np.uint32)
    uniforms = np.empty(words.shape, dtype=np.float64)
    _uniforms_into(words, uniforms, np.empty_like(words))
    return uniforms


def _uniforms_into(bits: UInt32Array, out: FloatArray, scratch: UInt32Array) -> None:
    # (t + 0.5) * 2**-24 == (2t + 1) * 2**-25 exactly (25 significant bits, a power-of-two
    # scale): the odd integer 2t + 1 is built on uint32 words, then converted and scaled in one
    # float64 pass.
    np.right_shift(bits, np.uint32(31 - UNIFORM_BITS), out=scratch)
    scratch |= np.uint32(1)
    np.multiply(scratch, 2.0 ** -(UNIFORM_BITS + 1), out=out)


def gumbel_noise(
    seeds: npt.ArrayLike, positions: npt.ArrayLike, vocab_size: int
) -> npt.NDArray[np.float64]:
    """Standard Gumbel noise ``[N, V]`` (float64) for N (seed, position) pairs."""
    noise = negated_gumbel_noise(seeds, positions, vocab_size)
    return np.negative(noise, out=noise)


def negated_gumbel_noise(
    seeds: npt.ArrayLike, positions: npt.ArrayLike, vocab_size: int
) -> npt.NDArray[np.float64]:
    """``-g``, i.e. ``log(-log u)``: callers that add the noise subtract this instead, which
    gives the same bits (``s - x == s + (-x)`` in IEEE arithmetic) one pass sooner."""
    return negated_noise_of_bits(_noise_bits32(seeds, positions, vocab_size))


def negated_noise_of_bits(
    bits: UInt32Array,
    out: FloatArray | None = None,
    scratch: UInt32Array | None = None,
) -> FloatArray:
    """``log(-log u)`` of the 32-bit hashes ``bits`` (any shape), into ``out`` when given
    (``scratch``: a uint32 array of ``bits``' shape the caller can spare). The one sequence of
    float64 operations every noise value is computed with, so that the noise of a few gathered
    columns equals, bit for bit, the noise of the same columns in a whole row."""
    if out is None:
        out = np.empty(bits.shape, dtype=np.float64)
    _uniforms_into(bits, out, np.empty_like(bits) if scratch is None else scratch)
    np.log(out, out=out)
    np.negative(out, out=out)
    return np.log(out, out=out)


def mix_into(x: UInt32Array, scratch: UInt32Array) -> UInt32Array:
    """``_mix32`` in place on ``x`` (``scratch``: a uint32 array of its shape): the same bits
    with no temporary arrays."""
    np.right_shift(x, np.uint32(16), out=scratch)
    x ^= scratch
    x *= np.uint32(MIX_MUL_1)
    np.right_shift(x, np.uint32(15), out=scratch)
    x ^= scratch
    x *= np.uint32(MIX_MUL_2)
    np.right_shift(x, np.uint32(16), out=scratch)
    x ^= scratch
    return x


def gumbel_noise_at(
    seeds: npt.ArrayLike, positions: npt.ArrayLike, token_ids: npt.ArrayLike
) -> npt.NDArray[np.float64]:
    """The entries ``[N, k]`` of :func:`gumbel_noise` at the token ids ``[N, k]`` only (for a
    few columns of a large vocabulary: no ``[N, V]`` array)."""
    h = _row_keys(seeds, positions)
    columns = np.asarray(token_ids, dtype=np.int64)
    if columns.ndim != 2 or columns.shape[0] != h.size:
        raise ValueError("token_ids must be [N, k] for N (seed, position) pairs")
    if columns.size and (columns.min() < 0 or columns.max() > MASK32):
        raise ValueError("token ids must be in [0, 2**32)")
    u = uniforms_from_bits(_mix32(h[:, None] ^ columns.astype(np.uint32)))
    return -np.log(-np.log(u))


def gumbel_scores(
    logits: npt.ArrayLike, seed: int, temperature: float, start_position: int = 0
) -> npt.NDArray[np.float64]:
    """``logits / temperature + g`` for one sequence's rows ``[T, V]`` from ``start_position``."""
    if not temperature > 0:
        raise ValueError("Gumbel-max sampling needs a temperature > 0")
    array = np.asarray(logits, dtype=np.float64)
    steps = array.shape[0]
    positions = np.arange(start_position, start_position + steps, dtype=np.int64)
    seeds = np.full(steps, check_seed(seed), dtype=np.int64)
    return array / temperature + gumbel_noise(seeds, positions, array.shape[1])


def sampling_margins(
    logits: npt.ArrayLike, completion_ids: Sequence[int], seed: int, temperature: float
) -> npt.NDArray[np.float64]:
    """Per token: Gumbel score of the chosen token minus the best other token's score.

    Non-negative for an exact replay of the worker's sampling; numeric noise makes it slightly
    negative at worst.
    """
    scores = gumbel_scores(logits, seed, temperature)
    rows = np.arange(scores.shape[0])
    chosen = np.asarray(completion_ids, dtype=np.int64)
    chosen_score = scores[rows, chosen]
    scores[rows, chosen] = -np.inf
    return np.asarray(chosen_score - scores.max(axis=1), dtype=np.float64)


def log_softmax(logits: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``log_softmax`` along the last axis (max-shifted), in the input's float dtype."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return np.asarray(shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True)))


def token_logprobs(
    logits: npt.ArrayLike, completion_ids: Sequence[int], temperature: float
) -> npt.NDArray[np.float64]:
    """Per token: ``log_softmax(logits / temperature)`` of the chosen token, in float64.

    What a worker reports as ``Rollout.behaviour_logprobs``, recomputed from the validator's
    logits (rows as for :func:`sampling_margins`), a bounded block of rows at a time.
    """
    if not temperature > 0:
        raise ValueError("log-probabilities need a temperature > 0")
    z = np.asarray(logits)
    ids = np.asarray(completion_ids, dtype=np.int64)
    if z.ndim != 2 or z.shape[0] != ids.size:
        raise ValueError("logits must be [tokens, vocabulary], one row per completion token")
    out = np.empty(ids.size, dtype=np.float64)
    step = max(1, _MARGIN_CHUNK_ELEMENTS // max(1, z.shape[1]))
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, ids.size, step):
            block = log_softmax(z[start : start + step].astype(np.float64) / temperature)
            rows = np.arange(block.shape[0])
            out[start : start + step] = block[rows, ids[start : start + step]]
    return out


@dataclass(frozen=True)
class LogprobBounds:
    """Per token: the validator's log-probability and the honest interval around it."""

    values: npt.NDArray[np.float64]
    """``log_softmax(logits / T)`` of the token (:func:`token_logprobs`'s numbers)."""
    lower: npt.NDArray[np.float64]
    """The lowest log-probability an honest worker can report (error model and slack)."""
    upper: npt.NDArray[np.float64]
    """The highest."""

    def contains(self, claimed: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """Per token: the claimed value lies in the interval (False for NaN anywhere)."""
        value = np.asarray(claimed, dtype=np.float64)
        return np.asarray((value >= self.lower) & (value <= self.upper), dtype=np.bool_)

    def excess(self, claimed: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Per token: how far outside the interval the claimed value is, as a fraction of the
        interval's half-width on that side (``<= 1`` inside: the log-prob analogue of "margin
        as a fraction of the tolerance")."""
        value = np.asarray(claimed, dtype=np.float64)
        below = (self.values - value) / np.maximum(self.values - self.lower, 1e-300)
        above = (value - self.values) / np.maximum(self.upper - self.values, 1e-300)
        return np.asarray(np.maximum(below, above), dtype=np.float64)


def token_logprob_bounds(
    logits: npt.ArrayLike,
    completion_ids: Sequence[int],
    temperature: float,
    thresholds: Thresholds,
) -> LogprobBounds:
    """Per token: the validator's log-probability of the chosen token at ``temperature`` and
    the interval an honest worker's value lies in, from the error model
    (:func:`~rollnet.sdk.proofs.thresholds.logprob_bounds`), a bounded block of rows at a time.
    NaN logits give NaN bounds, which no value lies within."""
    if not temperature > 0:
        raise ValueError("log-probabilities need a temperature > 0")
    z = np.asarray(logits)
    ids = np.asarray(completion_ids, dtype=np.int64)
    if z.ndim != 2 or z.shape[0] != ids.size:
        raise ValueError("logits must be [tokens, vocabulary], one row per completion token")
    values = np.empty(ids.size, dtype=np.float64)
    others = np.empty(ids.size, dtype=np.float64)
    tolerance = np.empty(ids.size, dtype=np.float64)
    step = max(1, _MARGIN_CHUNK_ELEMENTS // max(1, z.shape[1]))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for start in range(0, ids.size, step):
            raw = z[start : start + step]
            chosen_ids = ids[start : start + step]
            tolerance[start : start + step] = logit_tolerances(raw, thresholds) / temperature
            # log_softmax's arithmetic, step by step (the values equal token_logprobs'), with
            # the exponentials reused for L = log(sum over the other tokens of e^(s_j - s_c)).
            block = raw.astype(np.float64) / temperature
            block -= block.max(axis=-1, keepdims=True)
            rows = np.arange(block.shape[0])
            chosen = block[rows, chosen_ids]
            np.exp(block, out=block)
            total = block.sum(axis=-1)
            block[rows, chosen_ids] = 0.0
            values[start : start + step] = chosen - np.log(total)
            others[start : start + step] = np.log(block.sum(axis=-1)) - chosen
        lower, upper = logprob_bounds(others, tolerance)
    return LogprobBounds(values, lower, upper)


def check_sampling(
    logits: npt.ArrayLike,
    completion_ids: Sequence[int],
    *,
    seed: int,
    temperature: float,
    thresholds: Thresholds,
) -> CheckResult:
    """Each token wins the seeded Gumbel-max race under the validator's logits, within tolerance."""
    return check_sampling_batch(
        [logits], [completion_ids], seeds=[seed], temperature=temperature, thresholds=thresholds
    )[0]


_MARGIN_CHUNK_ELEMENTS = 1 << 18
"""Elements of ``[rows, V]`` float64 scores per step (2 MiB): keeps the temporaries in cache and
the memory bounded whatever the vocabulary (about 2,600 rows at V = 101, one or two at 152k)."""


def _stacked_rows(
    arrays: Sequence[npt.NDArray[Any]], offsets: Int64Array, start: int, stop: int
) -> npt.NDArray[np.float64]:
    """Rows ``start:stop`` of the arrays stacked end to end, as float64, copying only those."""
    pieces = []
    index = int(np.searchsorted(offsets, start, side="right")) - 1
    while start < stop:
        local = start - int(offsets[index])
        take = min(stop - start, arrays[index].shape[0] - local)
        pieces.append(arrays[index][local : local + take])
        start += take
        index += 1
    return np.concatenate(pieces, dtype=np.float64)


def _batch_margins(
    arrays: Sequence[npt.NDArray[Any]],
    chosen: Int64Array,
    seeds: Int64Array,
    positions: Int64Array,
    temperature: float,
    thresholds: Thresholds,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """:func:`sampling_margins` for the rows of many sequences stacked end to end (row-wise
    identical), a bounded block of rows at a time: the logits are never copied whole. Also
    each row's sampling tolerance (score units), from the same block."""
    total = int(chosen.size)
    margins = np.empty(total, dtype=np.float64)
    tolerances = np.empty(total, dtype=np.float64)
    offsets = np.concatenate([[0], np.cumsum([a.shape[0] for a in arrays])]).astype(np.int64)
    vocab = arrays[0].shape[1]
    step = max(1, _MARGIN_CHUNK_ELEMENTS // vocab)
    # Overflowing or NaN logits give non-finite margins, which the caller fails: no warnings.
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, total, step):
            stop = min(start + step, total)
            scores = _stacked_rows(arrays, offsets, start, stop)
            tolerances[start:stop] = logit_tolerances(scores, thresholds) / temperature
            scores /= temperature
            scores += gumbel_noise(seeds[start:stop], positions[start:stop], vocab)
            rows = np.arange(stop - start)
            ids = chosen[start:stop]
            chosen_score = scores[rows, ids]
            scores[rows, ids] = -np.inf
            margins[start:stop] = chosen_score - scores.max(axis=1)
    return margins, tolerances


def check_sampling_batch(
    logits: Sequence[npt.ArrayLike],
    completion_ids: Sequence[Sequence[int]],
    *,
    seeds: Sequence[int],
    temperature: float,
    thresholds: Thresholds,
) -> list[CheckResult]:
    """:func:`check_sampling` for many rollouts: the noise and the margins of every token of
    every rollout are computed in one vectorized pass (the same arithmetic per token)."""
    if not len(logits) == len(completion_ids) == len(seeds):
        raise ValueError("one logits array, completion and seed per rollout")
    if not temperature > 0:
        raise ValueError("Gumbel-max sampling needs a temperature > 0")
    arrays = [np.asarray(z) for z in logits]
    if not arrays:
        return []
    if any(z.ndim != 2 for z in arrays) or len({z.shape[1] for z in arrays}) > 1:
        if len(arrays) == 1:
            raise ValueError("logits must be [tokens, vocabulary]")
        return [  # vocabularies of different widths: one rollout at a time
            check_sampling_batch(
                [z], [ids], seeds=[seed], temperature=temperature, thresholds=thresholds
            )[0]
            for z, ids, seed in zip(arrays, completion_ids, seeds, strict=True)
        ]
    lengths = np.asarray([len(ids) for ids in completion_ids], dtype=np.int64)
    if any(z.shape[0] != n for z, n in zip(arrays, lengths.tolist(), strict=True)):
        raise ValueError("logits rows must equal the completion length")
    for seed in seeds:
        check_seed(seed)
    vocab = arrays[0].shape[1]
    ids = np.fromiter(itertools.chain.from_iterable(completion_ids), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])

    def per_rollout(flags: npt.NDArray[np.bool_]) -> Int64Array:
        counts = np.concatenate([[0], np.cumsum(flags, dtype=np.int64)])
        return np.asarray(counts[starts[1:]] - counts[starts[:-1]], dtype=np.int64)

    out_of_vocabulary = per_rollout((ids < 0) | (ids >= vocab)) > 0
    checked = np.repeat(~out_of_vocabulary, lengths)
    rows = np.flatnonzero(checked)
    margins = np.zeros(ids.size, dtype=np.float64)
    tolerances = np.ones(ids.size, dtype=np.float64)
    if rows.size:
        kept = [z for z, skip in zip(arrays, out_of_vocabulary.tolist(), strict=True) if not skip]
        seed_rows = np.repeat(np.asarray(seeds, dtype=np.int64), lengths)[rows]
        positions = (np.arange(ids.size, dtype=np.int64) - np.repeat(starts[:-1], lengths))[rows]
        margins[rows], tolerances[rows] = _batch_margins(
            kept, ids[rows], seed_rows, positions, temperature, thresholds
        )
    return _sampling_results(lengths, out_of_vocabulary, margins, tolerances)


def sampling_results(figures: TokenFigures) -> list[CheckResult]:
    """:func:`check_sampling_batch`'s results from the margins and tolerances of
    :func:`rollnet.sdk.proofs.logit_figures.token_figures` (the same figures, computed in the
    one pass over the logits that also feeds the other checks)."""
    return _sampling_results(
        figures.lengths, figures.out_of_vocabulary, figures.margins, figures.tolerances
    )


def _sampling_results(
    lengths: Int64Array,
    out_of_vocabulary: npt.NDArray[np.bool_],
    margins: npt.NDArray[np.float64],
    tolerances: npt.NDArray[np.float64],
) -> list[CheckResult]:
    starts = np.concatenate([[0], np.cumsum(lengths)])

    def per_rollout(flags: npt.NDArray[np.bool_]) -> Int64Array:
        counts = np.concatenate([[0], np.cumsum(flags, dtype=np.int64)])
        return np.asarray(counts[starts[1:]] - counts[starts[:-1]], dtype=np.int64)

    # Written so that NaN fails: a margin that is not a finite number >= -tolerance (logits that
    # overflowed or hold NaN, or a NaN tolerance) proves nothing and must not pass.
    violating = ~(np.isfinite(margins) & (margins >= -tolerances))
    with np.errstate(invalid="ignore", divide="ignore"):
        fractions = margins / tolerances
    violations = per_rollout(violating)
    finite = per_rollout(np.isfinite(margins))
    first_violations = np.flatnonzero(violating)
    # Each rollout's minima and final figures as reductions over its rows (min is exact in any
    # order, so these equal a per-rollout .min()); rollouts with no rows take none.
    filled = np.flatnonzero(lengths > 0)
    lowest = [0.0] * lengths.size
    lowest_fraction = [0.0] * lengths.size
    final = [0.0] * lengths.size
    final_tolerance = [0.0] * lengths.size
    if filled.size:
        firsts, lasts = starts[filled], starts[filled + 1] - 1
        for target, values in (
            (lowest, np.minimum.reduceat(margins, firsts)),
            (lowest_fraction, np.minimum.reduceat(fractions, firsts)),
            (final, margins[lasts]),
            (final_tolerance, tolerances[lasts]),
        ):
            for number, value in zip(filled.tolist(), values.tolist(), strict=True):
                target[number] = value
    results: list[CheckResult] = []
    for number, length in enumerate(lengths.tolist()):
        if out_of_vocabulary[number]:
            results.append(
                CheckResult(
                    CheckName.SAMPLING,
                    False,
                    Reason.TOKEN_OUT_OF_VOCABULARY,
                    {},
                    "token id out of range",
                )
            )
            continue
        start = int(starts[number])
        count = int(violations[number])
        first = None
        if count:
            first = int(first_violations[np.searchsorted(first_violations, start)]) - start
        figures: dict[str, Figure] = {
            "min_margin": lowest[number],
            "final_margin": final[number],
            "final_tolerance": final_tolerance[number],
            "min_margin_fraction": lowest_fraction[number],
            "violations": count,
            "tokens": length,
        }
        non_finite = length - int(finite[number])
        results.append(_judge(figures, non_finite, count, first))
    return results


def _judge(
    figures: dict[str, Figure], non_finite: int, violations: int, first: int | None
) -> CheckResult:
    if non_finite:
        figures["non_finite_margins"] = non_finite
    if first is not None:
        figures["first_violation"] = first
        return CheckResult(
            CheckName.SAMPLING,
            False,
            Reason.TOKEN_NOT_SAMPLED,
            figures,
            f"{violations} token(s) did not win the seeded Gumbel-max draw",
        )
    return CheckResult(CheckName.SAMPLING, True, None, figures)
