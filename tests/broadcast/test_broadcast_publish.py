"""Deltas through a real coordinator: published with the manifest (their shards uploaded,
checked and kept), applied by a node holding the base, refused when inconsistent."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from broadcast_testing import model_dir, registered_client

from rollnet.reference.checkpoint_publishing import DeltaBase, publish_model_dir, sign_manifest
from rollnet.reference.coordinator.server import Coordinator, start_coordinator
from rollnet.reference.testing import coordinator_config
from rollnet.sdk import ConnectionConfig, ErrorReason, RollnetClient, RollnetError
from rollnet.sdk.broadcast import RelayShards
from rollnet.sdk.checkpoints import BlobServiceShards, CheckpointStore
from rollnet.sdk.identity import Identity
from rollnet.sdk.testing import NETWORK_ID, wait_until
from rollnet.v1 import checkpoint_pb2, checkpoint_service_pb2, common_pb2


@pytest.fixture
def trainer() -> Identity:
    return Identity.generate()


@pytest.fixture
async def coordinator(
    tmp_path: Path, sqlite_url: str, trainer: Identity
) -> AsyncIterator[Coordinator]:
    config = coordinator_config(tmp_path / "coordinator", sqlite_url, trainers=[trainer])
    running = await start_coordinator(config)
    yield running
    await running.stop(grace=0.5)


async def test_a_delta_published_through_the_coordinator_is_applied(
    tmp_path: Path, coordinator: Coordinator, trainer: Identity
) -> None:
    weights = bytearray(os.urandom(200_000))
    first = model_dir(tmp_path / "step0", bytes(weights))
    weights[1000:1010] = bytes(10)
    second = model_dir(tmp_path / "step1", bytes(weights))
    publisher = await registered_client(coordinator.address, trainer, common_pb2.ROLE_TRAINER)
    worker = Identity.generate()
    reader = await registered_client(coordinator.address, worker, common_pb2.ROLE_WORKER)
    origin = tmp_path / "origin"
    try:
        await publish_model_dir(
            publisher, trainer, first, 0, NETWORK_ID, shard_size=50_000, origin_dir=origin
        )
        published = await publish_model_dir(
            publisher,
            trainer,
            second,
            1,
            NETWORK_ID,
            shard_size=50_000,
            delta_base=DeltaBase(0, first),
            origin_dir=origin,
        )
        entry = next(f for f in published.manifest.files if f.path == "model.safetensors")
        assert entry.delta.base_step == 0
        assert entry.delta.content.size * 20 < entry.content.size
        # Every blob, deltas included, is in the origin directory too.
        assert all(
            (origin / "blobs" / s.blake3.hex()).is_file()
            for s in [*entry.shards, *entry.delta.shards]
        )
        store = CheckpointStore(tmp_path / "node", network_id=NETWORK_ID)
        for step in (0, 1):
            response = await reader.checkpoints.get_checkpoint(
                checkpoint_service_pb2.GetCheckpointRequest(step=step)
            )
            directory = await store.ensure(response.checkpoint, BlobServiceShards(reader))
        assert (directory / "model.safetensors").read_bytes() == (
            second / "model.safetensors"
        ).read_bytes()
        assert store.delta_files >= 1

        # Inconsistent deltas are refused at the edge, naming the field.
        bad = checkpoint_pb2.CheckpointManifest()
        bad.CopyFrom(published.manifest)
        bad.step = 2
        bad_entry = next(f for f in bad.files if f.path == "model.safetensors")
        bad_entry.delta.base_step = 2
        data = bad.SerializeToString()
        with pytest.raises(RollnetError) as refused:
            await publisher.checkpoints.publish_checkpoint(
                checkpoint_service_pb2.PublishCheckpointRequest(
                    manifest=data, signature=sign_manifest(trainer, data)
                )
            )
        assert refused.value.reason == ErrorReason.INVALID_FIELDS
        assert any("delta.base_step" in v.field for v in refused.value.field_violations)
        bad_entry.delta.base_step = 1
        bad_entry.delta.shards[0].blake3 = bytes(32)
        data = bad.SerializeToString()
        with pytest.raises(RollnetError) as refused:
            await publisher.checkpoints.publish_checkpoint(
                checkpoint_service_pb2.PublishCheckpointRequest(
                    manifest=data, signature=sign_manifest(trainer, data)
                )
            )
        assert refused.value.reason == ErrorReason.CHECKPOINT_SHARD_MISSING
        assert "(delta)" in str(refused.value)

        # A relay watching the coordinator (its own key, registered by watch_coordinator, as
        # rollnet relay --coordinator does) prefetches both steps, deltas included.
        from rollnet.reference.relay import RelayConfig, start_relay, watch_coordinator
        from rollnet.sdk.checkpoints import manifest_blobs

        origin_relay = await start_relay(RelayConfig(data_dir=origin))
        relay = await start_relay(
            RelayConfig(data_dir=tmp_path / "relay", upstreams=[origin_relay.url])
        )
        watcher = RollnetClient.connect(
            ConnectionConfig(target=coordinator.address, network_id=NETWORK_ID), Identity.generate()
        )
        task = asyncio.create_task(watch_coordinator(relay.cache, watcher, network_id=NETWORK_ID))
        wanted = {ref.blake3.hex() for _, ref in manifest_blobs(published.manifest)}
        try:
            await wait_until(lambda: all(relay.cache.path(d) is not None for d in wanted))
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await watcher.close()
            await relay.close()
            await origin_relay.close()
        assert relay.cache.steps[1] == wanted
        assert not relay.cache.hints_trusted  # versions now follow the signed manifests only
    finally:
        await publisher.close()
        await reader.close()


async def test_a_delta_that_does_not_rebuild_the_file_falls_back_to_the_shards(
    tmp_path: Path, trainer: Identity
) -> None:
    """A delta signed by the trainer but wrong (or a base the node altered) costs its bytes,
    never a wrong file: the full shards are fetched."""
    from broadcast_testing import publish_to_origin

    from rollnet.reference.checkpoint_publishing import signed_checkpoint, write_origin_blob
    from rollnet.reference.relay import RelayConfig, start_relay

    weights = bytearray(os.urandom(100_000))
    first = model_dir(tmp_path / "step0", bytes(weights))
    weights[5] ^= 1
    second = model_dir(tmp_path / "step1", bytes(weights))
    origin_dir = tmp_path / "origin"
    zero = await publish_to_origin(origin_dir, first, 0, trainer)
    one = await publish_to_origin(origin_dir, second, 1, trainer, delta_base=DeltaBase(0, first))
    manifest = checkpoint_pb2.CheckpointManifest.FromString(one.manifest)
    entry = next(f for f in manifest.files if f.path == "model.safetensors")
    # Swap in a delta that decodes but makes other bytes: the "delta" of the base to itself.
    from rollnet.sdk.broadcast.delta import encode_delta

    base = first / "model.safetensors"
    encode_delta(base, base, tmp_path / "wrong.delta")
    wrong = (tmp_path / "wrong.delta").read_bytes()
    digest = write_origin_blob(origin_dir, wrong)
    entry.delta.content.CopyFrom(common_pb2.BlobRef(blake3=digest, size=len(wrong)))
    del entry.delta.shards[:]
    entry.delta.shards.add(blake3=digest, size=len(wrong))
    tampered = signed_checkpoint(trainer, manifest)
    relay = await start_relay(RelayConfig(data_dir=origin_dir))
    try:
        store = CheckpointStore(tmp_path / "node", network_id=NETWORK_ID)
        async with RelayShards([relay.url]) as shards:
            await store.ensure(zero, shards)
            directory = await store.ensure(tampered, shards)
    finally:
        await relay.close()
    assert (directory / "model.safetensors").read_bytes() == (
        second / "model.safetensors"
    ).read_bytes()
    assert store.delta_files == 0
