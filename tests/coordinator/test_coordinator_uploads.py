"""Uploads nothing references yet: who may upload what, the per-node quota, the free-space
reserve, and the sweeping of orphans (live, and those a previous run left behind)."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import blake3
import grpc
import pytest
from coordinator_testing import (
    Work,
    judge_next_job,
    make_work,
    pull,
    raw_upload,
    register,
    request_tasks,
    upload_and_commit,
    upload_chunk,
    upload_header,
)
from coordinator_testing import publish_checkpoint as publish_test_checkpoint

from rollnet.ledger.models import Blob
from rollnet.reference.coordinator import blob_intake, server
from rollnet.reference.coordinator.blobstore import BlobStore
from rollnet.reference.coordinator.config import ConfigError, CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.context import run_to_completion
from rollnet.reference.coordinator.server import (
    Coordinator,
    prune_uncredited_blobs,
    start_coordinator,
    sweep_orphan_blobs,
)
from rollnet.reference.coordinator.uploads import (
    PendingUploads,
    QuotaExceeded,
    ShardIndex,
    block_size,
)
from rollnet.sdk import ErrorReason, Identity, RollnetClient, RollnetError
from rollnet.sdk.methods import method_path
from rollnet.sdk.testing import connect, wait_until
from rollnet.v1 import blob_service_pb2, common_pb2

BATCH = blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH
SHARD = blob_service_pb2.BLOB_KIND_CHECKPOINT_SHARD
DAY = 86_400.0


async def _start(config: CoordinatorConfig, **overrides: object) -> Coordinator:
    """A coordinator whose own sweeper has run its start-up pass and waits an hour for the next:
    the tests sweep when they choose (a background sweep would race them)."""
    coordinator = await start_coordinator(
        with_overrides(config, blob_sweep_interval=timedelta(hours=1), **overrides)
    )
    uploads = coordinator.ctx.uploads
    await wait_until(_now(lambda: uploads.sweeps > 0), what="the start-up sweep")
    return coordinator


def _block(config: CoordinatorConfig) -> int:
    """The block size of the file system the coordinator's blobs go to (charges are whole
    blocks)."""
    config.blob_dir.mkdir(parents=True, exist_ok=True)
    return block_size(config.blob_dir)


def _later(coordinator: Coordinator, seconds: float) -> None:
    """Move the orphan tracker's clock forward (the TTL itself must exceed a lease)."""
    coordinator.ctx.uploads.clock = lambda: time.time() + seconds


async def _refused(
    client: RollnetClient, data: bytes, kind: blob_service_pb2.BlobKind.ValueType = BATCH
) -> RollnetError:
    with pytest.raises(RollnetError) as refused:
        await client.blobs.upload(data, kind)
    return refused.value


async def _worker(coordinator: Coordinator) -> tuple[Identity, RollnetClient]:
    identity = Identity.generate()
    client = connect(coordinator.address, identity)
    await register(client, identity, common_pb2.ROLE_WORKER)
    return identity, client


async def _commit_one(
    coordinator: Coordinator, trainer_identity: Identity
) -> tuple[Identity, RollnetClient, Work]:
    """A trainer publishes a checkpoint and asks for one task; a worker leases and commits it."""
    trainer = connect(coordinator.address, trainer_identity)
    await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
    await publish_test_checkpoint(trainer, trainer_identity, step=1)
    await request_tasks(trainer, 1)
    identity, worker = await _worker(coordinator)
    pulled = await pull(worker)
    work = make_work(identity, pulled.task, pulled.lease)
    await upload_and_commit(worker, identity, work)
    return identity, worker, work


async def test_workers_upload_rollout_batches_only_within_their_quota(
    coordinator_config: CoordinatorConfig, trainer_identity: Identity
) -> None:
    block = _block(coordinator_config)  # charges are whole blocks
    quota = 5 * block
    coordinator = await _start(coordinator_config, upload_quota_bytes=quota)
    trainer = connect(coordinator.address, trainer_identity)
    first_identity, worker = await _worker(coordinator)
    other_identity, other = await _worker(coordinator)
    workers = (first_identity, other_identity)
    uploads = coordinator.ctx.uploads
    assert uploads.block_bytes == block
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        # A worker has no business uploading checkpoint shards (uncharged, unlike its batches).
        refused = await _refused(worker, b"not really weights", SHARD)
        assert (refused.code, refused.reason) == (
            grpc.StatusCode.PERMISSION_DENIED,
            ErrorReason.ROLE_NOT_ALLOWED,
        )

        first, second = b"a" * (2 * block - 100), b"b" * (3 * block + 1)  # 2 and 4 blocks
        await worker.blobs.upload(first, BATCH)
        assert uploads.pending_bytes(workers[0].node_id) == 2 * block
        # 2 + 4 blocks > 5: refused from the header, nothing stored, nothing charged.
        refused = await _refused(worker, second)
        assert (refused.code, refused.reason) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            ErrorReason.UPLOAD_QUOTA_EXCEEDED,
        )
        assert f"quota of {quota} bytes" in refused.message
        assert f"taking {4 * block} on the disk" in refused.message
        assert refused.retry_after is None, "the node's own orphans: waiting does not help soon"
        assert not coordinator.ctx.blobs.exists(blake3.blake3(second).digest())
        assert uploads.pending_bytes(workers[0].node_id) == 2 * block
        # Content already stored needs room while it streams, and costs nothing once it ends;
        # another node has its own quota.
        again = await worker.blobs.upload(first, BATCH)
        assert again.already_present
        await other.blobs.upload(second, BATCH)
        assert uploads.pending_bytes(workers[1].node_id) == 4 * block
        assert uploads.pending_bytes(workers[0].node_id) == 2 * block
        # A failed upload (bytes that do not hash to the declared digest) charges nothing.
        declared = blake3.blake3(b"c" * 1000).digest()
        messages = [upload_header(declared, 1000), upload_chunk(b"d" * 1000)]
        failed = await raw_upload(worker, messages)
        assert failed.reason == ErrorReason.BLOB_HASH_MISMATCH
        assert uploads.pending_bytes(workers[0].node_id) == 2 * block
        assert uploads.pending_bytes() == 6 * block
        assert uploads.streaming_bytes() == 0
        # Trainers are trusted: their shards are not charged (but swept if never published).
        await trainer.blobs.upload(b"w" * 3 * block, SHARD)
        assert uploads.pending_bytes(trainer_identity.node_id) == 0
        assert uploads.pending_bytes() == 9 * block
    finally:
        await coordinator.stop(grace=0.5)


@pytest.mark.slow
async def test_tiny_uploads_are_charged_the_blocks_they_take(
    coordinator_config: CoordinatorConfig,
) -> None:
    """A file takes at least one block whatever its size: a quota of 16 blocks holds 16 files
    of 16 bytes, not 16 × 256 of them."""
    block = _block(coordinator_config)
    coordinator = await _start(coordinator_config, upload_quota_bytes=16 * block)
    identity, worker = await _worker(coordinator)
    try:
        tiny = [os.urandom(16) for _ in range(17)]
        for data in tiny[:16]:
            await worker.blobs.upload(data, BATCH)
        refused = await _refused(worker, tiny[16])
        assert refused.reason == ErrorReason.UPLOAD_QUOTA_EXCEEDED
        assert coordinator.ctx.uploads.pending_bytes(identity.node_id) == 16 * block
        # An empty blob still takes an inode and a block's worth of charge.
        assert coordinator.ctx.uploads.footprint(0) == block
    finally:
        await coordinator.stop(grace=0.5)


def test_small_uploads_held_in_memory_count_whole_blocks_against_the_reserve() -> None:
    pending = PendingUploads(quota_bytes=1 << 20, block_bytes=4096)
    header_only = pending.begin("a", bytes(32), 16, in_memory=True)
    assert pending.buffered_bytes() == 0, "a header holds no room"
    tiny = pending.begin("a", bytes([1]) * 32, 16, in_memory=True)
    pending.received(tiny, 16)
    assert pending.buffered_bytes() == 4096
    larger = pending.begin("a", bytes([2]) * 32, 8193, in_memory=True)
    pending.received(larger, 4096)
    assert pending.buffered_bytes() == 2 * 4096
    pending.received(larger, 4097)
    assert pending.buffered_bytes() == 4 * 4096
    assert pending.streaming_bytes() == 16 + 8193, "the stream counts bytes received"
    for reservation in (header_only, tiny, larger):
        pending.finish(reservation, stored=False)
    assert (pending.buffered_bytes(), pending.streaming_bytes()) == (0, 0)
    assert pending.pending_bytes("a") == 0
    with pytest.raises(ValueError, match="block_bytes"):
        PendingUploads(quota_bytes=1, block_bytes=0)


async def test_the_reserve_is_checked_in_whole_blocks_at_the_header(
    coordinator_config: CoordinatorConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator = await _start(coordinator_config)
    _, worker = await _worker(coordinator)
    checks: list[int] = []

    def room(root: object, size: int, reserve: int) -> bool:
        checks.append(size)
        return True

    monkeypatch.setattr(blob_intake, "has_room", room)
    try:
        await worker.blobs.upload(b"sixteen bytes!!!", BATCH)
        block = coordinator.ctx.uploads.block_bytes
        assert checks == [block, block], "at the header and before it is stored: a block each"
    finally:
        await coordinator.stop(grace=0.5)


async def test_a_commitment_frees_its_batch_from_the_quota(
    coordinator_config: CoordinatorConfig, trainer_identity: Identity
) -> None:
    coordinator = await _start(coordinator_config)
    uploads = coordinator.ctx.uploads
    try:
        identity, _, work = await _commit_one(coordinator, trainer_identity)
        digest = blake3.blake3(work.batch).digest()
        assert uploads.pending_bytes(identity.node_id) == 0
        assert not uploads.is_pending(digest)
        # Recorded blobs are never swept, however old.
        _later(coordinator, 10 * DAY)
        assert await sweep_orphan_blobs(coordinator.ctx) == (0, 0)
        assert coordinator.ctx.blobs.exists(digest)
        # An upload this replica saw but another replica (sharing the blob directory) recorded
        # the commitment of: the sweep finds the row, keeps the file and stops charging for it.
        uploads.clock = time.time
        _upload(uploads, identity.node_id, digest, created=True, size=len(work.batch))
        assert uploads.pending_bytes(identity.node_id) == uploads.footprint(len(work.batch))
        assert await sweep_orphan_blobs(coordinator.ctx) == (0, 0)  # young: looked up all the same
        assert coordinator.ctx.blobs.exists(digest)
        assert uploads.pending_bytes(identity.node_id) == 0
    finally:
        await coordinator.stop(grace=0.5)


async def test_uploads_keep_the_free_space_reserve(
    coordinator_config: CoordinatorConfig, trainer_identity: Identity
) -> None:
    coordinator = await _start(coordinator_config)
    trainer = connect(coordinator.address, trainer_identity)
    _, worker = await _worker(coordinator)
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        stored = b"stored before the disk filled up"
        await worker.blobs.upload(stored, BATCH)
        # No file system has 2**62 bytes free: every new upload would breach the reserve.
        coordinator.ctx.config = with_overrides(coordinator.ctx.config, min_free_disk_bytes=2**62)
        for client, kind in ((worker, BATCH), (trainer, SHARD)):
            refused = await _refused(client, b"new bytes" * 10, kind)
            assert (refused.code, refused.reason) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                ErrorReason.STORAGE_FULL,
            )
            assert refused.retry_after is not None
            assert refused.retry_after > 0
        # Nothing new to store: allowed.
        assert (await worker.blobs.upload(stored, BATCH)).already_present
    finally:
        await coordinator.stop(grace=0.5)


async def test_orphans_are_deleted_after_the_ttl_and_free_the_quota(
    coordinator_config: CoordinatorConfig, trainer_identity: Identity
) -> None:
    block = _block(coordinator_config)
    coordinator = await _start(coordinator_config, upload_quota_bytes=3 * block)
    trainer = connect(coordinator.address, trainer_identity)
    identity, worker = await _worker(coordinator)
    workers = (identity,)
    ctx = coordinator.ctx
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        orphan, pinned = b"o" * 1500, b"p" * 1500
        await worker.blobs.upload(orphan, BATCH)
        await worker.blobs.upload(pinned, BATCH)
        # A worker's batch whose bytes a trainer then uploads as a shard is the trainer's (not
        # charged; still an orphan if no manifest names it).
        shard = b"s" * 900
        await worker.blobs.upload(shard, BATCH)
        await trainer.blobs.upload(shard, SHARD)
        assert ctx.uploads.pending_bytes(workers[0].node_id) == 2 * block
        assert (await sweep_orphan_blobs(ctx)) == (0, 0), "younger than the TTL"

        _later(coordinator, ctx.config.orphan_blob_ttl.total_seconds() + 1)
        digests = {data: blake3.blake3(data).digest() for data in (orphan, pinned, shard)}
        with ctx.uploads.pin((digests[pinned],)):  # a commitment being recorded right now
            files, freed = await sweep_orphan_blobs(ctx)
        assert (files, freed) == (2, 2 * block), "the blocks they took"
        assert not ctx.blobs.exists(digests[orphan])
        assert not ctx.blobs.exists(digests[shard]), "never published"
        assert ctx.blobs.exists(digests[pinned])
        assert ctx.uploads.pending_bytes(workers[0].node_id) == block
        assert ctx.metrics.orphan_blobs_deleted._value.get() == 2
        # Gone: uploading it again stores it anew, young (and charged) again.
        assert not (await worker.blobs.upload(orphan, BATCH)).already_present
        # Unpinned, the other orphan goes on the next sweep.
        assert await sweep_orphan_blobs(ctx) == (1, block)
        assert not ctx.blobs.exists(digests[pinned])
        assert ctx.blobs.exists(digests[orphan])
        assert ctx.uploads.pending_bytes(workers[0].node_id) == block
    finally:
        await coordinator.stop(grace=0.5)


async def test_a_restart_finds_and_sweeps_orphans_of_the_previous_run(
    coordinator_config: CoordinatorConfig, trainer_identity: Identity
) -> None:
    coordinator = await _start(coordinator_config)
    try:
        _, worker, work = await _commit_one(coordinator, trainer_identity)
        orphan = b"left behind by a crash" * 50
        await worker.blobs.upload(orphan, BATCH)
    finally:
        await coordinator.stop(grace=0.5)
    blobs = coordinator.ctx.blobs
    kept = {blake3.blake3(work.batch).digest(), *_shard_digests(blobs.root, exclude=work.batch)}
    orphan_digest = blake3.blake3(orphan).digest()
    kept.discard(orphan_digest)
    assert len(kept) == 2, "the committed batch and the checkpoint's shard"

    restarted = await _start(coordinator_config)
    try:
        uploads = restarted.ctx.uploads
        # Adopted on start from the files and the database (before the start-up sweep).
        assert uploads.is_pending(orphan_digest)
        assert all(not uploads.is_pending(digest) for digest in kept)
        assert uploads.pending_bytes() == uploads.footprint(len(orphan))
        _later(restarted, restarted.ctx.config.orphan_blob_ttl.total_seconds() + 1)
        assert await sweep_orphan_blobs(restarted.ctx) == (1, uploads.footprint(len(orphan)))
        assert not restarted.ctx.blobs.exists(orphan_digest)
        assert all(restarted.ctx.blobs.exists(digest) for digest in kept)
    finally:
        await restarted.stop(grace=0.5)


async def test_batches_of_rejected_work_are_deleted_after_the_retention(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    validator_identity: Identity,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server, "_RETENTION_PAGE", 1)  # finished jobs read one at a time
    coordinator = await _start(coordinator_config)
    ctx = coordinator.ctx
    trainer = connect(coordinator.address, trainer_identity)
    validator = connect(coordinator.address, validator_identity)
    identity, worker = await _worker(coordinator)
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        await register(validator, validator_identity, common_pb2.ROLE_VALIDATOR)
        await publish_test_checkpoint(trainer, trainer_identity, step=1)
        await request_tasks(trainer, 2)
        batches = []
        for accept in (True, False):
            pulled = await pull(worker)
            work_done = make_work(identity, pulled.task, pulled.lease)
            await upload_and_commit(worker, identity, work_done)
            await judge_next_job(validator, accept=accept)
            batches.append((blake3.blake3(work_done.batch).digest(), work_done.batch))
        (accepted, _), (rejected, rejected_bytes) = batches
        retention = ctx.config.rejected_blob_ttl
        assert retention.total_seconds() > 0, "on by default"
        assert await prune_uncredited_blobs(ctx) == (0, 0), "younger than the retention"
        assert ctx.blobs.exists(rejected)

        later = ctx.clock() + retention + timedelta(seconds=1)
        ctx.clock = lambda: later
        size = ctx.blobs.size(rejected)
        assert await prune_uncredited_blobs(ctx) == (1, ctx.uploads.footprint(size))
        assert not ctx.blobs.exists(rejected)
        assert ctx.blobs.exists(accepted), "credited work is the trainer's: kept"
        assert ctx.metrics.rejected_blobs_pruned._value.get() == 1
        with ctx.sessions() as session:
            row = session.get(Blob, rejected.hex())
            assert row is not None
            assert row.pruned_at == later, "the row stays (the ledger names it), marked"
            kept = session.get(Blob, accepted.hex())
            assert kept is not None
            assert kept.pruned_at is None
        with pytest.raises(RollnetError) as gone:
            await worker.blobs.download(rejected)
        assert (gone.value.code, gone.value.reason) == (
            grpc.StatusCode.NOT_FOUND,
            ErrorReason.BLOB_NOT_FOUND,
        )
        assert "deleted" in gone.value.message, "says why it is not there"
        assert await prune_uncredited_blobs(ctx) == (0, 0), "nothing twice"

        # A restart walks the finished jobs again from the start and deletes nothing twice.
        ctx.retention_position = None
        assert await prune_uncredited_blobs(ctx) == (0, 0)

        # The same bytes uploaded again are nobody's: charged, and swept as an orphan.
        assert not (await worker.blobs.upload(rejected_bytes, BATCH)).already_present
        assert ctx.uploads.is_pending(rejected)
        ctx.uploads.clock = lambda: time.time() + ctx.config.orphan_blob_ttl.total_seconds() + 1
        files, _ = await sweep_orphan_blobs(ctx)
        assert files == 1
        assert not ctx.blobs.exists(rejected)
    finally:
        await coordinator.stop(grace=0.5)


def _shard_digests(root: Path, exclude: bytes) -> set[bytes]:
    store = BlobStore(root, max_bytes=1 << 20)
    return {digest for digest, _, _ in store.stored()} - {blake3.blake3(exclude).digest()}


async def _upload_held(
    client: RollnetClient, digest: bytes, data: bytes, go_on: asyncio.Event | None
) -> blob_service_pb2.UploadBlobResponse:
    """Upload ``data`` as one chunk, its header sent first and the chunk only once ``go_on`` is
    set (at once when None); raises grpc.aio.AioRpcError when refused."""
    call: grpc.aio.StreamUnaryMultiCallable[bytes, blob_service_pb2.UploadBlobResponse]
    call = client.channel.stream_unary(
        method_path("BlobService", "UploadBlob"),
        request_serializer=None,
        response_deserializer=blob_service_pb2.UploadBlobResponse.FromString,
    )

    async def stream() -> AsyncIterator[bytes]:
        yield upload_header(digest, len(data)).SerializeToString()
        if go_on is not None:
            await go_on.wait()
        yield upload_chunk(data).SerializeToString()

    response: blob_service_pb2.UploadBlobResponse = await call(stream(), timeout=10)
    return response


def _disk_fills_after_the_header(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the reserve check find room at an upload's header and none after; returns the
    sizes it was asked about."""
    checks: list[int] = []

    def disk_fills(root: object, size: int, reserve: int) -> bool:
        checks.append(size)
        return len(checks) == 1

    monkeypatch.setattr(blob_intake, "has_room", disk_fills)
    return checks


def _partials(root: Path) -> list[Path]:
    return list(root.rglob("*.partial"))


def _now(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def checked() -> bool:
        return check()

    return checked


def test_the_store_lists_blobs_only(tmp_path: Path) -> None:
    store = BlobStore(tmp_path, max_bytes=1 << 20)
    digest = bytes(range(32))
    path = store.path_of(digest)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x" * 7)
    (path.parent / (path.name + ".abc.partial")).write_bytes(b"partial")
    (path.parent / "README").write_text("not a blob")
    (tmp_path / "notes").mkdir()
    listed = list(store.stored())
    assert [(d, size) for d, size, _ in listed] == [(digest, 7)]
    assert abs(listed[0][2] - os.stat(path).st_mtime) < 1e-6
    store.remove(digest)
    store.remove(digest)  # already gone: not an error
    assert not store.exists(digest)


def _upload(
    pending: PendingUploads, node: str | None, digest: bytes, created: bool, size: int = 10
) -> None:
    """An upload of ``size`` bytes that completes, having stored its file (``created``) or
    found it stored."""
    reservation = pending.begin(node, digest, size)
    if created:
        pending.created(reservation, size)
    pending.finish(reservation, stored=True)


def test_the_tracker_never_deletes_what_changed_since_it_was_listed(tmp_path: Path) -> None:
    now = [1000.0]
    pending = PendingUploads(quota_bytes=100, clock=lambda: now[0])
    store = BlobStore(tmp_path, max_bytes=1 << 20)
    digests = [bytes([i]) * 32 for i in range(4)]
    for digest in digests:
        store.path_of(digest).parent.mkdir(parents=True, exist_ok=True)
        store.path_of(digest).write_bytes(b"1234567890")
        _upload(pending, "node", digest, created=True)
    _upload(pending, "other", digests[0], created=False)  # already stored: the creator owns it
    assert pending.pending_bytes("other") == 0
    with pytest.raises(QuotaExceeded):
        pending.begin("node", bytes([9]) * 32, 61)
    now[0] += 50
    candidates = pending.tracked()
    assert candidates == digests
    pending.settle([digests[0]])  # recorded meanwhile
    pending.settle([digests[1]])
    _upload(pending, "node", digests[1], created=True)  # swept and uploaded again: young again
    now[0] += 10
    with pending.pin([digests[2]]):
        assert pending.delete_unreferenced(store, candidates, ttl=50) == (1, 10)
    assert [store.exists(d) for d in digests] == [True, True, True, False]
    assert pending.pending_bytes("node") == 20
    assert pending.pending_bytes() == 20
    assert not list(tmp_path.rglob("*.partial")), "the renamed file was unlinked"


def test_two_streams_of_one_content_leave_one_owner_and_no_untracked_file() -> None:
    pending = PendingUploads(quota_bytes=15)
    digest = bytes(32)
    first = pending.begin("a", digest, 10)
    second = pending.begin("b", digest, 10)  # both charged while they stream
    assert (pending.pending_bytes("a"), pending.pending_bytes("b")) == (10, 10)
    with pytest.raises(QuotaExceeded):
        pending.begin("a", bytes([1]) * 32, 10)
    pending.received(first, 4)
    pending.received(second, 10)
    assert pending.streaming_bytes() == 14, "bytes received, not declared"
    # The second stream's bytes become the file; the first then finds it stored (or fails):
    # the file is tracked and charged to the second, the first is charged nothing.
    pending.created(second, 10)
    pending.finish(second, stored=True)
    pending.finish(first, stored=False)
    assert pending.is_pending(digest)
    assert (pending.pending_bytes("a"), pending.pending_bytes("b")) == (0, 10)
    assert pending.streaming_bytes() == 0
    # Re-sending a file it owns (a retry whose answer was lost) costs its owner nothing more.
    retry = pending.begin("b", digest, 10)
    assert pending.pending_bytes("b") == 10
    pending.finish(retry, stored=True)
    # A cancelled stream: the rename (and its report) comes after the caller's finish.
    late = pending.begin("a", bytes([2]) * 32, 5)
    pending.finish(late, stored=False)
    pending.created(late, 5)
    assert pending.is_pending(bytes([2]) * 32)
    assert pending.pending_bytes("a") == 5
    # A trusted upload of the same content takes it over, uncharged.
    _upload(pending, None, digest, created=False)
    assert pending.is_pending(digest)
    assert pending.pending_bytes("b") == 0
    assert pending.pending_bytes() == 15


async def test_an_upload_that_outlives_its_content_being_swept_is_tracked(
    coordinator_config: CoordinatorConfig,
) -> None:
    coordinator = await _start(coordinator_config)
    ctx = coordinator.ctx
    _, first = await _worker(coordinator)
    identity, second = await _worker(coordinator)
    try:
        data = b"swept while a second upload of it streams" * 20
        digest = blake3.blake3(data).digest()
        await first.blobs.upload(data, BATCH)
        # Another node's upload of the same bytes sends its header while the file is there ...
        go_on = asyncio.Event()
        answer = asyncio.ensure_future(_upload_held(second, digest, data, go_on))
        charged = _now(lambda: ctx.uploads.pending_bytes(identity.node_id) > 0)
        await wait_until(charged, what="the header")
        # ... the sweep deletes it meanwhile, and the stream then stores it again.
        _later(coordinator, ctx.config.orphan_blob_ttl.total_seconds() + 1)
        assert await sweep_orphan_blobs(ctx) == (1, ctx.uploads.footprint(len(data)))
        go_on.set()
        response = await answer
        assert not response.already_present
        assert ctx.blobs.exists(digest)
        assert ctx.uploads.is_pending(digest), "a stored, unreferenced file is always tracked"
        assert ctx.uploads.pending_bytes(identity.node_id) == ctx.uploads.footprint(len(data))
    finally:
        await coordinator.stop(grace=0.5)


async def test_an_upload_cancelled_while_its_file_is_written_is_still_tracked(
    coordinator_config: CoordinatorConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator = await _start(coordinator_config, upload_quota_bytes=15_000)
    ctx = coordinator.ctx
    identity, worker = await _worker(coordinator)
    # A busy disk: the store's fsync waits until the test lets it go.
    syncing, release = threading.Event(), threading.Event()
    fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        syncing.set()
        release.wait(10)
        fsync(fd)

    monkeypatch.setattr("rollnet.reference.coordinator.blobstore.os.fsync", slow_fsync)
    try:
        data = os.urandom(10_000)
        digest = blake3.blake3(data).digest()
        upload = asyncio.ensure_future(_upload_held(worker, digest, data, None))
        await wait_until(_now(syncing.is_set), what="the store's fsync")
        upload.cancel()  # the worker gives up while the file is being written
        with pytest.raises(asyncio.CancelledError):
            await upload
        # Until the store ends, the upload still holds its quota and its room: the worker
        # cannot start another quota's worth meanwhile.
        taken = ctx.uploads.footprint(len(data))
        assert ctx.uploads.pending_bytes(identity.node_id) == taken
        assert ctx.uploads.buffered_bytes() == taken
        with pytest.raises(RollnetError) as refused:
            await worker.blobs.upload(os.urandom(len(data)), BATCH)
        assert refused.value.reason == ErrorReason.UPLOAD_QUOTA_EXCEEDED
        release.set()
        await wait_until(_now(lambda: ctx.uploads.is_pending(digest)), what="tracking")
        await wait_until(_now(lambda: ctx.uploads.streaming_bytes() == 0), what="the store")
        assert ctx.blobs.exists(digest)
        assert ctx.uploads.pending_bytes(identity.node_id) == taken
    finally:
        release.set()
        await coordinator.stop(grace=0.5)


def test_a_free_re_send_is_one_at_a_time_of_the_same_size_and_charged_if_it_stores() -> None:
    pending = PendingUploads(quota_bytes=25)
    digest = bytes(32)
    _upload(pending, "b", digest, created=True)  # b owns a 10-byte file
    resend = pending.begin("b", digest, 10)
    assert pending.pending_bytes("b") == 10, "a retry of a lost answer is free"
    concurrent = pending.begin("b", digest, 10)  # a second re-send at once is charged
    assert pending.pending_bytes("b") == 20
    with pytest.raises(QuotaExceeded):
        pending.begin("b", digest, 64 << 20)  # another size is another upload: charged
    # The file was swept meanwhile (b now answers for the concurrent re-send and another
    # upload): the free re-send would store it anew, and is charged first.
    pending.settle([digest])
    other = pending.begin("b", bytes([5]) * 32, 10)
    assert pending.pending_bytes("b") == 20
    with pytest.raises(QuotaExceeded):
        pending.admit(resend)  # 20 + 10 > 25: refused, nothing stored
    pending.finish(other, stored=False)
    pending.finish(concurrent, stored=False)
    pending.admit(resend)
    assert pending.pending_bytes("b") == 10
    pending.created(resend, 10)
    pending.finish(resend, stored=True)
    assert pending.pending_bytes("b") == 10
    assert pending.is_pending(digest)


async def test_a_large_upload_stops_when_the_disk_reaches_the_reserve(
    coordinator_config: CoordinatorConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator = await _start(coordinator_config)
    ctx = coordinator.ctx
    identity, worker = await _worker(coordinator)
    checks = _disk_fills_after_the_header(monkeypatch)
    try:
        data = os.urandom(9 << 20)
        refused = await _refused(worker, data)
        assert (refused.reason, refused.retry_after is not None) == (ErrorReason.STORAGE_FULL, True)
        assert len(checks) == 2, "checked at the header, then again mid-stream"
        assert not ctx.blobs.exists(blake3.blake3(data).digest())
        assert not _partials(ctx.blobs.root), "the temporary file is removed"
        assert ctx.uploads.pending_bytes(identity.node_id) == 0
        assert ctx.uploads.streaming_bytes() == 0
    finally:
        await coordinator.stop(grace=0.5)


async def test_a_small_upload_is_checked_against_the_reserve_before_it_is_stored(
    coordinator_config: CoordinatorConfig,
) -> None:
    coordinator = await _start(coordinator_config)
    ctx = coordinator.ctx
    identity, worker = await _worker(coordinator)
    try:
        free = shutil.disk_usage(ctx.blobs.root).free
        ctx.config = with_overrides(ctx.config, min_free_disk_bytes=max(free - (512 << 20), 0))
        data = b"admitted at its header, not at its end" * 100
        digest = blake3.blake3(data).digest()
        go_on = asyncio.Event()
        answer = asyncio.ensure_future(_upload_held(worker, digest, data, go_on))
        charged = _now(lambda: ctx.uploads.pending_bytes(identity.node_id) > 0)
        await wait_until(charged, what="the header")
        # Meanwhile other small uploads came to hold 1 GiB in memory (headers sent first).
        others = ctx.uploads.begin(None, bytes(32), 1 << 30, in_memory=True)
        ctx.uploads.received(others, 1 << 30)
        go_on.set()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await answer
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert not ctx.blobs.exists(digest)
        ctx.uploads.finish(others, stored=False)
        assert ctx.uploads.pending_bytes(identity.node_id) == 0
        assert ctx.uploads.buffered_bytes() == 0
    finally:
        await coordinator.stop(grace=0.5)


async def test_a_refused_large_upload_frees_its_room_before_reading_the_rest(
    coordinator_config: CoordinatorConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator = await _start(coordinator_config)
    ctx = coordinator.ctx
    identity, worker = await _worker(coordinator)
    checks = _disk_fills_after_the_header(monkeypatch)
    call: grpc.aio.StreamUnaryMultiCallable[bytes, blob_service_pb2.UploadBlobResponse]
    call = worker.channel.stream_unary(
        method_path("BlobService", "UploadBlob"),
        request_serializer=None,
        response_deserializer=blob_service_pb2.UploadBlobResponse.FromString,
    )
    declared, piece = 4 << 20, 1 << 20
    go_on = asyncio.Event()
    pulled: list[int] = []

    async def stream() -> AsyncIterator[bytes]:
        yield upload_header(bytes(32), declared).SerializeToString()
        yield upload_chunk(bytes(piece)).SerializeToString()
        await go_on.wait()
        while True:  # more than declared: the server stops reading at the declared size
            pulled.append(piece)
            yield upload_chunk(bytes(piece)).SerializeToString()

    try:
        answer = asyncio.ensure_future(call(stream(), timeout=60))
        await wait_until(_now(lambda: len(checks) == 2), what="the refused chunk")
        # While the rest is read, the refused upload holds no file, no charge and no room.
        released = _now(lambda: ctx.uploads.streaming_bytes() == 0)
        await wait_until(released, within=5, what="the release")
        assert not _partials(ctx.blobs.root)
        assert ctx.uploads.pending_bytes(identity.node_id) == 0
        go_on.set()
        with pytest.raises(grpc.aio.AioRpcError):
            await answer
        assert len(pulled) < 64, "the drain is bounded by the declared size"
    finally:
        go_on.set()
        await coordinator.stop(grace=0.5)


async def test_a_store_cancelled_before_its_thread_starts_still_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BlobStore(tmp_path, max_bytes=16 << 20, cache_blob_bytes=1 << 20)
    # A busy executor: the fsync-and-rename job waits in the queue.
    queued, start = asyncio.Event(), asyncio.Event()
    to_thread = asyncio.to_thread

    async def busy_executor(function: Callable[..., object], *args: object) -> object:
        queued.set()
        await start.wait()
        return await to_thread(function, *args)

    monkeypatch.setattr("rollnet.reference.coordinator.blobstore.asyncio.to_thread", busy_executor)
    created: list[int] = []
    data = os.urandom(3 << 20)  # streamed to a temporary file

    async def chunks() -> AsyncIterator[bytes]:
        yield data

    digest = blake3.blake3(data).digest()
    done: list[bool] = []
    writing = asyncio.ensure_future(
        store.write(digest, len(data), chunks(), created.append, on_done=done.append)
    )
    await wait_until(_now(queued.is_set), what="the job to be queued")
    writing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writing
    assert done == [], "the write is not over while its job is queued"
    start.set()
    await wait_until(_now(lambda: done == [True]), what="the store to complete")
    assert created == [len(data)]
    assert store.path_of(digest).read_bytes() == data
    assert not _partials(tmp_path)


@pytest.mark.slow
async def test_the_free_space_reserve_counts_uploads_in_flight(
    coordinator_config: CoordinatorConfig,
) -> None:
    coordinator = await _start(coordinator_config)
    ctx = coordinator.ctx
    _, worker = await _worker(coordinator)
    try:
        free = shutil.disk_usage(ctx.blobs.root).free
        reserve = max(free - (512 << 20), 0)
        ctx.config = with_overrides(ctx.config, min_free_disk_bytes=reserve)
        await worker.blobs.upload(b"fits while nothing else is in flight", BATCH)
        # Uploads in flight hold 1 GiB in memory (not on the disk yet).
        in_flight = ctx.uploads.begin(None, bytes(32), 2 << 30, in_memory=True)
        ctx.uploads.received(in_flight, 1 << 30)
        refused = await _refused(worker, b"does not fit beside the one in flight")
        assert refused.reason == ErrorReason.STORAGE_FULL
        ctx.uploads.finish(in_flight, stored=False)
        await worker.blobs.upload(b"does not fit beside the one in flight", BATCH)
    finally:
        await coordinator.stop(grace=0.5)


async def test_a_commitment_is_recorded_even_if_its_caller_goes_away() -> None:
    finished: list[str] = []

    async def recording() -> str:
        await asyncio.sleep(0)  # the writer thread's commit, which a cancellation cannot stop
        await asyncio.sleep(0)
        finished.append("recorded")
        return "receipt"

    caller = asyncio.ensure_future(run_to_completion(recording()))
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await wait_until(_now(lambda: finished == ["recorded"]), what="the recording to finish")


def test_a_read_racing_a_deletion_does_not_cache_the_blob_again(tmp_path: Path) -> None:
    store = BlobStore(tmp_path, max_bytes=1 << 20)
    digest = bytes(range(32))
    store.path_of(digest).parent.mkdir(parents=True)
    store.path_of(digest).write_bytes(b"old bytes")
    doomed = store.detach(digest)
    assert doomed is not None
    assert not store.exists(digest)
    store._remember(digest, b"old bytes", stored_only=True)  # a read that opened it before
    assert not store.exists(digest)
    assert store.detach(digest) is None


async def test_the_shard_index_reads_each_manifest_once(
    coordinator_config: CoordinatorConfig, trainer_identity: Identity
) -> None:
    coordinator = await _start(coordinator_config)
    trainer = connect(coordinator.address, trainer_identity)
    index = ShardIndex()
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        await publish_test_checkpoint(trainer, trainer_identity, step=0)
        with coordinator.ctx.sessions() as session:
            first = set(index.refresh(session))
        await publish_test_checkpoint(trainer, trainer_identity, step=1)
        with coordinator.ctx.sessions() as session:
            both = set(index.refresh(session))
            assert index.refresh(session) == both
        assert len(first) == 1
        assert len(both) == 2
        assert first < both, "a later manifest's shards are added to the earlier ones"
    finally:
        await coordinator.stop(grace=0.5)


def test_the_orphan_ttl_must_outlast_a_lease(coordinator_config: CoordinatorConfig) -> None:
    with pytest.raises(ConfigError, match="orphan_blob_ttl must exceed lease_duration"):
        with_overrides(coordinator_config, orphan_blob_ttl=coordinator_config.lease_duration)
