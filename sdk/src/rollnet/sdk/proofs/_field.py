"""Vectorized arithmetic over GF(65497) for TOPLOC's polynomial encoding.

Everything is batched over windows (leading axis). Field elements are kept in [0, p) with
p < 2**16, so any product is below 2**32 and a sum of up to 2**21 products is an integer below
2**53: float64 represents it exactly, which lets BLAS matrix products and FFT convolutions do the
heavy lifting exactly (FFT rounding error at these lengths is below 2**-10, and results are
rounded back to integers). Modular reductions, the slow part in numpy, are only taken on small
arrays.

Interpolation uses the Lagrange form with O(log k) numpy calls and no Python loop per coefficient:
with M(x) = prod_j (x - x_j) and w_j = y_j / M'(x_j), the monomial coefficients of
P(x) = sum_j w_j M(x) / (x - x_j) are c_i = sum_e s_e m_{i+1+e} with s_e = sum_j w_j x_j**e.
Power sums and evaluations split exponents as e = 16*h + l (baby steps x**l, giant steps
x**(16h)), so an O(k**2) Vandermonde product becomes one exact float64 matmul plus O(k*sqrt(k))
reductions.

The same interpolation is also written in C (``_field_kernel.c``, compiled at install when a
compiler is present and loaded with ctypes): ~5x faster per window, bit-identical.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

PRIME = 65497
"""The field modulus: the third-largest prime below 2**16, as in the TOPLOC library."""

BABY = 16
"""Baby-step size of the exponent split e = BABY*h + l."""

Int64Array = npt.NDArray[np.int64]
Float64Array = npt.NDArray[np.float64]

_INVERSES: Int64Array | None = None


def _inverse_table() -> Int64Array:
    """Inverses of every field element (0 maps to 0), built once by Fermat's little theorem."""
    global _INVERSES
    if _INVERSES is None:
        base = np.arange(PRIME, dtype=np.int64)
        result = np.ones(PRIME, dtype=np.int64)
        exponent = PRIME - 2
        while exponent:
            if exponent & 1:
                result = result * base % PRIME
            base = base * base % PRIME
            exponent >>= 1
        result[0] = 0
        _INVERSES = result
    return _INVERSES


def inverse(values: Int64Array) -> Int64Array:
    """Multiplicative inverses of non-zero field elements (elementwise)."""
    return _inverse_table()[values]


def mod(values: Int64Array) -> Int64Array:
    """``values mod p`` in [0, p) for int64 arrays.

    numpy divides int64 by a scalar with a precomputed reciprocal (libdivide) but computes
    ``%`` with hardware division: ``v - (v // p) * p`` is several times faster.
    """
    return np.asarray(values - (values // PRIME) * PRIME, dtype=np.int64)


def _reduce(values: Float64Array, exact: bool = True) -> Int64Array:
    """Non-negative integers held in float64 (< 2**53) -> int64 residues mod p.

    ``exact=False`` rounds first (FFT results carry a rounding error below 2**-10).
    """
    rounded = values if exact else np.rint(values)
    return mod(rounded.astype(np.int64))


def powers(x: Int64Array, count: int) -> Int64Array:
    """``x**e mod p`` for e in [0, count): shape ``x.shape + (count,)``.

    Built by doubling on contiguous slabs (the power index first): x**(f + e) = x**f * x**e.
    """
    base = mod(np.asarray(x, dtype=np.int64))
    out = np.empty((count, *base.shape), dtype=np.int64)
    if count:
        out[0] = 1
    if count > 1:
        out[1] = base
    filled = min(2, count)
    while filled < count:
        step = min(filled, count - filled)
        top = mod(out[filled - 1] * base)  # x**filled
        out[filled : filled + step] = mod(out[:step] * top)
        filled += step
    return np.moveaxis(out, 0, -1)


def _baby_giant(x: Int64Array, count: int) -> tuple[Float64Array, Float64Array]:
    """Baby steps ``x**l`` (l < BABY) and giant steps ``x**(BABY*h)`` covering e < count."""
    giant_count = -(-count // BABY)
    baby = powers(x, BABY)
    step = mod(baby[..., BABY - 1] * mod(x))  # x**BABY
    giant = powers(step, giant_count)
    return baby.astype(np.float64), giant.astype(np.float64)


def convolve(a: Int64Array, b: Int64Array) -> Int64Array:
    """Polynomial products mod p along the last axis (ascending coefficients), batched, by FFT."""
    n = a.shape[-1] + b.shape[-1] - 1
    size = 1 << (n - 1).bit_length()
    product = np.fft.irfft(np.fft.rfft(a, size) * np.fft.rfft(b, size), size)[..., :n]
    return _reduce(product, exact=False)


def _multiply_direct(a: Int64Array, b: Int64Array) -> Int64Array:
    """Polynomial products mod p of equal-length operands, by an outer product (short ones)."""
    n = a.shape[-1]
    outer = mod(a[..., :, None] * b[..., None, :])  # [..., n, n]
    # Shift row i right by i places (pad, flatten, re-cut) so that each column holds one
    # anti-diagonal, then sum the columns.
    padded = np.zeros((*outer.shape[:-1], 2 * n), dtype=np.int64)
    padded[..., :n] = outer
    flat = padded.reshape(*outer.shape[:-2], 2 * n * n)[..., : n * (2 * n - 1)]
    return mod(flat.reshape(*outer.shape[:-2], n, 2 * n - 1).sum(axis=-2))


def vanishing_polynomial(x: Int64Array) -> Int64Array:
    """Coefficients of ``prod_j (X - x_j)`` for each row of ``x`` [B, k]: shape [B, k + 1]."""
    batch, k = x.shape
    size = 4
    while size < k:
        size *= 2
    # The factors are X + c with c = -x_j, padded to a power of two (>= 4) with the constant
    # factor 1; ``real`` marks the true ones.
    roots = np.zeros((batch, size), dtype=np.int64)
    roots[:, :k] = mod(-x)
    real = np.zeros((batch, size), dtype=bool)
    real[:, :k] = True
    # Level 0, closed form per pair: (X + a)(X + b) = X^2 + (a + b) X + ab. A padded factor is
    # the constant 1, so a pair with one padded member is just "X + a" (and two give 1).
    a, b = roots[:, 0::2], roots[:, 1::2]
    a_real, b_real = real[:, 0::2], real[:, 1::2]
    quad = np.zeros((batch, size // 2, 3), dtype=np.int64)
    both = a_real & b_real
    quad[..., 0] = np.where(both, mod(a * b), np.where(a_real, a, np.where(b_real, b, 1)))
    quad[..., 1] = np.where(both, mod(a + b), (a_real | b_real).astype(np.int64))
    quad[..., 2] = both
    # Level 1, closed form: (p2 X^2 + p1 X + p0)(q2 X^2 + q1 X + q0), with p2, q2 in {0, 1}.
    p0, p1, p2 = quad[:, 0::2, 0], quad[:, 0::2, 1], quad[:, 0::2, 2]
    q0, q1, q2 = quad[:, 1::2, 0], quad[:, 1::2, 1], quad[:, 1::2, 2]
    factors = np.empty((batch, size // 4, 5), dtype=np.int64)
    factors[..., 0] = mod(p0 * q0)
    factors[..., 1] = mod(p0 * q1 + p1 * q0)
    factors[..., 2] = mod(p0 * q2 + p1 * q1 + p2 * q0)
    factors[..., 3] = mod(p1 * q2 + p2 * q1)
    factors[..., 4] = p2 * q2
    # Remaining levels: pairwise FFT products (cheaper than direct ones from 5 coefficients up).
    while factors.shape[1] > 1:
        factors = convolve(factors[:, 0::2, :], factors[:, 1::2, :])
    return factors[:, 0, : k + 1]


def _evaluate_many(
    coefficients: Int64Array, x: Int64Array, steps: tuple[Float64Array, Float64Array] | None = None
) -> Int64Array:
    """``sum_e coefficients[b, e] * x[b, q]**e`` for [B, n] polynomials at [B, q] points."""
    batch, n = coefficients.shape
    giant_count = -(-n // BABY)
    padded = np.zeros((batch, giant_count * BABY), dtype=np.float64)
    padded[:, :n] = coefficients
    blocks = padded.reshape(batch, giant_count, BABY).transpose(0, 2, 1)  # [B, l, h]
    baby, giant = steps if steps is not None else _baby_giant(x, n)  # [B, q, BABY], [B, q, H]
    inner = _reduce(baby @ blocks)  # [B, q, h]: sum_l c_{16h+l} x**l
    return _reduce((inner * giant).sum(axis=-1))


def _weighted_power_sums(
    weights: Int64Array, count: int, steps: tuple[Float64Array, Float64Array]
) -> Int64Array:
    """``s_e = sum_j weights[b, j] * x[b, j]**e`` for e < count: shape [B, count]."""
    batch = weights.shape[0]
    baby, giant = steps  # [B, k, BABY], [B, k, H] from _baby_giant(x, count)
    weighted = _reduce(giant * weights[..., None].astype(np.float64))  # [B, k, H]
    sums = _reduce(np.swapaxes(weighted, 1, 2).astype(np.float64) @ baby)  # [B, H, BABY]
    return sums.reshape(batch, -1)[:, :count]


def _array(dtype: type[np.generic]) -> Any:
    """A ctypes argument type taking a C-contiguous numpy array of ``dtype`` (checked)."""
    return np.ctypeslib.ndpointer(dtype=dtype, flags="C_CONTIGUOUS")


_I64, _N = _array(np.int64), ctypes.c_int64
_U16, _U8, _F64 = _array(np.uint16), _array(np.uint8), _array(np.float64)


class _Kernel:
    """The compiled field code (``_field_kernel.c``), loaded with ctypes if it was built."""

    MAX_K = 256

    def __init__(self, path: Path) -> None:
        library = ctypes.CDLL(str(path))

        def bind(name: str, *argtypes: Any) -> Any:
            function = getattr(library, name)
            function.argtypes = list(argtypes)
            function.restype = ctypes.c_int
            return function

        self._interpolate = bind("rollnet_interpolate", _I64, _I64, _I64, _N, _N, _I64, _F64)
        self._encode = bind("rollnet_encode", _U16, _N, _N, _N, _I64, _F64, _U8)
        self._top_k = bind("rollnet_top_k", _U16, _N, _N, _N, _F64, _I64)
        self._evaluate = bind("rollnet_evaluate", _I64, _I64, _I64, _N, _N, _N)
        library.rollnet_kernel_source.restype = ctypes.c_char_p
        source = path.with_suffix(".c")
        if source.is_file():
            built_from = library.rollnet_kernel_source().decode()
            if built_from != hashlib.sha256(source.read_bytes()).hexdigest():
                raise OSError(f"{path.name} was built from another version of {source.name}")
        self._scratch_size = int(bind("rollnet_scratch_doubles")())
        self._local = threading.local()

    def _scratch(self) -> Float64Array:
        """This thread's scratch buffer (the kernel keeps no state of its own)."""
        scratch: Float64Array | None = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = np.empty(self._scratch_size, dtype=np.float64)
            self._local.scratch = scratch
        return scratch

    def interpolate(self, x: Int64Array, y: Int64Array) -> Int64Array:
        """Residue rows ``x``, ``y`` [B, k] (x distinct per row) -> coefficients [B, k]."""
        x = np.ascontiguousarray(x, dtype=np.int64)
        y = np.ascontiguousarray(y, dtype=np.int64)
        if x.ndim != 2 or x.shape != y.shape:
            raise ValueError(f"x and y must be [B, k] of one shape, not {x.shape} and {y.shape}")
        out = np.empty_like(x)
        batch, k = x.shape
        if self._interpolate(x, y, out, batch, k, _inverse_table(), self._scratch()) != 0:
            raise ValueError(f"the field kernel refused k = {k}")
        return out

    def encode(self, bits: npt.NDArray[np.uint16], k: int) -> bytes | None:
        """TOPLOC windows of rows ``bits`` [B, n] (bf16 patterns), n < p: ``B * (2 + 2k)``
        bytes, the same as ``toploc`` builds with numpy; None when n or k is out of range."""
        bits = np.ascontiguousarray(bits, dtype=np.uint16)
        batch, n = bits.shape
        if not (1 <= k <= self.MAX_K and 1 <= n < PRIME):
            return None
        out = np.empty(batch * (2 + 2 * k), dtype=np.uint8)
        status = self._encode(bits, batch, n, k, _inverse_table(), self._scratch(), out)
        return out.tobytes() if status == 0 else None

    def top_k(self, bits: npt.NDArray[np.uint16], k: int) -> Int64Array | None:
        """Each row's top-k flat indices (the set ``toploc.top_k_indices`` picks, ascending);
        None when not 0 < k < n <= 65536."""
        bits = np.ascontiguousarray(bits, dtype=np.uint16)
        batch, n = bits.shape
        if not 0 < k < n <= 1 << 16:
            return None
        out = np.empty((batch, k), dtype=np.int64)
        return out if self._top_k(bits, batch, n, k, self._scratch(), out) == 0 else None

    def evaluate(self, coefficients: Int64Array, x: Int64Array) -> Int64Array | None:
        """Residue polynomials [B, n] at residue points [B, q], q <= 256; None out of range."""
        coefficients = np.ascontiguousarray(coefficients, dtype=np.int64)
        x = np.ascontiguousarray(x, dtype=np.int64)
        if coefficients.ndim != 2 or x.ndim != 2 or coefficients.shape[0] != x.shape[0]:
            raise ValueError("coefficients [B, n] and points [B, q] must have the same rows")
        batch, count = coefficients.shape
        points = x.shape[1]
        if not (count >= 1 and 1 <= points <= self.MAX_K):
            return None
        out = np.empty((batch, points), dtype=np.int64)
        return out if self._evaluate(coefficients, x, out, batch, count, points) == 0 else None


def _load_kernel() -> _Kernel | None:
    """The compiled kernel, or None (not built, or built for another platform)."""
    path = Path(__file__).with_name("_field_kernel.so")
    if not path.is_file():
        return None
    try:
        return _Kernel(path)
    except (OSError, AttributeError) as error:  # another platform's build, or a stale one
        warnings.warn(
            f"rollnet: the compiled field kernel is not used ({error}); reinstall rollnet-sdk "
            "to rebuild it. Proofs are built with numpy meanwhile (same results, slower).",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


KERNEL: _Kernel | None = _load_kernel()
"""The compiled interpolation when available; the numpy code otherwise (same results)."""


def use_compiled_kernel(enabled: bool) -> bool:
    """Use the compiled field kernel when it is built (``True``, the default) or force the
    numpy code (``False``: same results, slower; for comparisons). Returns whether the kernel
    is used now. The library reads no environment variable for it: this is the one switch."""
    global KERNEL
    KERNEL = _load_kernel() if enabled else None
    return KERNEL is not None


def interpolate(x: Int64Array, y: Int64Array) -> Int64Array:
    """Coefficients (ascending, length k) of the degree < k polynomial through ``(x_j, y_j)``.

    ``x`` [B, k] must hold distinct field elements per row; ``y`` [B, k] any integers. Runs the
    compiled kernel when it was built (:data:`KERNEL`), else numpy; the results are identical.
    """
    x = mod(np.asarray(x, dtype=np.int64))
    y = mod(np.asarray(y, dtype=np.int64))
    if x.ndim != 2 or x.shape != y.shape:
        raise ValueError(f"x and y must be [B, k] of one shape, not {x.shape} and {y.shape}")
    k = x.shape[1]
    if x.shape[0] == 0:
        return np.zeros_like(x)
    if KERNEL is not None and 1 <= k <= _Kernel.MAX_K:
        return KERNEL.interpolate(x, y)
    return interpolate_numpy(x, y)


def interpolate_numpy(x: Int64Array, y: Int64Array) -> Int64Array:
    """:func:`interpolate` in numpy alone (``x``, ``y`` reduced already)."""
    k = x.shape[1]
    m = vanishing_polynomial(x)  # [B, k+1], m[:, k] == 1
    derivative = mod(m[:, 1:] * np.arange(1, k + 1, dtype=np.int64))  # M'(X)
    steps = _baby_giant(x, k)
    weights = mod(y * inverse(_evaluate_many(derivative, x, steps)))  # [B, k]
    s = _weighted_power_sums(weights, k, steps)  # [B, k]
    # c_i = sum_e s_e m_{i+1+e}: correlate s with m, i.e. convolve reversed s with m.
    full = convolve(s[:, ::-1], m)  # index (k-1-e) + t holds s_e m_t
    return np.asarray(full[:, k : 2 * k], dtype=np.int64)


def evaluate(coefficients: Int64Array, x: Int64Array) -> Int64Array:
    """Evaluate polynomials [B, n] at points [B, q]: returns [B, q] in [0, p)."""
    coefficients = mod(np.asarray(coefficients, dtype=np.int64))
    x = np.asarray(x, dtype=np.int64)
    if KERNEL is not None and x.ndim == 2 and x.shape[0]:
        evaluated = KERNEL.evaluate(coefficients, mod(x))
        if evaluated is not None:
            return evaluated
    return _evaluate_many(coefficients, x)
