"""Each byte of a checkpoint is read once by the publisher and hashed once per digest it feeds,
with storing overlapped with hashing; a client hashes each shard once (as it arrives) and never
the whole file: the signed manifest lists every shard of it, in order, with digest and size."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import blake3
import pytest
from broadcast_testing import model_dir, publish_to_origin

import rollnet.reference.checkpoint_publishing as publishing
import rollnet.sdk.checkpoints as store_module
from rollnet.reference.checkpoint_publishing import build_manifest, plan_shards
from rollnet.reference.relay import RelayConfig, RelayServer, start_relay
from rollnet.sdk.broadcast import RelayShards
from rollnet.sdk.checkpoints import (
    CheckpointStore,
    CheckpointVerificationError,
    FallbackShards,
)
from rollnet.sdk.identity import Identity
from rollnet.sdk.testing import NETWORK_ID
from rollnet.v1 import common_pb2

SHARD = 64 * 1024


@pytest.fixture
async def relays() -> AsyncIterator[list[RelayServer]]:
    started: list[RelayServer] = []
    yield started
    for relay in started:
        await relay.close()


def expected_refs(path: Path, shard_size: int) -> tuple[list[bytes], bytes]:
    data = path.read_bytes()
    shards = [
        blake3.blake3(data[offset : offset + shard_size]).digest()
        for offset in range(0, len(data), shard_size)
    ]
    return shards, blake3.blake3(data).digest()


async def test_publishing_reads_each_byte_once_and_the_digests_are_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = model_dir(tmp_path / "model", os.urandom(5 * SHARD + 123))
    read: list[tuple[str, int, int]] = []
    real_read = publishing.read_shard

    def counting_read(shard: publishing.ShardPlan) -> bytes:
        read.append((shard.path.name, shard.offset, shard.size))
        return real_read(shard)

    monkeypatch.setattr(publishing, "read_shard", counting_read)
    stored: dict[bytes, bytes] = {}

    async def sink(data: bytes, digest: bytes) -> bool:
        stored[digest] = data
        return False

    manifest, counts = await build_manifest(source, 1, NETWORK_ID, sink, shard_size=SHARD)
    for item in manifest.files:
        shards, whole = expected_refs(source / item.path, SHARD)
        assert [s.blake3 for s in item.shards] == shards
        assert item.content.blake3 == whole
        assert item.content.size == (source / item.path).stat().st_size
    # Every shard read exactly once, nothing else read.
    planned = [
        (p.path.name, p.offset, p.size)
        for name in ("config.json", "model.safetensors", "tokenizer.json")
        for p in plan_shards(source / name, SHARD)
    ]
    assert sorted(read) == sorted(planned)
    assert counts.shards == len(planned) == len(stored)
    assert all(blake3.blake3(data).digest() == digest for digest, data in stored.items())


async def test_storing_a_shard_overlaps_reading_and_hashing_the_next(tmp_path: Path) -> None:
    source = model_dir(tmp_path / "model", os.urandom(4 * SHARD))
    weights = source / "model.safetensors"
    next_read = threading.Event()
    real_read = publishing.read_shard

    def watching_read(shard: publishing.ShardPlan) -> bytes:
        if shard.path == weights and shard.offset == SHARD:
            next_read.set()
        return real_read(shard)

    waited: list[bytes] = []

    async def slow_sink(data: bytes, digest: bytes) -> bool:
        if len(data) == SHARD and not waited:  # the weights' first shard (the others are small)
            waited.append(digest)
            # Storing it finishes only once the second shard has been read: a publisher that
            # stores before it reads on would wait here until the deadline.
            assert await asyncio.to_thread(next_read.wait, 20.0), "the next shard was not read"
        return False

    mp = pytest.MonkeyPatch()
    mp.setattr(publishing, "read_shard", watching_read)
    try:
        manifest, _ = await build_manifest(source, 1, NETWORK_ID, slow_sink, shard_size=SHARD)
    finally:
        mp.undo()
    assert next_read.is_set()
    assert len(waited) == 1
    assert len(next(f for f in manifest.files if f.path == "model.safetensors").shards) == 5


async def test_a_client_hashes_each_shard_once_and_never_reads_a_file_back(
    tmp_path: Path, relays: list[RelayServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = Identity.generate()
    source = model_dir(tmp_path / "model", os.urandom(6 * SHARD))
    checkpoint = await publish_to_origin(tmp_path / "origin", source, 1, trainer, shard_size=SHARD)
    origin = await start_relay(RelayConfig(data_dir=tmp_path / "origin"))
    relays.append(origin)
    rehashed: list[str] = []
    real_bytes, real_file = store_module._digest_of_bytes, store_module._digest_of

    def digest_of_bytes(data: bytes) -> bytes:
        rehashed.append(f"{len(data)} bytes")
        return real_bytes(data)

    def digest_of(path: Path) -> bytes:
        rehashed.append(path.name)
        return real_file(path)

    monkeypatch.setattr(store_module, "_digest_of_bytes", digest_of_bytes)
    monkeypatch.setattr(store_module, "_digest_of", digest_of)

    store = CheckpointStore(tmp_path / "client", network_id=NETWORK_ID)
    async with RelayShards([origin.url]) as shards:
        directory = await store.ensure(checkpoint, shards)
        received = shards.received_bytes
    assert rehashed == []  # the store trusted RelayShards' check and hashed no file whole
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (directory / name).read_bytes() == (source / name).read_bytes()
    assert received == sum(f.stat().st_size for f in source.iterdir())


class WrongBytes:
    """A source that checks nothing and serves zeros."""

    async def fetch_shard(self, shard: common_pb2.BlobRef) -> bytes:
        return bytes(shard.size)


class Served:
    """A source that checks nothing and serves the right bytes."""

    def __init__(self, blobs: dict[bytes, bytes]) -> None:
        self.blobs = blobs
        self.asked = 0

    async def fetch_shard(self, shard: common_pb2.BlobRef) -> bytes:
        self.asked += 1
        return self.blobs[shard.blake3]


async def test_sources_that_do_not_check_are_checked_and_fall_back(tmp_path: Path) -> None:
    trainer = Identity.generate()
    source = model_dir(tmp_path / "model", os.urandom(3 * SHARD))
    checkpoint = await publish_to_origin(tmp_path / "origin", source, 1, trainer, shard_size=SHARD)
    blobs = {
        bytes.fromhex(path.name): path.read_bytes()
        for path in (tmp_path / "origin" / "blobs").iterdir()
    }
    with pytest.raises(CheckpointVerificationError, match="does not match"):
        await CheckpointStore(tmp_path / "a", network_id=NETWORK_ID).ensure(
            checkpoint, WrongBytes()
        )
    good = Served(blobs)
    # Wrong bytes from the primary are caught and the fallback asked, shard by shard.
    directory = await CheckpointStore(tmp_path / "b", network_id=NETWORK_ID).ensure(
        checkpoint, FallbackShards(WrongBytes(), good)
    )
    assert (directory / "model.safetensors").read_bytes() == (
        source / "model.safetensors"
    ).read_bytes()
    assert good.asked == len(blobs)


async def test_shards_far_out_of_order_still_give_the_right_file(tmp_path: Path) -> None:
    trainer = Identity.generate()
    source = model_dir(tmp_path / "model", os.urandom(12 * SHARD))
    checkpoint = await publish_to_origin(tmp_path / "origin", source, 1, trainer, shard_size=SHARD)
    blobs = {
        bytes.fromhex(path.name): path.read_bytes()
        for path in (tmp_path / "origin" / "blobs").iterdir()
    }
    weights = next(
        item
        for item in store_module.verify_checkpoint(checkpoint, network_id=NETWORK_ID).files
        if item.path == "model.safetensors"
    )
    first = weights.shards[0].blake3
    rest_done = asyncio.Event()
    others = {s.blake3 for s in weights.shards[1:]}
    served: set[bytes] = set()

    class FirstShardLast:
        async def fetch_shard(self, shard: common_pb2.BlobRef) -> bytes:
            if shard.blake3 == first:
                await rest_done.wait()
            served.add(shard.blake3)
            if others <= served:
                rest_done.set()
            return blobs[shard.blake3]

    store = CheckpointStore(tmp_path / "client", network_id=NETWORK_ID, concurrency=4)
    directory = await store.ensure(checkpoint, FirstShardLast())
    assert (directory / "model.safetensors").read_bytes() == (
        source / "model.safetensors"
    ).read_bytes()


_BLAKE3 = blake3.blake3


class CountingBlake3:
    """``blake3.blake3`` counting the bytes it hashes."""

    AUTO = _BLAKE3.AUTO
    hashed = 0

    def __init__(self, data: bytes = b"", **options: object) -> None:
        self._inner = _BLAKE3(**options)  # type: ignore[arg-type]
        self.update(data)

    def update(self, data: bytes) -> None:
        CountingBlake3.hashed += len(data)
        self._inner.update(data)

    def digest(self) -> bytes:
        return bytes(self._inner.digest())

    def hexdigest(self) -> str:
        return str(self._inner.hexdigest())


async def test_a_file_whose_shards_verify_is_not_hashed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store hashes each shard once and never a whole file: shard digests and layout are
    signed, so verified shards make the file the publisher hashed."""
    trainer = Identity.generate()
    source = model_dir(tmp_path / "model", os.urandom(6 * SHARD + 17))
    checkpoint = await publish_to_origin(tmp_path / "origin", source, 1, trainer, shard_size=SHARD)
    blobs = {
        bytes.fromhex(path.name): path.read_bytes()
        for path in (tmp_path / "origin" / "blobs").iterdir()
    }
    monkeypatch.setattr(blake3, "blake3", CountingBlake3)  # the store's too
    CountingBlake3.hashed = 0
    directory = await CheckpointStore(tmp_path / "client", network_id=NETWORK_ID).ensure(
        checkpoint, Served(blobs)
    )
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (directory / name).read_bytes() == (source / name).read_bytes()
    shard_bytes = sum(f.stat().st_size for f in source.iterdir())
    # Each shard once (a source that does not check), plus the short names of partial files.
    assert shard_bytes <= CountingBlake3.hashed < shard_bytes + 4096


async def test_a_shard_with_a_bad_digest_is_refused_though_the_file_is_not_hashed(
    tmp_path: Path,
) -> None:
    """One wrong shard among right ones (the file is never hashed whole): refused."""
    trainer = Identity.generate()
    source = model_dir(tmp_path / "model", os.urandom(4 * SHARD))
    checkpoint = await publish_to_origin(tmp_path / "origin", source, 1, trainer, shard_size=SHARD)
    blobs = {
        bytes.fromhex(path.name): path.read_bytes()
        for path in (tmp_path / "origin" / "blobs").iterdir()
    }
    weights = next(
        item
        for item in store_module.verify_checkpoint(checkpoint, network_id=NETWORK_ID).files
        if item.path == "model.safetensors"
    )
    third = weights.shards[2].blake3
    blobs[third] = blobs[third][:-1] + bytes([blobs[third][-1] ^ 1])
    with pytest.raises(CheckpointVerificationError, match=third.hex()):
        await CheckpointStore(tmp_path / "client", network_id=NETWORK_ID).ensure(
            checkpoint, Served(blobs)
        )
    assert not (tmp_path / "client" / "step-1").exists()


async def test_a_file_is_its_signed_shards(tmp_path: Path) -> None:
    """A manifest whose file digest is not its shards' concatenation can only come from a broken
    trainer (it is signed). The store writes the signed shards, every one checked, and does not
    hash the file to compare (what a wrong whole-file digest still breaks is the file's use as a
    delta base: a delta applied to it fails its own check and the full shards are fetched)."""
    trainer = Identity.generate()
    source = model_dir(tmp_path / "model", os.urandom(3 * SHARD))

    blobs: dict[bytes, bytes] = {}

    async def sink(data: bytes, digest: bytes) -> bool:
        blobs[digest] = data
        return False

    manifest, _ = await build_manifest(source, 1, NETWORK_ID, sink, shard_size=SHARD)
    weights = next(item for item in manifest.files if item.path == "model.safetensors")
    weights.content.blake3 = bytes(32)
    checkpoint = publishing.signed_checkpoint(trainer, manifest)
    directory = await CheckpointStore(tmp_path / "client", network_id=NETWORK_ID).ensure(
        checkpoint, Served(blobs)
    )
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (directory / name).read_bytes() == (source / name).read_bytes()
    # Where the manifest itself says what the digest is (a file of one shard is that shard, an
    # empty file has the empty digest), a wrong one is refused before anything is fetched.
    config = next(item for item in manifest.files if item.path == "config.json")
    config.content.blake3 = bytes(32)
    with pytest.raises(CheckpointVerificationError, match=r"config\.json: file digest"):
        await CheckpointStore(tmp_path / "other", network_id=NETWORK_ID).ensure(
            publishing.signed_checkpoint(trainer, manifest), Served(blobs)
        )


async def test_wrong_bytes_a_relay_streamed_into_the_file_are_written_over(
    tmp_path: Path, relays: list[RelayServer]
) -> None:
    """Shards go to the file as they arrive, before their digest is known: a relay whose bytes
    fail it leaves them there, and the fallback's right bytes replace them."""
    trainer = Identity.generate()
    source = model_dir(tmp_path / "model", os.urandom(4 * SHARD))
    checkpoint = await publish_to_origin(tmp_path / "origin", source, 1, trainer, shard_size=SHARD)
    blobs = {
        bytes.fromhex(path.name): path.read_bytes()
        for path in (tmp_path / "origin" / "blobs").iterdir()
    }
    weights = next(
        item
        for item in store_module.verify_checkpoint(checkpoint, network_id=NETWORK_ID).files
        if item.path == "model.safetensors"
    )
    victim = weights.shards[2]
    (tmp_path / "origin" / "blobs" / victim.blake3.hex()).write_bytes(bytes(victim.size))
    origin = await start_relay(RelayConfig(data_dir=tmp_path / "origin"))
    relays.append(origin)
    fallback = Served(blobs)
    store = CheckpointStore(tmp_path / "client", network_id=NETWORK_ID)
    async with RelayShards([origin.url], attempts_per_relay=1) as shards:
        directory = await store.ensure(checkpoint, FallbackShards(shards, fallback))
        assert [report.blake3 for report in shards.reports] == [victim.blake3]
    assert (directory / "model.safetensors").read_bytes() == (
        source / "model.safetensors"
    ).read_bytes()
    assert fallback.asked == 1
