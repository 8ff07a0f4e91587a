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
    bits = as_f32.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
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
    unordered within a row.
    """
    n = bits.shape[-1]
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


def _encode_uniform(bits: UInt16Array, k: int) -> list[bytes]:
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


def _compare(
    committed: npt.NDArray[np.int64],
    observed: npt.NDArray[np.int64],
    window: int,
    boundary_ulps: npt.NDArray[np.float64] | None,
    boundary_distance: float,
) -> WindowStats:
    exp_c, exp_o = (committed >> 7) & 0xFF, (observed >> 7) & 0xFF
    match = exp_c == exp_o
    matched = int(match.sum())
    mant_err = np.abs((committed & 0x7F) - (observed & 0x7F))[match]
    sign = int((((committed >> 15) & 1) != ((observed >> 15) & 1))[match].sum())
    mean = float(mant_err.mean()) if matched else float("inf")
    median = float(np.median(mant_err)) if matched else float("inf")
    unexplained = None
    if boundary_ulps is not None:
        differs = (committed & 0xFFFF) != (observed & 0xFFFF)
        unexplained = int((differs & match & (boundary_ulps >= boundary_distance)).sum())
    return WindowStats(
        window=window,
        compared=int(committed.size),
        exp_mismatches=int(committed.size) - matched,
        mant_err_mean=mean,
        mant_err_median=median,
        sign_mismatches=sign,
        unexplained_mismatches=unexplained,
    )


def _rounding_slack(hidden: npt.ArrayLike) -> npt.NDArray[np.float64] | None:
    """Each fp32 value's distance from its nearest bf16 rounding boundary, in bf16 ULPs of the
    value (0-0.5) scaled by ``2**(exponent - 127)``, so that callers can re-express it in ULPs
    of a window's largest value.

    The low 16 bits of an fp32 value are what bf16 rounding drops; the boundary is at 0x8000.
    ``None`` if the values are bf16 patterns or hold no more precision than bf16.
    """
    array = np.asarray(hidden)
    if array.dtype in (np.uint16, np.int16):
        return None
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    low = bits & 0xFFFF
    if not low.any():
        return None  # bf16 values widened to fp32: no extra precision to judge rounding by
    own_ulps = np.abs(low.astype(np.float64) - 0x8000) / 0x10000
    exponent = ((bits >> 23) & 0xFF).astype(np.float64) - 127
    return np.asarray(np.ldexp(own_ulps, exponent.astype(np.int64)), dtype=np.float64)


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
    bits = as_bf16_bits(hidden)
    slack = _rounding_slack(hidden)
    moduli, coefficients = parse_proof(proof, k)
    bounds = window_bounds(bits.shape[0], window)
    if len(bounds) != len(moduli):
        raise ProofFormatError(f"proof has {len(moduli)} windows, completion needs {len(bounds)}")
    groups: dict[int, list[int]] = {}
    for number, (start, stop) in enumerate(bounds):
        groups.setdefault(stop - start, []).append(number)
    results: dict[int, WindowStats] = {}
    for rows, numbers in groups.items():
        flat = np.stack([bits[bounds[w][0] : bounds[w][0] + rows].reshape(-1) for w in numbers])
        used = min(k, flat.shape[1])
        idx = top_k_indices(flat, used)
        observed = np.take_along_axis(flat, idx, axis=1).astype(np.int64)
        near: npt.NDArray[np.float64] | None = None
        if slack is not None:
            flat_s = np.stack(
                [slack[bounds[w][0] : bounds[w][0] + rows].reshape(-1) for w in numbers]
            )
            # Honest noise is absolute (it scales with the row, not with each entry), so
            # measure slack in ULPs of the window's largest committed exponent: a tiny entry
            # (committed when a short window has < k values) is always near its boundary.
            top_exponent = ((observed >> 7) & 0xFF).max(axis=1, keepdims=True) - 127
            near = np.ldexp(np.take_along_axis(flat_s, idx, axis=1), -top_exponent)
        mods = moduli[numbers]
        safe = np.where(mods > 0, mods, PRIME)  # a null proof (modulus 0) fails on its own below
        claimed = _field.evaluate(coefficients[numbers], idx % safe[:, None])
        for row, number in enumerate(numbers):
            if mods[row] <= 0:
                claimed[row] = observed[row] ^ 0x7F80  # force every exponent to differ
            results[number] = _compare(
                claimed[row],
                observed[row],
                number,
                None if near is None else near[row],
                boundary_distance,
            )
    return [results[n] for n in range(len(bounds))]


def proof_size(completion_tokens: int, window: int = WINDOW, k: int = TOPK) -> int:
    """Bytes of the proof for a completion of ``completion_tokens`` tokens."""
    return -(-completion_tokens // window) * 2 * (k + 1)


def split_proof(proof: bytes, k: int = TOPK) -> Sequence[bytes]:
    """The per-window 258-byte pieces of a proof."""
    size = 2 * (k + 1)
    return [proof[i : i + size] for i in range(0, len(proof), size)]


def check_toploc(proof: bytes, hidden_states: npt.ArrayLike, thresholds: Thresholds) -> CheckResult:
    """Every window's TOPLOC statistics are within the thresholds."""
    try:
        stats = verify_proof(
            proof, hidden_states, boundary_distance=thresholds.min_boundary_distance
        )
    except ProofFormatError as error:
        return CheckResult(CheckName.TOPLOC, False, Reason.PROOF_MALFORMED, {}, str(error))
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
