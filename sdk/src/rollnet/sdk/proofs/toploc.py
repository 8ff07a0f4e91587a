"""TOPLOC commitments: build and verify the 258-byte-per-window proofs of the last hidden state.

Format (byte-compatible with the TOPLOC library): for each window of ``WINDOW`` (32) consecutive
completion tokens, flatten the window's bf16 hidden states ``[n, d]`` to ``n*d`` values, take the
``TOPK`` (128) entries of largest magnitude, fold their flat indices with the largest modulus
``m <= 65497`` that keeps them distinct, interpolate the polynomial of degree < 128 over GF(65497)
through ``(index mod m, bf16 bit pattern)`` and write ``m`` then the 128 coefficients (ascending),
each as a big-endian ``uint16``. A rollout's proof is the concatenation of its windows.

Two details the library leaves open are fixed here so that prover and verifier agree exactly:
top-k ties (equal bf16 magnitudes) go to the lower flat index, and a window with fewer than 128
values (``n*d < 128``) commits all of them, with the unused high coefficients zero.

Row ``i`` of the hidden states is the final-norm output at the position that *predicted*
completion token ``i`` (the last prompt position for ``i == 0``): exactly the rows a KV-cache decode
produces, and the rows whose logits the sampling check needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rollnet.sdk.proofs import _field
from rollnet.sdk.proofs.report import CheckName, CheckResult, Figure, Reason
from rollnet.sdk.proofs.thresholds import Thresholds

TOPK = 128
"""Number of committed hidden-state entries per window."""
WINDOW = 32
"""Completion tokens per window."""
PRIME = _field.PRIME
"""The field modulus, also the first modulus tried."""
PROOF_BYTES = 2 + 2 * TOPK
"""Serialized size of one window: 2-byte modulus plus 128 2-byte coefficients."""

_MODULUS_BLOCK = 64
_MIN_MODULUS = 1 << 15  # below this the folded indices would lose too much (TOPLOC's Python floor)

UInt16Array = npt.NDArray[np.uint16]


class ProofFormatError(ValueError):
    """The proof bytes are not a whole number of well-formed 258-byte windows."""


@dataclass(frozen=True)
class WindowStats:
    """How one committed window compares with the validator's hidden states.

    ``exp_mismatches`` counts the validator's top-k positions whose committed bf16 exponent
    differs (which also counts top-k *set* disagreement: a position the prover did not commit
    evaluates to a pseudo-random pattern). Mantissa error and sign mismatches are taken over the
    positions whose exponents match; the mean and median are ``inf`` when none match.

    ``unexplained_mismatches`` (an addition to TOPLOC, only when the validator has fp32 values)
    counts positions where the committed pattern differs from the validator's although the
    validator's fp32 value lies at least ``boundary_distance`` from a bf16 rounding boundary,
    measured in bf16 ULPs of the window's largest entry: honest noise can flip the rounding of
    a value sitting on a boundary, but not of one far from it. ``None`` when the validator's
    values are bf16 already.
    """

    window: int
    compared: int
    exp_mismatches: int
    mant_err_mean: float
    mant_err_median: float
    sign_mismatches: int
    unexplained_mismatches: int | None = None


def bf16_bits(values: npt.ArrayLike) -> UInt16Array:
    """Round to bfloat16 (nearest, ties to even, as torch does) and return the bit patterns."""
    as_f32 = np.ascontiguousarray(values, dtype=np.float32)
    bits = as_f32.view(np.uint32)
    # uint32 cannot overflow here except for NaN patterns (>= 0xFFFF8001), replaced below.
    rounded = ((bits + ((bits >> 16) & 1) + np.uint32(0x7FFF)) >> 16).astype(np.uint16)
    nan = np.isnan(as_f32)
    if nan.any():
        rounded[nan] = (((bits[nan] >> 16) & 0x8000) | 0x7FC0).astype(np.uint16)
    return rounded


def as_bf16_bits(hidden: npt.ArrayLike) -> UInt16Array:
    """Accept either bf16 bit patterns (uint16/int16) or floats, and return bit patterns."""
    array = np.asarray(hidden)
    if array.dtype in (np.uint16, np.int16):
        return array.view(np.uint16)
    return bf16_bits(array)


def top_k_indices(bits: UInt16Array, k: int) -> npt.NDArray[np.int64]:
    """Flat indices of the ``k`` largest-magnitude bf16 values per row of ``bits`` [B, n].

    Ties in magnitude go to the lower index, so both sides pick the same set. The result is
    unordered within a row (in index order from the compiled kernel, unordered from numpy).
    """
    n = bits.shape[-1]
    kernel = _field.KERNEL
    if kernel is not None and bits.ndim == 2 and bits.shape[0] and 0 < k < n:
        chosen = kernel.top_k(bits, k)  # the same set, by histograms (in index order)
        if chosen is not None:
            return chosen
    # Unique keys, larger = preferred: magnitude first, then the lower index. int32 when the
    # key fits (magnitudes < 2**15), which makes the partition markedly faster.
    key: npt.NDArray[np.int32] | npt.NDArray[np.int64]
    if n <= 1 << 16:
        key = (bits.astype(np.int32) & 0x7FFF) * np.int32(n) + (
            n - 1 - np.arange(n, dtype=np.int32)
        )
    else:
        key = (bits.astype(np.int64) & 0x7FFF) * n + (n - 1 - np.arange(n, dtype=np.int64))
    if k >= n:
        return np.broadcast_to(np.arange(n, dtype=np.int64), bits.shape).copy()
    part = np.argpartition(-key, k - 1, axis=-1)[..., :k]
    return part.astype(np.int64)


def injective_moduli(indices: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Per row of distinct ``indices`` [B, k]: the largest ``m <= 65497`` with distinct residues."""
    batch = indices.shape[0]
    result = np.zeros(batch, dtype=np.int64)
    # Indices already below p are distinct residues mod p: the common case for d <= 2046.
    easy = indices.max(axis=1, initial=0) < PRIME
    result[easy] = PRIME
    for row in np.flatnonzero(~easy):
        top = PRIME
        while top > _MIN_MODULUS and result[row] == 0:
            moduli = np.arange(top, max(top - _MODULUS_BLOCK, _MIN_MODULUS), -1, dtype=np.int64)
            residues = np.sort(indices[row][None, :] % moduli[:, None], axis=1)
            distinct = np.all(np.diff(residues, axis=1) != 0, axis=1)
            if distinct.any():
                result[row] = moduli[int(np.argmax(distinct))]
            top -= _MODULUS_BLOCK
        if result[row] == 0:
            raise ValueError("no injective modulus in [2**15, 65497] for this window")
    return result


def encode_windows(
    window_bits: UInt16Array, k: int = TOPK, lengths: Sequence[int] | None = None
) -> list[bytes]:
    """Commit a batch of windows given as rows ``[B, N]`` of flattened bf16 patterns.

    ``lengths`` (optional) gives each row's number of real values; the rest of the row is
    ignored. Rows holding at least ``k`` values are batched together whatever their length:
    zero padding never enters the top-k (ties go to the lower index, and padding comes last), so
    the proof equals that of the unpadded window. Returns one ``2 + 2*k``-byte proof per row.
    """
    bits = np.asarray(window_bits, dtype=np.uint16)
    if bits.ndim != 2:
        raise ValueError("window_bits must be [windows, flat values]")
    batch, width = bits.shape
    if lengths is None:
        return _encode_uniform(bits, k)
    sizes = np.asarray(lengths, dtype=np.int64)
    if sizes.shape != (batch,) or (sizes > width).any() or (sizes < 1).any():
        raise ValueError("lengths must give 1..N real values for every row")
    out: list[bytes] = [b""] * batch
    groups: dict[int, list[int]] = {}
    for row, size in enumerate(sizes.tolist()):
        groups.setdefault(width if size >= k else size, []).append(row)
    for size, rows in groups.items():
        padded = bits[rows, :size].copy()
        if size == width:
            # Zero the padding beyond each row's real length (it may hold stale values).
            padded[np.arange(width)[None, :] >= sizes[rows][:, None]] = 0
        for row, proof in zip(rows, _encode_uniform(padded, k), strict=True):
            out[row] = proof
    return out


_ENCODE_CHUNK = 32
"""Windows per interpolation call: 16-32 keep the field arithmetic's temporaries in cache
(64 at once cost ~1.8x more per window on the development machine)."""


def _encode_uniform(bits: UInt16Array, k: int) -> list[bytes]:
    kernel = _field.KERNEL
    if kernel is not None and bits.shape[0]:
        # Compiled: top-k, interpolation and serialization of every window in one call.
        raw = kernel.encode(bits, k)
        if raw is not None:
            size = 2 * (k + 1)
            return [raw[i * size : (i + 1) * size] for i in range(bits.shape[0])]
    if bits.shape[0] > _ENCODE_CHUNK:
        return [
            proof
            for start in range(0, bits.shape[0], _ENCODE_CHUNK)
            for proof in _encode_uniform(bits[start : start + _ENCODE_CHUNK], k)
        ]
    batch, n = bits.shape
    if batch == 0:
        return []
    used = min(k, n)
    idx = top_k_indices(bits, used)
    moduli = injective_moduli(idx)
    x = idx % moduli[:, None]
    y = np.take_along_axis(bits, idx, axis=1).astype(np.int64)
    coefficients = np.zeros((batch, k), dtype=np.int64)
    coefficients[:, :used] = _field.interpolate(x, y)
    out = np.empty((batch, k + 1), dtype=">u2")
    out[:, 0] = moduli
    out[:, 1:] = coefficients
    raw = out.tobytes()
    size = 2 * (k + 1)
    return [raw[i * size : (i + 1) * size] for i in range(batch)]


def window_bounds(length: int, window: int = WINDOW) -> list[tuple[int, int]]:
    """``(start, stop)`` rows of each window of a ``length``-token completion."""
    return [(start, min(start + window, length)) for start in range(0, length, window)]


def build_proof(hidden: npt.ArrayLike, window: int = WINDOW, k: int = TOPK) -> bytes:
    """The whole proof for one completion's hidden states ``[T, d]`` (floats or bf16 patterns)."""
    bits = as_bf16_bits(hidden)
    if bits.ndim != 2:
        raise ValueError("hidden must be [tokens, hidden size]")
    parts: list[bytes] = []
    bounds = window_bounds(bits.shape[0], window)
    full = [b for b in bounds if b[1] - b[0] == window]
    if full:
        stacked = bits[: len(full) * window].reshape(len(full), -1)
        parts.extend(encode_windows(stacked, k))
    for start, stop in bounds[len(full) :]:
        parts.extend(encode_windows(bits[start:stop].reshape(1, -1), k))
    return b"".join(parts)


def parse_proof(proof: bytes, k: int = TOPK) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Split proof bytes into moduli ``[W]`` and coefficients ``[W, k]``."""
    size = 2 * (k + 1)
    if len(proof) % size:
        raise ProofFormatError(f"proof length {len(proof)} is not a multiple of {size}")
    words = np.frombuffer(proof, dtype=">u2").astype(np.int64).reshape(-1, k + 1)
    return words[:, 0].copy(), words[:, 1:].copy()


def _compare_windows(
    committed: npt.NDArray[np.int64],
    observed: npt.NDArray[np.int64],
    near: npt.NDArray[np.float64] | None,
    boundary_distance: float,
) -> dict[str, npt.NDArray[np.int64] | npt.NDArray[np.float64]]:
    """Per-window statistics of rows of committed vs. observed bf16 patterns ``[W, q]``.

    Equal to numpy's ``mean``/``median`` of each row's exponent-matching mantissa errors (the
    values are small integers, so sums and the two-middle-value average are exact in float64).
    """
    width = committed.shape[1]
    match = ((committed >> 7) & 0xFF) == ((observed >> 7) & 0xFF)
    matched = match.sum(axis=1)
    mant_err = np.abs((committed & 0x7F) - (observed & 0x7F))
    sign = ((((committed ^ observed) >> 15) & 1).astype(bool) & match).sum(axis=1)
    total = np.where(match, mant_err, 0).sum(axis=1)
    some = matched > 0
    safe = np.maximum(matched, 1)
    mean = np.where(some, total / safe, np.inf)
    # Unmatched positions sort last (errors are < 128), so each row's matched errors come first.
    ordered = np.sort(np.where(match, mant_err, 1 << 8), axis=1)
    low = np.take_along_axis(ordered, ((safe - 1) // 2)[:, None], axis=1)[:, 0]
    high = np.take_along_axis(ordered, np.minimum(safe // 2, width - 1)[:, None], axis=1)[:, 0]
    median = np.where(some, (low + high) / 2, np.inf)
    stats: dict[str, npt.NDArray[np.int64] | npt.NDArray[np.float64]] = {
        "exp_mismatches": width - matched,
        "mant_err_mean": mean,
        "mant_err_median": median,
        "sign_mismatches": sign,
    }
    if near is not None:
        differs = (committed & 0xFFFF) != (observed & 0xFFFF)
        stats["unexplained"] = (differs & match & (near >= boundary_distance)).sum(axis=1)
    return stats


def _slack_values(values: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """Each fp32 value's distance from its nearest bf16 rounding boundary, in bf16 ULPs of the
    value (0-0.5) scaled by ``2**(exponent - 127)``, so that callers can re-express it in ULPs
    of a window's largest value. The low 16 bits of an fp32 value are what bf16 rounding drops;
    the boundary is at 0x8000."""
    bits = values.view(np.uint32)
    own_ulps = np.abs((bits & 0xFFFF).astype(np.float64) - 0x8000) / 0x10000
    exponent = ((bits >> 23) & 0xFF).astype(np.int64) - 127
    return np.asarray(np.ldexp(own_ulps, exponent), dtype=np.float64)


def _has_fp32_precision(hidden: npt.NDArray[np.generic]) -> bool:
    """Whether float hidden states hold more precision than bf16 (bf16 values widened to fp32
    have none to judge rounding by; bf16 bit patterns are not floats at all)."""
    if hidden.dtype.kind != "f":
        return False
    return bool((np.ascontiguousarray(hidden, dtype=np.float32).view(np.uint32) & 0xFFFF).any())


@dataclass
class _Prepared:
    """Every rollout's hidden states stacked, with one zero row at the end (the padding of
    short windows): bf16 patterns, fp32 values, where each rollout starts."""

    bits: UInt16Array  # [rows + 1, d]
    values: npt.NDArray[np.float32] | None  # [rows + 1, d]; None when no rollout has fp32 precision
    has_slack: list[bool]
    offsets: list[int]


def _prepare(hidden_states: Sequence[npt.ArrayLike]) -> _Prepared:
    arrays = [np.asarray(h) for h in hidden_states]
    offsets = np.cumsum([0] + [a.shape[0] for a in arrays]).tolist()
    widths = {a.shape[1] for a in arrays if a.ndim == 2}
    floats = all(a.ndim == 2 and a.dtype.kind == "f" for a in arrays)
    if floats and len(widths) == 1:
        # One pass over all rollouts: the per-value work is elementwise, and "holds fp32
        # precision" is decided per rollout, exactly as for a single one.
        (width,) = widths
        values = np.concatenate(
            [np.asarray(a, dtype=np.float32) for a in arrays]
            + [np.zeros((1, width), dtype=np.float32)]
        )
        low = (values.view(np.uint32) & 0xFFFF).any(axis=1)
        counts = np.concatenate([[0], np.cumsum(low, dtype=np.int64)])
        has = ((counts[offsets[1:]] - counts[offsets[:-1]]) > 0).tolist()
        return _Prepared(bf16_bits(values), values if any(has) else None, has, offsets)
    bits = [as_bf16_bits(a) for a in arrays]
    if any(b.ndim != 2 for b in bits) or len({b.shape[1] for b in bits}) > 1:
        raise ValueError("hidden states must be [tokens, hidden size], one width for all")
    has = [_has_fp32_precision(a) for a in arrays]
    width = bits[0].shape[1] if bits else 0
    stacked = np.concatenate([*bits, np.zeros((1, width), dtype=np.uint16)])
    stacked_values = None
    if any(has):
        stacked_values = np.concatenate(
            [
                np.asarray(a, dtype=np.float32) if fp32 else np.zeros(b.shape, dtype=np.float32)
                for a, b, fp32 in zip(arrays, bits, has, strict=True)
            ]
            + [np.zeros((1, width), dtype=np.float32)]
        )
    return _Prepared(stacked, stacked_values, has, offsets)


_EVALUATE_CHUNK = 32  # windows per field evaluation: keeps the temporaries in cache


@dataclass
class _Windows:
    """The statistics of every window of every well-formed proof, as arrays in (rollout,
    window) order: what :class:`WindowStats` holds, one entry per window."""

    errors: dict[int, ProofFormatError]
    """The rollouts whose proof is malformed, by position."""
    counts: npt.NDArray[np.int64]
    """Windows per rollout (0 for a malformed proof)."""
    compared: npt.NDArray[np.int64]
    exp_mismatches: npt.NDArray[np.int64]
    mant_err_mean: npt.NDArray[np.float64]
    mant_err_median: npt.NDArray[np.float64]
    sign_mismatches: npt.NDArray[np.int64]
    unexplained: npt.NDArray[np.int64] | None
    """``None`` when no rollout has fp32 values; meaningful only where :attr:`has_slack`."""
    has_slack: list[bool]


def _verify_windows(
    proofs: Sequence[bytes],
    hidden_states: Sequence[npt.ArrayLike],
    window: int,
    k: int,
    boundary_distance: float,
) -> _Windows:
    """Every window of every rollout checked together, in a few vectorized calls."""
    if len(proofs) != len(hidden_states):
        raise ValueError("one proof per rollout's hidden states")
    prepared = _prepare(hidden_states)
    offsets = prepared.offsets
    size = 2 * (k + 1)
    errors: dict[int, ProofFormatError] = {}
    counts = np.zeros(len(proofs), dtype=np.int64)
    well_formed: list[bytes] = []
    for slot, proof in enumerate(proofs):
        tokens = offsets[slot + 1] - offsets[slot]
        windows = -(-tokens // window)
        # The length first: a proof of the wrong size is refused before it is parsed (a
        # hostile one may be as large as the blob).
        if len(proof) != windows * size:
            errors[slot] = ProofFormatError(
                f"proof has {len(proof)} bytes, a completion of {tokens} tokens "
                f"needs {windows} windows of {size}"
            )
            continue
        counts[slot] = windows
        well_formed.append(proof)
    words = np.frombuffer(b"".join(well_formed), dtype=">u2").astype(np.int64).reshape(-1, k + 1)
    all_moduli, all_coefficients = words[:, 0], words[:, 1:]
    slots = np.repeat(np.arange(len(proofs), dtype=np.int64), counts)
    # A prover searches moduli from PRIME down to 2**15: any other value (65535, 0, 7)
    # never comes from one, and would make equivalent proofs with different digests.
    strays = (all_moduli < _MIN_MODULUS) | (all_moduli > PRIME)
    if strays.any():
        firsts = np.concatenate([[0], np.cumsum(counts)])
        for slot in np.unique(slots[strays]).tolist():
            own = all_moduli[firsts[slot] : firsts[slot + 1]]
            first = int(np.flatnonzero((own < _MIN_MODULUS) | (own > PRIME))[0])
            errors[slot] = ProofFormatError(
                f"window {first} has modulus {int(own[first])}, outside [{_MIN_MODULUS}, {PRIME}]"
            )
        keep = ~np.isin(slots, list(errors))
        counts[list(errors)] = 0
        all_moduli, all_coefficients, slots = all_moduli[keep], all_coefficients[keep], slots[keep]
    total = int(counts.sum())
    numbers = _window_numbers(counts)
    stops = np.asarray(offsets[1:], dtype=np.int64)[slots]
    first_rows = np.asarray(offsets[:-1], dtype=np.int64)[slots] + numbers * window
    real_rows = np.minimum(window, stops - first_rows)
    width = prepared.bits.shape[1]
    zero_row = prepared.bits.shape[0] - 1
    compared = np.zeros(total, dtype=np.int64)
    exp_mismatches = np.zeros(total, dtype=np.int64)
    means = np.zeros(total, dtype=np.float64)
    medians = np.zeros(total, dtype=np.float64)
    signs = np.zeros(total, dtype=np.int64)
    unexplained = None if prepared.values is None else np.zeros(total, dtype=np.int64)
    # Windows holding at least k values are checked together whatever their length, padded with
    # zero rows: padding never enters the top-k (ties go to the lower index and padding comes
    # last), so the statistics equal those of the unpadded window (as in encode_windows).
    keys = np.where(real_rows * width >= k, window, real_rows)
    for rows in np.unique(keys).tolist():
        group = np.flatnonzero(keys == rows)
        steps = np.arange(rows, dtype=np.int64)[None, :]
        for first in range(0, group.size, _EVALUATE_CHUNK):
            chosen_windows = group[first : first + _EVALUATE_CHUNK]
            starts = first_rows[chosen_windows]
            real = real_rows[chosen_windows]
            row_index = np.where(steps < real[:, None], starts[:, None] + steps, zero_row)
            flat = prepared.bits[row_index].reshape(chosen_windows.size, rows * width)
            used = min(k, flat.shape[1])
            idx = top_k_indices(flat, used)
            observed = np.take_along_axis(flat, idx, axis=1).astype(np.int64)
            near: npt.NDArray[np.float64] | None = None
            if prepared.values is not None:
                flat_values = prepared.values[row_index].reshape(chosen_windows.size, rows * width)
                picked = np.ascontiguousarray(np.take_along_axis(flat_values, idx, axis=1))
                # Honest noise is absolute (it scales with the row, not with each entry), so
                # measure slack in ULPs of the window's largest committed exponent: a tiny
                # entry (committed when a short window has < k values) is always near its
                # boundary.
                top_exponent = ((observed >> 7) & 0xFF).max(axis=1, keepdims=True) - 127
                near = np.ldexp(_slack_values(picked), -top_exponent)
            mods = all_moduli[chosen_windows]
            safe = np.where(mods > 0, mods, PRIME)  # a null proof (modulus 0) fails below
            claimed = _field.evaluate(all_coefficients[chosen_windows], idx % safe[:, None])
            null = mods <= 0
            if null.any():
                claimed[null] = observed[null] ^ 0x7F80  # force every exponent to differ
            figures = _compare_windows(claimed, observed, near, boundary_distance)
            compared[chosen_windows] = used
            exp_mismatches[chosen_windows] = figures["exp_mismatches"]
            means[chosen_windows] = figures["mant_err_mean"]
            medians[chosen_windows] = figures["mant_err_median"]
            signs[chosen_windows] = figures["sign_mismatches"]
            if unexplained is not None:
                unexplained[chosen_windows] = figures["unexplained"]
    return _Windows(
        errors,
        counts,
        compared,
        exp_mismatches,
        means,
        medians,
        signs,
        unexplained,
        prepared.has_slack,
    )


def verify_proofs(
    proofs: Sequence[bytes],
    hidden_states: Sequence[npt.ArrayLike],
    window: int = WINDOW,
    k: int = TOPK,
    boundary_distance: float = 1e-3,
) -> list[list[WindowStats] | ProofFormatError]:
    """:func:`verify_proof` for many rollouts at once: the windows of every rollout are checked
    together, in a few vectorized calls. A malformed proof gives its :class:`ProofFormatError`
    in its place instead of raising; the other rollouts' statistics are unaffected."""
    windows = _verify_windows(proofs, hidden_states, window, k, boundary_distance)
    columns = zip(
        windows.compared.tolist(),
        windows.exp_mismatches.tolist(),
        windows.mant_err_mean.tolist(),
        windows.mant_err_median.tolist(),
        windows.sign_mismatches.tolist(),
        (
            windows.unexplained.tolist()
            if windows.unexplained is not None
            else [None] * windows.compared.size
        ),
        strict=True,
    )
    results: list[list[WindowStats] | ProofFormatError] = []
    for slot, count in enumerate(windows.counts.tolist()):
        error = windows.errors.get(slot)
        if error is not None:
            results.append(error)
            continue
        stats = []
        for number in range(count):
            used, exponents, mean, median, signs, unexplained = next(columns)
            stats.append(
                WindowStats(
                    window=number,
                    compared=used,
                    exp_mismatches=exponents,
                    mant_err_mean=mean,
                    mant_err_median=median,
                    sign_mismatches=signs,
                    unexplained_mismatches=(
                        unexplained if unexplained is not None and windows.has_slack[slot] else None
                    ),
                )
            )
        results.append(stats)
    return results


def verify_proof(
    proof: bytes,
    hidden: npt.ArrayLike,
    window: int = WINDOW,
    k: int = TOPK,
    boundary_distance: float = 1e-3,
) -> list[WindowStats]:
    """Compare a proof with the validator's hidden states ``[T, d]`` of the same completion.

    ``hidden`` may be floats (fp32 enables ``unexplained_mismatches``) or bf16 bit patterns.
    Raises :class:`ProofFormatError` if the proof's window count does not match ``T``.
    """
    array = np.asarray(hidden)
    if array.ndim != 2:
        raise ValueError("hidden must be [tokens, hidden size]")
    (result,) = verify_proofs([proof], [array], window, k, boundary_distance)
    if isinstance(result, ProofFormatError):
        raise result
    return result


def proof_size(completion_tokens: int, window: int = WINDOW, k: int = TOPK) -> int:
    """Bytes of the proof for a completion of ``completion_tokens`` tokens."""
    return -(-completion_tokens // window) * 2 * (k + 1)


def split_proof(proof: bytes, k: int = TOPK) -> Sequence[bytes]:
    """The per-window 258-byte pieces of a proof."""
    size = 2 * (k + 1)
    return [proof[i : i + size] for i in range(0, len(proof), size)]


def check_toploc(proof: bytes, hidden_states: npt.ArrayLike, thresholds: Thresholds) -> CheckResult:
    """Every window's TOPLOC statistics are within the thresholds."""
    return check_toploc_batch([proof], [hidden_states], thresholds)[0]


def check_toploc_batch(
    proofs: Sequence[bytes], hidden_states: Sequence[npt.ArrayLike], thresholds: Thresholds
) -> list[CheckResult]:
    """:func:`check_toploc` for many rollouts, their windows verified and judged together."""
    windows = _verify_windows(proofs, hidden_states, WINDOW, TOPK, thresholds.min_boundary_distance)
    counts = windows.counts
    firsts = np.concatenate([[0], np.cumsum(counts)])
    judged = np.flatnonzero(counts > 0)
    starts = firsts[judged]
    matched = windows.compared - windows.exp_mismatches
    unexplained = (
        windows.unexplained.astype(np.float64)
        if windows.unexplained is not None
        else np.full(counts.sum(), np.inf)
    )
    # Without fp32 values the figure is unavailable: fail closed rather than skip.
    no_slack = np.repeat(~np.asarray(windows.has_slack, dtype=bool), counts)
    unexplained[no_slack] = np.inf
    limits: list[tuple[Reason, npt.NDArray[np.int64] | npt.NDArray[np.float64], float]] = [
        (Reason.EXPONENT_MISMATCH, windows.exp_mismatches, thresholds.max_exp_mismatches),
        (Reason.MANTISSA_ERROR_MEAN, windows.mant_err_mean, thresholds.max_mant_err_mean),
        (Reason.MANTISSA_ERROR_MEDIAN, windows.mant_err_median, thresholds.max_mant_err_median),
        (Reason.SIGN_MISMATCH, windows.sign_mismatches, thresholds.max_sign_mismatches),
    ]
    if thresholds.max_unexplained_mismatches is not None:
        limits.append(
            (Reason.UNEXPLAINED_MISMATCH, unexplained, thresholds.max_unexplained_mismatches)
        )
    maxima: list[list[Any]] = [[] for _ in range(4)]
    most_unexplained: list[float] = []
    failing: list[Reason | None] = []
    total: list[float] = []
    if judged.size:
        for column, per_window in zip(
            maxima,
            (
                windows.exp_mismatches,
                windows.mant_err_mean,
                windows.mant_err_median,
                windows.sign_mismatches,
            ),
            strict=True,
        ):
            column.extend(np.maximum.reduceat(per_window, starts).tolist())
        most_unexplained = np.maximum.reduceat(unexplained, starts).tolist()
        # The first reason whose limit some window exceeds, per rollout.
        reasons = np.full(judged.size, -1, dtype=np.int64)
        for number, (_, limited, limit) in enumerate(limits):
            over = np.logical_or.reduceat(limited > limit, starts)
            reasons[(reasons < 0) & over] = number
        failing = [None if r < 0 else limits[r][0] for r in reasons.tolist()]
        # Summed |mantissa error| over the rollout, from each window's mean and matched count,
        # added in window order (as a Python sum would: cumsum is sequential).
        with np.errstate(invalid="ignore"):  # inf x 0 where no exponent matched: not summed
            terms = np.where(matched > 0, windows.mant_err_mean * matched, 0.0)
        padded = np.zeros((judged.size, int(counts.max())), dtype=np.float64)
        padded[np.repeat(np.arange(judged.size), counts[judged]), _window_numbers(counts)] = terms
        total = np.cumsum(padded, axis=1)[:, -1].tolist()
    results: list[CheckResult] = []
    position = 0
    for slot in range(len(proofs)):
        error = windows.errors.get(slot)
        if error is not None:
            results.append(
                CheckResult(CheckName.TOPLOC, False, Reason.PROOF_MALFORMED, {}, str(error))
            )
            continue
        if not counts[slot]:
            results.append(CheckResult(CheckName.TOPLOC, True, None, {"windows": 0}))
            continue
        n = position
        position += 1
        figures: dict[str, Figure] = {
            "windows": int(counts[slot]),
            "max_exp_mismatches": maxima[0][n],
            "max_mant_err_mean": maxima[1][n],
            "max_mant_err_median": maxima[2][n],
            "mant_err_total": total[n],
            "max_sign_mismatches": maxima[3][n],
        }
        if windows.unexplained is not None and windows.has_slack[slot]:
            figures["max_unexplained_mismatches"] = int(most_unexplained[n])
        reason = failing[n]
        if reason is None:
            results.append(CheckResult(CheckName.TOPLOC, True, None, figures))
            continue
        failed, limit = next((v, lim) for r, v, lim in limits if r is reason)
        own = failed[firsts[slot] : firsts[slot + 1]] > limit
        figures["first_failing_window"] = int(np.argmax(own))
        results.append(
            CheckResult(
                CheckName.TOPLOC,
                False,
                reason,
                figures,
                f"{int(own.sum())} window(s) over the limit",
            )
        )
    return results


def _window_numbers(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Each window's number within its rollout, for rollouts of ``counts`` windows."""
    firsts = np.concatenate([[0], np.cumsum(counts)])[:-1]
    numbers = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(firsts, counts)
    return np.asarray(numbers, dtype=np.int64)
