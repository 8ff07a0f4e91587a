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


async def test_the_trainer_publishes_deltas_and_keeps_its_origin_bounded(
    tmp_path: Path, coordinator: Coordinator, trainer: Identity
) -> None:
    """The trainer's publishing (``publish_step``): each step a delta against the step the
    coordinator held before, every blob in the origin directory, and only the newest
    checkpoints' blobs kept there; a node following the steps through the origin applies the
    deltas."""
    from rollnet.reference.checkpoint_publishing import PublishedCheckpoint
    from rollnet.reference.relay import RelayConfig, start_relay
    from rollnet.reference.trainer.publish import checkpoint_dir, publish_step
    from rollnet.sdk.checkpoints import manifest_blobs

    data_dir = tmp_path / "trainer"
    weights = bytearray(os.urandom(200_000))
    for step in range(4):
        weights[1000 + step] ^= 0xFF
        model_dir(checkpoint_dir(data_dir, step), bytes(weights))
    publisher = await registered_client(coordinator.address, trainer, common_pb2.ROLE_TRAINER)
    origin = tmp_path / "origin"
    results: list[PublishedCheckpoint] = []
    try:
        for step in range(4):
            results.append(
                await publish_step(
                    publisher,
                    trainer,
                    data_dir,
                    step,
                    NETWORK_ID,
                    published=step - 1 if step else None,
                    origin_dir=origin,
                    origin_keep=2,
                )
            )
        # Without a base directory, or with deltas off, the files go whole only.
        (data_dir / "checkpoints" / "step-5").mkdir()
        model_dir(checkpoint_dir(data_dir, 6), bytes(weights))
        no_base = await publish_step(publisher, trainer, data_dir, 6, NETWORK_ID, published=5)
        model_dir(checkpoint_dir(data_dir, 7), bytes(weights))
        off = await publish_step(
            publisher, trainer, data_dir, 7, NETWORK_ID, published=6, deltas=False
        )
    finally:
        await publisher.close()

    def weights_of(result: PublishedCheckpoint) -> checkpoint_pb2.CheckpointFile:
        return next(f for f in result.manifest.files if f.path == "model.safetensors")

    assert not weights_of(results[0]).HasField("delta")
    assert [weights_of(r).delta.base_step for r in results[1:]] == [0, 1, 2]
    assert all(
        weights_of(r).delta.content.size * 20 < weights_of(r).content.size for r in results[1:]
    )
    assert not weights_of(no_base).HasField("delta")
    assert not weights_of(off).HasField("delta")
    # The origin holds the newest two checkpoints' records and exactly their blobs.
    assert sorted(p.name for p in (origin / "checkpoints").iterdir()) == [
        "step-2.pb",
        "step-3.pb",
    ]
    kept = {ref.blake3.hex() for r in results[2:] for _, ref in manifest_blobs(r.manifest)}
    assert {p.name for p in (origin / "blobs").iterdir()} == kept
    relay = await start_relay(RelayConfig(data_dir=origin))
    try:
        store = CheckpointStore(tmp_path / "node", network_id=NETWORK_ID)
        async with RelayShards([relay.url]) as shards:
            await store.ensure(results[2].checkpoint, shards)
            directory = await store.ensure(results[3].checkpoint, shards)
    finally:
        await relay.close()
    assert (directory / "model.safetensors").read_bytes() == (
        checkpoint_dir(data_dir, 3) / "model.safetensors"
    ).read_bytes()
    assert store.delta_files == 1


async def test_a_relay_watching_a_coordinator_that_is_down_waits_for_it(
    tmp_path: Path, sqlite_url: str, trainer: Identity
) -> None:
    """``rollnet relay --coordinator``: a coordinator not yet up (or gone for a while) is
    retried, each failure counted, and prefetching starts once it answers."""
    from coordinator_testing import register

    from rollnet.reference.checkpoint_publishing import publish_model_dir
    from rollnet.reference.relay import RelayConfig, start_relay, watch_coordinator
    from rollnet.sdk.checkpoints import manifest_blobs
    from rollnet.sdk.retry import RetryPolicy
    from rollnet.sdk.testing import connect, free_port

    address = f"127.0.0.1:{free_port()}"
    origin_dir = tmp_path / "origin"
    (origin_dir / "blobs").mkdir(parents=True)
    origin = await start_relay(RelayConfig(data_dir=origin_dir))
    relay = await start_relay(RelayConfig(data_dir=tmp_path / "relay", upstreams=[origin.url]))
    watcher = connect(address, Identity.generate())
    task = asyncio.create_task(
        watch_coordinator(
            relay.cache, watcher, network_id=NETWORK_ID, retry_after=0.05, max_retry_after=0.5
        )
    )

    def errors() -> float:
        return relay.metrics.registry.get_sample_value("rollnet_relay_watch_errors_total") or 0.0

    coordinator = None
    try:
        await wait_until(lambda: errors() >= 2, what="the watch to fail and be retried")
        assert not task.done()
        coordinator = await start_coordinator(
            coordinator_config(
                tmp_path / "coordinator", sqlite_url, trainers=[trainer], listen=address
            )
        )
        # Channels to one address share their connection state in gRPC: the publisher, too,
        # rides out the back-off the watcher's failures left.
        publisher = connect(address, trainer, retry=RetryPolicy(max_attempts=30, max_backoff=1.0))
        try:
            await register(publisher, trainer, common_pb2.ROLE_TRAINER)
            published = await publish_model_dir(
                publisher,
                trainer,
                model_dir(tmp_path / "model", os.urandom(50_000)),
                1,
                NETWORK_ID,
                origin_dir=origin_dir,
            )
        finally:
            await publisher.close()
        wanted = {ref.blake3.hex() for _, ref in manifest_blobs(published.manifest)}
        await wait_until(
            lambda: all(relay.cache.path(d) is not None for d in wanted),
            within=60,
            what="the relay to prefetch the checkpoint",
        )
        assert relay.cache.steps[1] == wanted
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await watcher.close()
        await relay.close()
        await origin.close()
        if coordinator is not None:
            await coordinator.stop(grace=0.5)
