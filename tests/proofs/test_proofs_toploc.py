"""TOPLOC commitments: field arithmetic, the 258-byte format, and verification statistics."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rollnet.sdk.proofs import _field, toploc
from rollnet.sdk.proofs.report import Reason
from rollnet.sdk.proofs.thresholds import FLOAT32

P = _field.PRIME


def slow_interpolate(xs: list[int], ys: list[int]) -> list[int]:
    """Textbook Lagrange interpolation over GF(p) in pure Python (the reference)."""
    k = len(xs)
    coefficients = [0] * k
    for j in range(k):
        basis = [1]
        denominator = 1
        for i in range(k):
            if i == j:
                continue
            shifted = [0, *basis]
            scaled = [(-xs[i] * c) % P for c in basis] + [0]
            basis = [(a + b) % P for a, b in zip(shifted, scaled, strict=True)]
            denominator = denominator * (xs[j] - xs[i]) % P
        weight = ys[j] * pow(denominator, P - 2, P) % P
        for t in range(k):
            coefficients[t] = (coefficients[t] + weight * basis[t]) % P
    return coefficients


def slow_evaluate(coefficients: list[int], x: int) -> int:
    value = 0
    for c in reversed(coefficients):
        value = (value * x + c) % P
    return value


REQUIRE_KERNEL = os.environ.get("ROLLNET_REQUIRE_FIELD_KERNEL") == "1"


@pytest.fixture(params=["kernel", "numpy"])
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with the compiled field kernel, then with numpy alone."""
    if request.param == "numpy":
        monkeypatch.setattr(_field, "KERNEL", None)
    elif _field.KERNEL is None:
        assert not REQUIRE_KERNEL, "ROLLNET_REQUIRE_FIELD_KERNEL=1 but the kernel was not built"
        pytest.skip("the field kernel was not built (no C compiler at install)")
    return str(request.param)


def test_the_field_kernel_is_built_where_required() -> None:
    # CI installs with a C compiler: the kernel must be there (a broken build hook would
    # otherwise pass unnoticed, every test falling back to numpy).
    if REQUIRE_KERNEL:
        assert _field.KERNEL is not None
    elif _field.KERNEL is None:
        pytest.skip("the field kernel was not built (no C compiler at install)")


def test_a_kernel_built_from_another_source_is_not_loaded(tmp_path: Path) -> None:
    if _field.KERNEL is None:
        pytest.skip("the field kernel was not built (no C compiler at install)")
    built = Path(_field.__file__).with_name("_field_kernel.so")
    source = built.with_suffix(".c")
    copy = tmp_path / built.name
    shutil.copyfile(built, copy)
    shutil.copyfile(source, copy.with_suffix(".c"))
    _field._Kernel(copy)  # the source it was built from: loads
    copy.with_suffix(".c").write_text(source.read_text() + "/* edited, not rebuilt */\n")
    with pytest.raises(OSError, match="another version"):
        _field._Kernel(copy)


@pytest.mark.slow
def test_the_sdk_wheel_carries_the_kernel_for_any_python_3(tmp_path: Path) -> None:
    """A built wheel holds the kernel and its source, loads it, and is tagged ``py3-none``
    for this platform (the library uses no Python ABI)."""
    if _field.KERNEL is None:
        pytest.skip("the field kernel was not built (no C compiler at install)")
    sdk = Path(__file__).resolve().parents[2] / "sdk"
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    built = subprocess.run(
        [*command, "-q", "-w", str(tmp_path), str(sdk)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("*.whl")
    platform_tag = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert wheel.name.endswith(f"-py3-none-{platform_tag}.whl"), wheel.name
    inside = tmp_path / "unpacked"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert {
            "rollnet/sdk/proofs/_field_kernel.so",
            "rollnet/sdk/proofs/_field_kernel.c",
        } <= names
        archive.extractall(inside)
        (metadata,) = [n for n in names if n.endswith(".dist-info/WHEEL")]
        assert "Root-Is-Purelib: false" in archive.read(metadata).decode()
    _field._Kernel(inside / "rollnet/sdk/proofs/_field_kernel.so")  # built from its source


def test_interpolation_refuses_mismatched_shapes(implementation: str) -> None:
    x = np.arange(128, dtype=np.int64)[None, :].repeat(4, axis=0)
    with pytest.raises(ValueError, match="one shape"):
        _field.interpolate(x, np.zeros((1, 128), dtype=np.int64))


def test_kernel_and_numpy_interpolate_identically(implementation: str) -> None:
    rng = np.random.default_rng(7)
    for k in (1, 2, 5, 31, 127, 128, 200, 256):
        x = np.stack([rng.choice(P, size=k, replace=False) for _ in range(4)])
        x[0, 0] = 0  # the root 0 and the largest residue are edge cases of "-x mod p"
        if k > 1:
            x[0, 1] = P - 1
        y = rng.integers(0, 1 << 16, size=(4, k))
        expected = _field.interpolate_numpy(_field.mod(x), _field.mod(y))
        assert np.array_equal(_field.interpolate(x, y), expected), (implementation, k)
    # No rows, and more rows than one chunk of commitments.
    assert _field.interpolate(np.zeros((0, 8), np.int64), np.zeros((0, 8), np.int64)).shape == (
        0,
        8,
    )
    x = np.stack([rng.choice(P, size=128, replace=False) for _ in range(70)])
    y = rng.integers(0, 1 << 16, size=(70, 128))
    assert np.array_equal(
        _field.interpolate(x, y), _field.interpolate_numpy(_field.mod(x), _field.mod(y))
    )


@pytest.mark.parametrize("width", [1, 5, 127, 128, 129, 2048, 65496, 65497, 70000])
def test_kernel_and_numpy_commit_identical_windows(
    width: int, implementation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole windows (top-k with ties, moduli, interpolation, bytes) from either code path."""
    rng = np.random.default_rng(width)
    rows: list[np.ndarray[Any, Any]] = [
        rng.standard_normal(width).astype(np.float32),
        np.round(rng.standard_normal(width) * 4).astype(np.float32) / 4,  # many equal magnitudes
        np.ones(width, dtype=np.float32),  # every magnitude equal: the lowest indices win
        np.where(np.arange(width) % 3 == 0, 0.0, rng.standard_normal(width) * 1e-30),
    ]
    bits = np.stack([toploc.bf16_bits(row) for row in rows])
    bits[3, : min(width, 10)] = 0xFFFF  # NaN patterns and the largest residues
    bits[3, -1:] = 0x7F80  # +inf
    committed = toploc.encode_windows(bits)
    monkeypatch.setattr(_field, "KERNEL", None)
    assert committed == toploc.encode_windows(bits), implementation


@pytest.mark.parametrize("width", [2, 129, 2048, 65496, 65536, 70000])
def test_kernel_and_numpy_pick_the_same_top_k(
    width: int, implementation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(width)
    rows = np.stack(
        [
            toploc.bf16_bits(rng.standard_normal(width).astype(np.float32)),
            toploc.bf16_bits(np.round(rng.standard_normal(width) * 2).astype(np.float32)),
            np.full(width, 0x3F80, dtype=np.uint16),
            rng.integers(0, 1 << 16, width).astype(np.uint16),  # NaN, inf, -0 and all the rest
        ]
    )
    k = min(128, width - 1)
    picked = toploc.top_k_indices(rows, k)
    monkeypatch.setattr(_field, "KERNEL", None)
    expected = toploc.top_k_indices(rows, k)
    assert np.array_equal(np.sort(picked, axis=1), np.sort(expected, axis=1)), implementation


def test_kernel_and_numpy_evaluate_and_verify_identically(
    implementation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(3)
    coefficients = rng.integers(0, P, size=(5, 128))
    points = rng.integers(0, P, size=(5, 128))
    evaluated = _field.evaluate(coefficients, points)
    # Honest, tampered and malformed proofs over several rollouts of different lengths.
    hidden = [rng.standard_normal((n, 64)).astype(np.float32) for n in (5, 32, 70, 64)]
    proofs = [toploc.build_proof(h) for h in hidden]
    proofs[1] = proofs[1][:10] + bytes([proofs[1][10] ^ 0xFF]) + proofs[1][11:]
    proofs[2] = proofs[2][:-1]
    tampered = hidden[3] * np.float32(1.01)
    checked = toploc.verify_proofs(proofs, [*hidden[:3], tampered])
    monkeypatch.setattr(_field, "KERNEL", None)
    assert np.array_equal(evaluated, _field.evaluate(coefficients, points))
    again = toploc.verify_proofs(proofs, [*hidden[:3], tampered])
    assert repr(checked) == repr(again), implementation


@pytest.mark.parametrize("k", [1, 2, 3, 17, 64, 128])
def test_interpolation_matches_slow_reference(k: int, implementation: str) -> None:
    rng = np.random.default_rng(k)
    x = np.stack([rng.choice(P, size=k, replace=False) for _ in range(3)])
    y = rng.integers(0, 1 << 16, size=(3, k))
    fast = _field.interpolate(x, y)
    for row in range(3):
        assert fast[row].tolist() == slow_interpolate(x[row].tolist(), (y[row] % P).tolist())
    assert np.array_equal(_field.evaluate(fast, x), y % P)


def test_interpolation_is_exact_at_extreme_values(implementation: str) -> None:
    # The largest residues and patterns stress the float64 FFT and matmul exactness bounds.
    x = np.arange(P - 128, P, dtype=np.int64)[None, :]
    y = np.full((1, 128), P - 1)
    coefficients = _field.interpolate(x, y)
    assert coefficients[0].tolist() == slow_interpolate(x[0].tolist(), y[0].tolist())
    probe = [0, 1, 12345, P - 1]
    assert _field.evaluate(coefficients, np.array([probe])).tolist()[0] == [
        slow_evaluate(coefficients[0].tolist(), v) for v in probe
    ]


def test_bf16_bits_match_torch_rounding() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [
            rng.standard_normal(10_000).astype(np.float32) * 10,
            # exact ties between two bf16 values, both parities, and specials (NaN patterns
            # differ between torch builds; healthy hidden states never hold NaN)
            np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 0.0, -0.0, np.inf, -np.inf]),
        ]
    ).astype(np.float32)
    ours = toploc.bf16_bits(values)
    theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(ours, theirs)


def test_window_proof_is_258_bytes_and_round_trips() -> None:
    rng = np.random.default_rng(1)
    hidden = rng.standard_normal((70, 64)).astype(np.float32)  # 3 windows: 32, 32, 6 rows
    proof = toploc.build_proof(hidden)
    assert len(proof) == 3 * toploc.PROOF_BYTES == toploc.proof_size(70)
    assert proof[:2] == b"\xff\xd9"  # modulus 65497, big-endian, as in TOPLOC's examples
    moduli, coefficients = toploc.parse_proof(proof)
    assert moduli.tolist() == [P, P, P]
    bits = toploc.bf16_bits(hidden)
    for window, (start, stop) in enumerate(toploc.window_bounds(70)):
        flat = bits[start:stop].reshape(-1)
        top = toploc.top_k_indices(flat[None, :], toploc.TOPK)[0]
        claimed = _field.evaluate(coefficients[window : window + 1], top[None, :] % P)[0]
        assert claimed.tolist() == flat[top].astype(np.int64).tolist()
        # The committed entries are the largest by magnitude.
        magnitude = np.abs(hidden[start:stop].reshape(-1))
        assert magnitude[top].min() >= np.sort(magnitude)[-toploc.TOPK] * (1 - 2**-7)


def test_top_k_ties_go_to_the_lower_index() -> None:
    bits = toploc.bf16_bits(np.array([[1.0, -2.0, 2.0, 2.0, 0.5]], dtype=np.float32))
    assert sorted(toploc.top_k_indices(bits, 2)[0].tolist()) == [1, 2]


def test_injective_modulus_is_the_largest_that_separates() -> None:
    rng = np.random.default_rng(2)
    base = rng.choice(200_000, size=128, replace=False)
    # Force collisions modulo 65497 and 65496 so the search has to go lower.
    base[1] = base[0] + P
    base[3] = base[2] + 65496
    modulus = int(toploc.injective_moduli(base[None, :].astype(np.int64))[0])
    assert modulus < 65496
    assert len(set((base % modulus).tolist())) == 128
    for larger in range(modulus + 1, P + 1):
        assert len(set((base % larger).tolist())) < 128


def test_large_hidden_sizes_fold_indices() -> None:
    rng = np.random.default_rng(3)
    hidden = rng.standard_normal((32, 5120)).astype(np.float32)  # flat indices up to 163,840
    proof = toploc.build_proof(hidden)
    stats = toploc.verify_proof(proof, hidden)
    assert stats[0].exp_mismatches == 0
    assert stats[0].mant_err_mean == 0


def test_padded_batches_commit_exactly_like_unpadded_windows() -> None:
    rng = np.random.default_rng(4)
    bits = toploc.bf16_bits(rng.standard_normal((5, 32 * 64)).astype(np.float32))
    lengths = [32 * 64, 3 * 64, 64, 17 * 64, 32]  # the last holds fewer than k values
    padded = toploc.encode_windows(bits, lengths=lengths)
    for row, length in enumerate(lengths):
        assert padded[row] == toploc.encode_windows(bits[row : row + 1, :length])[0]


def test_identical_hidden_states_give_zero_error() -> None:
    rng = np.random.default_rng(5)
    hidden = rng.standard_normal((40, 64)).astype(np.float32)
    stats = toploc.verify_proof(toploc.build_proof(hidden), hidden)
    assert [(s.exp_mismatches, s.mant_err_mean, s.sign_mismatches) for s in stats] == [
        (0, 0, 0)
    ] * 2
    assert all(s.unexplained_mismatches == 0 for s in stats)


def test_perturbations_show_up_in_the_statistics() -> None:
    rng = np.random.default_rng(6)
    hidden = rng.standard_normal((32, 64)).astype(np.float32)
    proof = toploc.build_proof(hidden)
    slightly = hidden * (1 + 0.01 * rng.standard_normal(hidden.shape).astype(np.float32))
    small = toploc.verify_proof(proof, slightly)[0]
    assert small.exp_mismatches < 20
    assert small.mant_err_mean > 0.5
    assert small.unexplained_mismatches is not None
    assert small.unexplained_mismatches > 20
    unrelated = toploc.verify_proof(proof, rng.standard_normal((32, 64)).astype(np.float32))[0]
    assert unrelated.exp_mismatches > 100
    flipped = hidden.copy()
    flat = flipped.reshape(-1)
    top = toploc.top_k_indices(toploc.bf16_bits(flat)[None, :], 128)[0]
    flat[top[:5]] *= -1  # same magnitudes: only the sign changes
    signs = toploc.verify_proof(proof, flipped)[0]
    assert (signs.exp_mismatches, signs.mant_err_mean, signs.sign_mismatches) == (0, 0, 5)


def test_unexplained_needs_fp32_values() -> None:
    rng = np.random.default_rng(7)
    hidden = rng.standard_normal((8, 64)).astype(np.float32)
    proof = toploc.build_proof(hidden)
    as_bits = toploc.verify_proof(proof, toploc.bf16_bits(hidden))[0]
    widened = toploc.bf16_bits(hidden).astype(np.uint32) << 16
    as_widened = toploc.verify_proof(proof, widened.view(np.float32))[0]
    assert as_bits.unexplained_mismatches is None
    assert as_widened.unexplained_mismatches is None
    # A threshold that needs the figure fails closed without it.
    result = toploc.check_toploc(proof, toploc.bf16_bits(hidden), FLOAT32)
    assert not result.passed
    assert result.reason is Reason.UNEXPLAINED_MISMATCH


def test_malformed_and_mismatched_proofs_are_rejected() -> None:
    hidden = np.ones((40, 64), dtype=np.float32)
    proof = toploc.build_proof(hidden)
    with pytest.raises(toploc.ProofFormatError):
        toploc.parse_proof(proof[:-1])
    with pytest.raises(toploc.ProofFormatError):
        toploc.verify_proof(proof, hidden[:20])  # one window's worth of rows, two windows given
    result = toploc.check_toploc(proof[:100], hidden, FLOAT32)
    assert (result.passed, result.reason) == (False, Reason.PROOF_MALFORMED)
    # Moduli no prover searches (it goes from 65497 down to 2**15) are malformed: otherwise
    # equivalent proofs could differ, and with them their digests.
    null = b"\x00" * toploc.PROOF_BYTES * 2
    with pytest.raises(toploc.ProofFormatError, match="modulus 0"):
        toploc.verify_proof(null, hidden)
    for modulus in (65535, 65498, (1 << 15) - 1):
        stray = modulus.to_bytes(2, "big") + proof[2:]
        with pytest.raises(toploc.ProofFormatError, match=f"window 0 has modulus {modulus}"):
            toploc.verify_proof(stray, hidden)
    floor = (1 << 15).to_bytes(2, "big") + proof[2:]
    assert len(toploc.verify_proof(floor, hidden)) == 2  # well-formed (its statistics differ)
    # A proof of the wrong size is refused from its length, before it is parsed: a hostile one
    # may be as large as the blob (here 2**18 windows' worth, ~68 MB, costs nothing).
    huge = proof * (1 << 17)
    [error] = toploc.verify_proofs([huge], [hidden])
    assert isinstance(error, toploc.ProofFormatError)
    assert f"proof has {len(huge)} bytes" in str(error)


def test_vanishing_polynomial_for_every_window_size() -> None:
    # Covers the closed-form first levels of the product tree with every padding pattern.
    rng = np.random.default_rng(8)
    for k in range(1, 41):
        x = np.stack([rng.choice(P, size=k, replace=False) for _ in range(2)]).astype(np.int64)
        m = _field.vanishing_polynomial(x)
        assert m.shape == (2, k + 1)
        assert np.all(m[:, k] == 1)
        assert np.all(_field.evaluate(m, x) == 0)
