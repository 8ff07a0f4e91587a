"""The blob store on its own: the cache of recent blobs serves exactly the file's bytes, stays
within its budget, and never holds a blob that is not durable on disk."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import blake3
import pytest

from rollnet.reference.coordinator.blobstore import (
    BlobDigestMismatch,
    BlobSizeMismatch,
    BlobStore,
)


async def _chunks(data: bytes, size: int = 7) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def _files(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file()]


async def _store(store: BlobStore, data: bytes) -> bytes:
    digest = blake3.blake3(data).digest()
    stored = await store.write(digest, len(data), _chunks(data))
    assert stored.size == len(data)
    return digest


async def test_ranges_from_the_cache_match_the_file(tmp_path: Path) -> None:
    store = BlobStore(tmp_path, max_bytes=1 << 20, cache_bytes=1 << 10, cache_blob_bytes=256)
    data = bytes(range(200))
    digest = await _store(store, data)
    cold = BlobStore(tmp_path, max_bytes=1 << 20, cache_bytes=0)  # reads the file every time
    for offset, length in [(0, 0), (0, 10), (195, 10), (200, 5), (250, 0), (13, 0)]:
        assert store.read_range(digest, offset, length) == cold.read_range(digest, offset, length)
    assert store.path_of(digest).read_bytes() == data
    assert store.location_of(digest) == f"{digest.hex()[:2]}/{digest.hex()}"


async def test_the_cache_keeps_to_its_budget_and_large_blobs_stay_on_disk(tmp_path: Path) -> None:
    store = BlobStore(tmp_path, max_bytes=1 << 20, cache_bytes=500, cache_blob_bytes=200)
    small = [await _store(store, bytes([i]) * 150) for i in range(5)]
    large = await _store(store, b"L" * 300)
    assert store.cache_limit == 500
    assert store.cached_bytes == 3 * 150  # full: the two oldest evicted
    assert large not in store._cache
    assert small[-1] in store._cache
    assert small[0] not in store._cache  # evicted, oldest first
    for i, digest in enumerate(small):
        assert store.read_range(digest, 0, 0) == (150, bytes([i]) * 150)
    assert store.read_range(large, 290, 0) == (300, b"L" * 10)
    # An operator's 0 keeps nothing in memory; reads come from the files.
    none = BlobStore(tmp_path / "none", max_bytes=1 << 20, cache_bytes=0)
    empty = await _store(none, b"")
    first = await _store(none, b"x" * 10)
    assert none.cached_bytes == 0
    assert not none._cache
    assert none.read_range(first, 0, 0) == (10, b"x" * 10)
    assert none.read_range(empty, 0, 0) == (0, b"")
    assert not none._cache


@pytest.mark.parametrize("cache_blob_bytes", [1 << 20, 4], ids=["gathered", "streamed"])
async def test_a_refused_upload_leaves_nothing_behind(
    tmp_path: Path, cache_blob_bytes: int
) -> None:
    store = BlobStore(tmp_path, max_bytes=1 << 20, cache_blob_bytes=cache_blob_bytes)
    data = b"honest bytes"
    digest = blake3.blake3(data).digest()
    with pytest.raises(BlobDigestMismatch):
        await store.write(blake3.blake3(b"other").digest(), len(data), _chunks(data))
    with pytest.raises(BlobSizeMismatch, match="more than the declared"):
        await store.write(digest, len(data) - 1, _chunks(data))
    with pytest.raises(BlobSizeMismatch, match="received 12 bytes, declared 13"):
        await store.write(digest, len(data) + 1, _chunks(data))
    assert not store.exists(blake3.blake3(b"other").digest())
    assert not store.exists(digest)
    assert not store._cache
    assert _files(tmp_path) == []
    assert not (await store.write(digest, len(data), _chunks(data))).already_present
    assert store.path_of(digest).read_bytes() == data
    assert [p.name for p in _files(tmp_path)] == [digest.hex()]


async def test_duplicates_are_free_and_a_removed_directory_is_made_again(tmp_path: Path) -> None:
    store = BlobStore(tmp_path, max_bytes=1 << 20)
    data = b"same content"
    digest = await _store(store, data)
    again = await store.write(digest, len(data), _chunks(data))
    assert again.already_present
    shutil.rmtree(store.path_of(digest).parent)
    fresh = BlobStore(tmp_path, max_bytes=1 << 20)
    fresh._made_dirs = set(store._made_dirs)  # it believes the directory still exists
    assert not (await fresh.write(digest, len(data), _chunks(data))).already_present
    assert fresh.path_of(digest).read_bytes() == data
