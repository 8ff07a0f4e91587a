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

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

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
    """Every rollout's hidden states stacked: bf16 patterns, fp32 values, where each starts."""

    bits: UInt16Array  # [rows, d]
    values: npt.NDArray[np.float32] | None  # [rows, d]; None when no rollout has fp32 precision
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
        values = np.concatenate([np.asarray(a, dtype=np.float32) for a in arrays])
        low = np.asarray((values.view(np.uint32) & 0xFFFF).any(axis=1), dtype=bool)
        has = [bool(low[a:b].any()) for a, b in itertools.pairwise(offsets)]
        return _Prepared(bf16_bits(values), values if any(has) else None, has, offsets)
    bits = [as_bf16_bits(a) for a in arrays]
    if any(b.ndim != 2 for b in bits) or len({b.shape[1] for b in bits}) > 1:
        raise ValueError("hidden states must be [tokens, hidden size], one width for all")
    has = [_has_fp32_precision(a) for a in arrays]
    width = bits[0].shape[1] if bits else 0
    stacked = np.concatenate(bits) if bits else np.zeros((0, width), dtype=np.uint16)
    stacked_values = None
    if any(has):
        stacked_values = np.concatenate(
            [
                np.asarray(a, dtype=np.float32) if fp32 else np.zeros(b.shape, dtype=np.float32)
                for a, b, fp32 in zip(arrays, bits, has, strict=True)
            ]
        )
    return _Prepared(stacked, stacked_values, has, offsets)


_EVALUATE_CHUNK = 32  # windows per field evaluation: keeps the temporaries in cache


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
    if len(proofs) != len(hidden_states):
        raise ValueError("one proof per rollout's hidden states")
    prepared = _prepare(hidden_states)
    results: list[list[WindowStats] | ProofFormatError] = []
    moduli_parts: list[npt.NDArray[np.int64]] = []
    coefficient_parts: list[npt.NDArray[np.int64]] = []
    # Per window of every well-formed proof: (rollout slot, window number, first row, rows).
    owners: list[tuple[int, int, int, int]] = []
    for slot, proof in enumerate(proofs):
        start, stop = prepared.offsets[slot], prepared.offsets[slot + 1]
        try:
            bounds = window_bounds(stop - start, window)
            # The length first: a proof of the wrong size is refused before it is parsed (a
            # hostile one may be as large as the blob).
            if len(proof) != len(bounds) * 2 * (k + 1):
                raise ProofFormatError(
                    f"proof has {len(proof)} bytes, a completion of {stop - start} tokens "
                    f"needs {len(bounds)} windows of {2 * (k + 1)}"
                )
            moduli, coefficients = parse_proof(proof, k)
            # A prover searches moduli from PRIME down to 2**15: any other value (65535, 0, 7)
            # never comes from one, and would make equivalent proofs with different digests.
            strays = np.flatnonzero((moduli < _MIN_MODULUS) | (moduli > PRIME))
            if strays.size:
                raise ProofFormatError(
                    f"window {int(strays[0])} has modulus {int(moduli[strays[0]])}, outside "
                    f"[{_MIN_MODULUS}, {PRIME}]"
                )
        except ProofFormatError as error:
            results.append(error)
            continue
        results.append([])
        moduli_parts.append(moduli)
        coefficient_parts.append(coefficients)
        owners.extend((slot, n, start + a, b - a) for n, (a, b) in enumerate(bounds))
    if not owners:
        return results
    all_moduli = np.concatenate(moduli_parts)
    all_coefficients = np.concatenate(coefficient_parts)
    width = prepared.bits.shape[1]
    # Windows holding at least k values are checked together whatever their length, padded with
    # zero rows: padding never enters the top-k (ties go to the lower index and padding comes
    # last), so the statistics equal those of the unpadded window (as in encode_windows).
    groups: dict[int, list[int]] = {}
    for number, owner in enumerate(owners):
        groups.setdefault(window if owner[3] * width >= k else owner[3], []).append(number)
    zero_row = prepared.bits.shape[0]
    bits = np.concatenate([prepared.bits, np.zeros((1, width), dtype=np.uint16)])
    values = (
        None
        if prepared.values is None
        else np.concatenate([prepared.values, np.zeros((1, width), dtype=np.float32)])
    )
    stats: dict[int, WindowStats] = {}
    for rows, group in groups.items():
        for first in range(0, len(group), _EVALUATE_CHUNK):
            numbers = np.asarray(group[first : first + _EVALUATE_CHUNK], dtype=np.int64)
            starts = np.asarray([owners[n][2] for n in numbers.tolist()], dtype=np.int64)
            real = np.asarray([owners[n][3] for n in numbers.tolist()], dtype=np.int64)
            steps = np.arange(rows, dtype=np.int64)[None, :]
            row_index = np.where(steps < real[:, None], starts[:, None] + steps, zero_row)
            flat = bits[row_index].reshape(numbers.size, rows * width)
            used = min(k, flat.shape[1])
            idx = top_k_indices(flat, used)
            observed = np.take_along_axis(flat, idx, axis=1).astype(np.int64)
            near: npt.NDArray[np.float64] | None = None
            if values is not None:
                flat_values = values[row_index].reshape(numbers.size, rows * width)
                chosen = np.ascontiguousarray(np.take_along_axis(flat_values, idx, axis=1))
                # Honest noise is absolute (it scales with the row, not with each entry), so
                # measure slack in ULPs of the window's largest committed exponent: a tiny
                # entry (committed when a short window has < k values) is always near its
                # boundary.
                top_exponent = ((observed >> 7) & 0xFF).max(axis=1, keepdims=True) - 127
                near = np.ldexp(_slack_values(chosen), -top_exponent)
            mods = all_moduli[numbers]
            safe = np.where(mods > 0, mods, PRIME)  # a null proof (modulus 0) fails below
            claimed = _field.evaluate(all_coefficients[numbers], idx % safe[:, None])
            null = mods <= 0
            if null.any():
                claimed[null] = observed[null] ^ 0x7F80  # force every exponent to differ
            figures = _compare_windows(claimed, observed, near, boundary_distance)
            exp_mismatches = figures["exp_mismatches"].tolist()
            means = figures["mant_err_mean"].tolist()
            medians = figures["mant_err_median"].tolist()
            signs = figures["sign_mismatches"].tolist()
            unexplained = figures["unexplained"].tolist() if near is not None else None
            for row, number in enumerate(numbers.tolist()):
                slot, window_number = owners[number][0], owners[number][1]
                stats[number] = WindowStats(
                    window=window_number,
                    compared=used,
                    exp_mismatches=int(exp_mismatches[row]),
                    mant_err_mean=float(means[row]),
                    mant_err_median=float(medians[row]),
                    sign_mismatches=int(signs[row]),
                    unexplained_mismatches=(
                        int(unexplained[row])
                        if unexplained is not None and prepared.has_slack[slot]
                        else None
                    ),
                )
    for number, owner in enumerate(owners):
        collected = results[owner[0]]
        assert isinstance(collected, list)
        collected.append(stats[number])
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
    """:func:`check_toploc` for many rollouts, their windows verified together."""
    verified = verify_proofs(
        proofs, hidden_states, boundary_distance=thresholds.min_boundary_distance
    )
    return [
        CheckResult(CheckName.TOPLOC, False, Reason.PROOF_MALFORMED, {}, str(stats))
        if isinstance(stats, ProofFormatError)
        else _judge(stats, thresholds)
        for stats in verified
    ]


def _judge(stats: list[WindowStats], thresholds: Thresholds) -> CheckResult:
    """The TOPLOC check's result for one rollout's window statistics."""
    if not stats:
        return CheckResult(CheckName.TOPLOC, True, None, {"windows": 0})
    # Summed |mantissa error| over the rollout, from each window's mean and matched count.
    total = float(
        sum(
            s.mant_err_mean * (s.compared - s.exp_mismatches)
            for s in stats
            if s.compared > s.exp_mismatches
        )
    )
    figures: dict[str, Figure] = {
        "windows": len(stats),
        "max_exp_mismatches": max(s.exp_mismatches for s in stats),
        "max_mant_err_mean": max(s.mant_err_mean for s in stats),
        "max_mant_err_median": max(s.mant_err_median for s in stats),
        "mant_err_total": total,
        "max_sign_mismatches": max(s.sign_mismatches for s in stats),
    }
    unexplained = [s.unexplained_mismatches for s in stats]
    if all(u is not None for u in unexplained):
        figures["max_unexplained_mismatches"] = max(u for u in unexplained if u is not None)
    limits: list[tuple[Reason, list[float], float]] = [
        (
            Reason.EXPONENT_MISMATCH,
            [s.exp_mismatches for s in stats],
            thresholds.max_exp_mismatches,
        ),
        (
            Reason.MANTISSA_ERROR_MEAN,
            [s.mant_err_mean for s in stats],
            thresholds.max_mant_err_mean,
        ),
        (
            Reason.MANTISSA_ERROR_MEDIAN,
            [s.mant_err_median for s in stats],
            thresholds.max_mant_err_median,
        ),
        (Reason.SIGN_MISMATCH, [s.sign_mismatches for s in stats], thresholds.max_sign_mismatches),
    ]
    if thresholds.max_unexplained_mismatches is not None:
        limits.append(
            (
                Reason.UNEXPLAINED_MISMATCH,
                # Without fp32 values the figure is unavailable: fail closed rather than skip.
                [float("inf") if u is None else u for u in unexplained],
                thresholds.max_unexplained_mismatches,
            )
        )
    for reason, values, limit in limits:
        bad = [window for window, value in enumerate(values) if value > limit]
        if bad:
            figures["first_failing_window"] = bad[0]
            return CheckResult(
                CheckName.TOPLOC, False, reason, figures, f"{len(bad)} window(s) over the limit"
            )
    return CheckResult(CheckName.TOPLOC, True, None, figures)
