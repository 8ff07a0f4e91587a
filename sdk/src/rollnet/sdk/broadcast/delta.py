"""Lossless sparse deltas between two versions of a checkpoint file (``rollnet-delta-v1``).

Between consecutive RL steps most bf16 weights keep every bit (PULSE, arXiv 2602.03839), so a
step can ship only the elements that changed. A delta turns the *base* file (step k-1, already on
the node) into the *target* file (step k); the manifest signs the target's BLAKE3, and the
client checks it after applying, so a wrong or hostile delta can cost a download, never a wrong
file.

The target is cut into segments that tile it in order:

* **patch** segments take the base's bytes at ``base_offset`` and replace the words (elements of
  ``word`` bytes: 2 for bf16, 4 for float32, 1 for anything else) whose bits differ. The changed
  word indices are stored as gaps (first index, then differences) and the XOR of each changed
  word with its old value follows (a small update flips low bits only), each array
  byte-shuffled (all first bytes, then all second bytes, ...) so zstd sees the runs;
* **literal** segments carry their bytes (a safetensors header that changed, padding, a tensor
  that has no counterpart in the base).

For a safetensors file each tensor of the target that the base has too, with the same dtype and
byte length, is one patch segment with the dtype's width; other files are one patch segment
with ``word`` 1 when the sizes agree, and a literal otherwise.

Layout of a delta blob: ``MAGIC``, then one zstd frame holding a little-endian ``u32`` header
length, the header (JSON: ``base_size``, ``size``, ``segments``), then for each patch segment its
gaps (``count`` little-endian ``u32``, byte-shuffled) and its flips (new XOR old, ``count *
word`` bytes, little-endian, byte-shuffled), and for each literal segment its bytes. Segments of
more than 2^32 - 1 words are split, so every gap fits in a ``u32``.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

MAGIC = b"RNDELTA1"
"""The first bytes of every ``rollnet-delta-v1`` blob."""

ENCODING = "rollnet-delta-v1"
"""The encoding's name (``DELTA_ENCODING_SPARSE_ZSTD_V1`` in the manifest)."""

_WORDS = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "U32": 4, "I16": 2, "U16": 2, "F64": 8}
_NUMPY = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_MAX_WORDS_PER_SEGMENT = 2**32 - 1
_HEADER_CAP = 64 * 1024 * 1024
_SAFETENSORS_HEADER_CAP = 100 * 1024 * 1024
_ZSTD_LEVEL = 3


class DeltaError(ValueError):
    """A delta does not parse, does not fit its base, or would exceed its declared size."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One piece of the target: a patch of the base, or literal bytes."""

    offset: int
    """Where it starts in the target."""
    length: int
    """Its length in bytes."""
    base_offset: int | None = None
    """Where its bytes start in the base (patch); ``None`` for a literal."""
    word: int = 1
    """Bytes per compared element (patch)."""


@dataclass(frozen=True, slots=True)
class DeltaStats:
    """What :func:`encode_delta` found."""

    size: int
    """Bytes of the target file."""
    patched_words: int
    """Words compared against the base."""
    changed_words: int
    """Of those, the ones whose bits differ."""
    literal_bytes: int
    """Bytes carried as they are."""
    delta_bytes: int
    """Bytes of the delta blob."""

    @property
    def unchanged_fraction(self) -> float:
        """Share of compared words that kept every bit (1.0 when nothing was compared)."""
        if self.patched_words == 0:
            return 1.0
        return 1.0 - self.changed_words / self.patched_words


def _safetensors_layout(data: np.ndarray) -> tuple[int, dict[str, tuple[str, int, int]]] | None:
    """``(data start, {name: (dtype, start, end)})`` of a safetensors file, or ``None``."""
    if data.size < 8:
        return None
    (length,) = struct.unpack("<Q", data[:8].tobytes())
    if length > _SAFETENSORS_HEADER_CAP or 8 + length > data.size:
        return None
    try:
        header = json.loads(data[8 : 8 + length].tobytes())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(header, dict):
        return None
    start = 8 + length
    tensors: dict[str, tuple[str, int, int]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            return None
        dtype, offsets = entry.get("dtype"), entry.get("data_offsets")
        if (
            not isinstance(dtype, str)
            or not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
        ):
            return None
        begin, end = start + offsets[0], start + offsets[1]
        if not start <= begin <= end <= data.size:
            return None
        tensors[name] = (dtype, begin, end)
    return start, tensors


def plan_segments(base: np.ndarray, target: np.ndarray) -> list[Segment]:
    """Segments tiling ``target`` (uint8 arrays), patching ``base`` wherever it lines up."""
    size = int(target.size)
    target_layout = _safetensors_layout(target)
    base_layout = _safetensors_layout(base)
    patches: list[Segment] = []
    if target_layout is not None and base_layout is not None:
        header_end, tensors = target_layout
        base_header_end, base_tensors = base_layout
        if header_end == base_header_end:
            patches.append(Segment(0, header_end, 0, 1))
        for name, (dtype, begin, end) in sorted(tensors.items(), key=lambda kv: kv[1][1]):
            found = base_tensors.get(name)
            if found is None or found[0] != dtype or found[2] - found[1] != end - begin:
                continue
            word = _WORDS.get(dtype, 1)
            if (end - begin) % word:
                word = 1
            patches.append(Segment(begin, end - begin, found[1], word))
    elif base.size == size:
        patches.append(Segment(0, size, 0, 1))
    # Drop overlaps (a malformed but parseable header), then fill the gaps with literals, and
    # split patches too long for u32 gaps.
    segments: list[Segment] = []
    position = 0
    for patch in patches:
        if patch.length == 0 or patch.offset < position:
            continue
        if patch.offset > position:
            segments.append(Segment(position, patch.offset - position))
        assert patch.base_offset is not None
        step = _MAX_WORDS_PER_SEGMENT * patch.word
        for start in range(0, patch.length, step):
            length = min(step, patch.length - start)
            segments.append(
                Segment(patch.offset + start, length, patch.base_offset + start, patch.word)
            )
        position = patch.offset + patch.length
    if position < size:
        segments.append(Segment(position, size - position))
    return segments


def _shuffle(array: np.ndarray, word: int) -> bytes:
    return array.view(np.uint8).reshape(-1, word).T.tobytes()


def _unshuffle(raw: bytes, word: int) -> np.ndarray:
    return np.frombuffer(raw, np.uint8).reshape(word, -1).T.copy()


def _read(path: Path) -> np.ndarray:
    size = path.stat().st_size
    if size == 0:
        return np.zeros(0, np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r")


def encode_delta(base_path: Path, target_path: Path, out_path: Path) -> DeltaStats:
    """Write the delta turning ``base_path`` into ``target_path`` to ``out_path``."""
    base = _read(base_path)
    target = _read(target_path)
    segments = plan_segments(base, target)
    header: list[dict[str, int]] = []
    patched = changed = literal = 0
    pieces: list[bytes] = []
    for segment in segments:
        new = target[segment.offset : segment.offset + segment.length]
        if segment.base_offset is None:
            header.append({"offset": segment.offset, "length": segment.length})
            pieces.append(new.tobytes())
            literal += segment.length
            continue
        kind = _NUMPY[segment.word]
        old = base[segment.base_offset : segment.base_offset + segment.length]
        new_words = new.view(kind)
        where = np.flatnonzero(old.view(kind) != new_words)
        gaps = np.diff(where, prepend=0).astype("<u4") if where.size else np.zeros(0, "<u4")
        if where.size:
            gaps[0] = where[0]
        header.append(
            {
                "offset": segment.offset,
                "length": segment.length,
                "base_offset": segment.base_offset,
                "word": segment.word,
                "count": int(where.size),
            }
        )
        pieces.append(_shuffle(gaps, 4))
        # The XOR with the old word: a weight nudged by a few units in the last place differs
        # in its low bits only, so the shuffled high bytes are nearly all zero.
        flips = new_words[where] ^ old.view(kind)[where]
        pieces.append(_shuffle(flips.astype(flips.dtype.newbyteorder("<")), segment.word))
        patched += segment.length // segment.word
        changed += int(where.size)
    head = json.dumps(
        {"base_size": int(base.size), "size": int(target.size), "segments": header},
        separators=(",", ":"),
    ).encode()
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    compressor = zstandard.ZstdCompressor(level=_ZSTD_LEVEL, threads=0)
    with open(tmp, "wb") as handle:
        handle.write(MAGIC)
        with compressor.stream_writer(handle, closefd=False) as writer:
            writer.write(struct.pack("<I", len(head)))
            writer.write(head)
            for piece in pieces:
                writer.write(piece)
    os.replace(tmp, out_path)
    return DeltaStats(
        size=int(target.size),
        patched_words=patched,
        changed_words=changed,
        literal_bytes=literal,
        delta_bytes=out_path.stat().st_size,
    )


class _Reader:
    """Exact reads from a zstd stream, never past ``limit`` bytes in all."""

    def __init__(self, stream: Any, limit: int) -> None:
        self._stream = stream
        self._left = limit

    def read(self, size: int, what: str) -> bytes:
        if size > self._left:
            raise DeltaError(f"{what}: the delta is larger than its target allows")
        chunks = []
        wanted = size
        while wanted:
            chunk = self._stream.read(min(wanted, 1 << 24))
            if not chunk:
                raise DeltaError(f"{what}: the delta ends early")
            chunks.append(chunk)
            wanted -= len(chunk)
        self._left -= size
        return b"".join(chunks)

    def at_end(self) -> bool:
        return not self._stream.read(1)


def _segments_from(header: Any, base_size: int, size: int) -> Iterator[dict[str, int]]:
    if not isinstance(header, dict) or not isinstance(header.get("segments"), list):
        raise DeltaError("header: not an object with a list of segments")
    if header.get("base_size") != base_size:
        raise DeltaError(
            f"header: made for a base of {header.get('base_size')} bytes, this one has {base_size}"
        )
    if header.get("size") != size:
        raise DeltaError(f"header: makes {header.get('size')} bytes, the manifest says {size}")
    position = 0
    for index, segment in enumerate(header["segments"]):
        where = f"segments[{index}]"
        if not isinstance(segment, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in segment.values()
        ):
            raise DeltaError(f"{where}: not an object of non-negative integers")
        if segment.get("offset") != position or "length" not in segment:
            raise DeltaError(f"{where}: does not start where the one before ends ({position})")
        length = segment["length"]
        if "base_offset" in segment:
            word, count = segment.get("word", 0), segment.get("count", -1)
            if word not in _NUMPY or length % word or not 0 <= count <= length // word:
                raise DeltaError(f"{where}: bad word size or count")
            if segment["base_offset"] + length > base_size:
                raise DeltaError(f"{where}: reaches past the end of the base")
        position += length
        if position > size:
            raise DeltaError(f"{where}: reaches past the target's size")
        yield segment
    if position != size:
        raise DeltaError(f"segments: cover {position} of {size} bytes")


def apply_delta(base_path: Path, delta_path: Path, out_path: Path, *, size: int) -> None:
    """Write the target of ``delta_path`` applied to ``base_path`` to ``out_path``.

    ``size`` is the target's size from the signed manifest; the delta may not make anything else
    nor decompress to more than the target plus its index arrays. The caller checks the BLAKE3
    of ``out_path`` against the manifest. Raises :class:`DeltaError`.
    """
    base = _read(base_path)
    with open(delta_path, "rb") as handle:
        if handle.read(len(MAGIC)) != MAGIC:
            raise DeltaError("not a rollnet-delta-v1 blob (bad magic)")
        # Gaps (4 bytes each) plus new words (>= 1 byte each) cost at most 5x the target.
        limit = 4 + _HEADER_CAP + 5 * size
        try:
            with zstandard.ZstdDecompressor().stream_reader(handle) as stream:
                reader = _Reader(stream, limit)
                (head_len,) = struct.unpack("<I", reader.read(4, "header length"))
                if head_len > _HEADER_CAP:
                    raise DeltaError(f"header: {head_len} bytes is implausible")
                try:
                    header = json.loads(reader.read(head_len, "header"))
                except (UnicodeDecodeError, json.JSONDecodeError) as error:
                    raise DeltaError(f"header: not JSON: {error}") from error
                tmp = out_path.with_name(f".{out_path.name}.tmp")
                try:
                    _write_target(tmp, base, reader, header, size)
                    if not reader.at_end():
                        raise DeltaError("trailing bytes after the last segment")
                except BaseException:
                    tmp.unlink(missing_ok=True)
                    raise
        except zstandard.ZstdError as error:
            raise DeltaError(f"zstd: {error}") from error
    os.replace(tmp, out_path)


def _write_target(tmp: Path, base: np.ndarray, reader: _Reader, header: Any, size: int) -> None:
    with open(tmp, "wb") as out:
        for index, segment in enumerate(_segments_from(header, int(base.size), size)):
            length = segment["length"]
            if "base_offset" not in segment:
                out.write(reader.read(length, f"segments[{index}]"))
                continue
            word, count = segment["word"], segment["count"]
            kind = _NUMPY[word]
            start = segment["base_offset"]
            words = np.array(base[start : start + length]).view(kind)
            gaps = _unshuffle(reader.read(4 * count, f"segments[{index}] gaps"), 4)
            values = _unshuffle(reader.read(word * count, f"segments[{index}] words"), word)
            if count:
                where = np.cumsum(gaps.view("<u4").ravel(), dtype=np.uint64)
                if where[-1] >= words.size or (count > 1 and not np.all(gaps.view("<u4")[1:] > 0)):
                    raise DeltaError(f"segments[{index}]: indices out of order or out of range")
                at = where.astype(np.int64)
                words[at] ^= values.view(np.dtype(kind).newbyteorder("<")).ravel().astype(kind)
            out.write(words.tobytes())
