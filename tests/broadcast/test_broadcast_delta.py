"""rollnet-delta-v1: lossless on the reference trainer's steps, small on them, and refused when
it does not fit (wrong base, truncated, tampered, a decompression bomb)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import blake3
import numpy as np
import pytest
import zstandard

from rollnet.reference.trainer.synthetic_steps import write_trainer_steps
from rollnet.sdk.broadcast.delta import MAGIC, DeltaError, apply_delta, encode_delta


def _safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str = "BF16") -> None:
    header: dict[str, object] = {}
    offset = 0
    blobs = []
    for name, array in tensors.items():
        raw = array.tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@pytest.fixture(scope="module")
def steps(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_trainer_steps(tmp_path_factory.mktemp("steps"), 3)


@pytest.mark.slow
def test_chain_of_real_steps_is_bit_identical_and_small(steps: list[Path], tmp_path: Path) -> None:
    current = steps[0] / "model.safetensors"
    for number, directory in enumerate(steps[1:], start=1):
        target = directory / "model.safetensors"
        delta = tmp_path / f"{number}.delta"
        stats = encode_delta(current, target, delta)
        rebuilt = tmp_path / f"rebuilt-{number}.safetensors"
        apply_delta(current, delta, rebuilt, size=target.stat().st_size)
        assert (
            blake3.blake3(rebuilt.read_bytes()).digest()
            == blake3.blake3(target.read_bytes()).digest()
        )
        # The trainer's steps at its defaults (lr 1e-6) leave nearly every bf16 weight as it was.
        assert stats.unchanged_fraction > 0.9, stats
        assert stats.delta_bytes * 10 < stats.size, stats
        current = rebuilt  # the chain goes on from the rebuilt file, as a node's would


def test_every_changed_word_and_layout_change(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2**16, 1000, dtype=np.uint16)
    b = a.copy()
    b[[0, 1, 999]] ^= 1  # first, adjacent and last elements
    base, target = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    _safetensors(base, {"w": a, "gone": a[:10]})
    _safetensors(target, {"w": b, "new": a[:7]})
    stats = encode_delta(base, target, tmp_path / "d")
    apply_delta(base, tmp_path / "d", tmp_path / "out", size=target.stat().st_size)
    assert (tmp_path / "out").read_bytes() == target.read_bytes()
    assert stats.changed_words == 3
    assert stats.literal_bytes > 0  # the header changed and "new" has no counterpart


def test_other_files_and_sizes(tmp_path: Path) -> None:
    base, target = tmp_path / "a.json", tmp_path / "b.json"
    for old, new in [
        (b'{"a": 1}', b'{"a": 2}'),
        (b"short", b"longer text"),
        (b"", b"x"),
        (b"x", b""),
    ]:
        base.write_bytes(old)
        target.write_bytes(new)
        encode_delta(base, target, tmp_path / "d")
        apply_delta(base, tmp_path / "d", tmp_path / "out", size=len(new))
        assert (tmp_path / "out").read_bytes() == new


def _frame(header: object, body: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return MAGIC + zstandard.ZstdCompressor().compress(struct.pack("<I", len(head)) + head + body)


@pytest.mark.parametrize(
    ("blob", "match"),
    [
        (b"not a delta", "bad magic"),
        (MAGIC + b"garbage", "zstd"),
        (_frame({"base_size": 3, "size": 4, "segments": []}), "made for a base of 3"),
        (_frame({"base_size": 4, "size": 5, "segments": []}), "manifest says 4"),
        (
            _frame({"base_size": 4, "size": 4, "segments": [{"offset": 1, "length": 4}]}),
            "does not start",
        ),
        (
            _frame({"base_size": 4, "size": 4, "segments": [{"offset": 0, "length": 2}]}),
            "ends early",
        ),
        (
            _frame(
                {
                    "base_size": 4,
                    "size": 4,
                    "segments": [
                        {"offset": 0, "length": 4, "base_offset": 2, "word": 1, "count": 0}
                    ],
                }
            ),
            "past the end of the base",
        ),
        (
            _frame(
                {
                    "base_size": 4,
                    "size": 4,
                    "segments": [
                        {"offset": 0, "length": 4, "base_offset": 0, "word": 1, "count": 1}
                    ],
                },
                struct.pack("<I", 9) + b"z",
            ),
            "out of range",
        ),
        (
            _frame(
                {"base_size": 4, "size": 4, "segments": [{"offset": 0, "length": 4}]}, b"abcdEXTRA"
            ),
            "trailing",
        ),
        (MAGIC + zstandard.ZstdCompressor().compress(struct.pack("<I", 2**30)), "implausible"),
    ],
)
def test_bad_deltas_are_refused(tmp_path: Path, blob: bytes, match: str) -> None:
    base = tmp_path / "base"
    base.write_bytes(b"abcd")
    (tmp_path / "d").write_bytes(blob)
    with pytest.raises(DeltaError, match=match):
        apply_delta(base, tmp_path / "d", tmp_path / "out", size=4)
    assert not (tmp_path / "out").exists()
