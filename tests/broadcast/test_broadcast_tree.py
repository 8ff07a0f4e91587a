"""A relay tree on loopback: origin -> 2 relays -> 1 second-level relay -> clients.

Covers fan-out (one upstream fetch per blob per relay however many clients), pipelining (bytes
reach a leaf while the origin is still sending), a relay killed mid-transfer, a relay serving a
corrupted shard, a manifest with a bad signature, an interrupted client that resumes, a chain
of real optimizer steps shipped as deltas, and a late joiner that gets the full checkpoint.
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from broadcast_testing import GatedUpstream, model_dir, publish_to_origin

from rollnet.reference.checkpoint_publishing import DeltaBase, signed_checkpoint
from rollnet.reference.relay import RelayConfig, RelayServer, start_relay
from rollnet.reference.trainer.synthetic_steps import write_trainer_steps
from rollnet.sdk.broadcast import BadShardReport, RelayShards
from rollnet.sdk.checkpoints import CheckpointStore, CheckpointVerificationError
from rollnet.sdk.identity import Identity
from rollnet.sdk.testing import NETWORK_ID, wait_until
from rollnet.v1 import checkpoint_pb2, common_pb2

SHARD = 64 * 1024


@pytest.fixture
async def relays() -> AsyncIterator[list[RelayServer]]:
    started: list[RelayServer] = []
    yield started
    for relay in started:
        await relay.close()


async def relay(started: list[RelayServer], root: Path, *upstreams: str) -> RelayServer:
    server = await start_relay(RelayConfig(data_dir=root, upstreams=upstreams))
    started.append(server)
    return server


def counter(server: RelayServer, name: str) -> float:
    value = server.metrics.registry.get_sample_value(name)
    return 0.0 if value is None else value


async def test_tree_fans_out_and_every_client_verifies(
    tmp_path: Path, relays: list[RelayServer]
) -> None:
    trainer = Identity.generate()
    weights = os.urandom(20 * SHARD + 123)
    source = model_dir(tmp_path / "model", weights)
    checkpoint = await publish_to_origin(tmp_path / "origin", source, 1, trainer, shard_size=SHARD)
    origin = await relay(relays, tmp_path / "origin")
    first = [await relay(relays, tmp_path / f"r{i}", origin.url) for i in range(2)]
    second = await relay(relays, tmp_path / "r2", first[0].url, first[1].url)
    clients = [[first[0].url, first[1].url], [second.url], [second.url], [second.url]]
    for index, urls in enumerate(clients):
        store = CheckpointStore(tmp_path / f"client{index}", network_id=NETWORK_ID)
        async with RelayShards(urls) as shards:  # the store hints the step
            directory = await store.ensure(checkpoint, shards)
        assert (directory / "model.safetensors").read_bytes() == (
            source / "model.safetensors"
        ).read_bytes()
    total = sum(f.content.size for f in checkpoint_files(checkpoint))
    # Three clients under the second-level relay: it fetched each blob from upstream once.
    assert counter(second, "rollnet_relay_upstream_bytes_total") == total
    assert counter(second, "rollnet_relay_served_bytes_total") == 3 * total
    # The origin served each blob at most once per first-level relay.
    assert counter(origin, "rollnet_relay_served_bytes_total") <= 2 * total
    # The relays learned which step the blobs belong to from the store's hint.
    digests = {s.blake3.hex() for f in checkpoint_files(checkpoint) for s in f.shards}
    assert second.cache.steps == {1: digests}
    page = (await _get(second.url + "/metrics")).decode()
    assert "rollnet_relay_cache_hits_total" in page


def checkpoint_files(checkpoint: object) -> list:  # type: ignore[type-arg]

    assert isinstance(checkpoint, checkpoint_pb2.Checkpoint)
    return list(checkpoint_pb2.CheckpointManifest.FromString(checkpoint.manifest).files)


async def _get(url: str) -> bytes:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        return await response.read()


def _ref(data: bytes) -> common_pb2.BlobRef:
    import blake3

    return common_pb2.BlobRef(blake3=blake3.blake3(data).digest(), size=len(data))


def _checkpoint(step: int, files: dict[str, list[bytes]]) -> checkpoint_pb2.Checkpoint:
    """A freshly keyed trainer's signed checkpoint of ``files`` (path -> its shards' bytes)."""
    manifest = checkpoint_pb2.CheckpointManifest(
        step=step,
        network_id=NETWORK_ID,
        files=[
            checkpoint_pb2.CheckpointFile(
                path=path, content=_ref(b"".join(shards)), shards=[_ref(x) for x in shards]
            )
            for path, shards in files.items()
        ],
    )
    return signed_checkpoint(Identity.generate(), manifest)


async def test_a_leaf_gets_bytes_before_the_origin_has_sent_the_last(
    tmp_path: Path, relays: list[RelayServer]
) -> None:
    upstream = await GatedUpstream().start()
    try:
        data = os.urandom(4 * 1024 * 1024)
        upstream.add(data, gated=True)
        first = await relay(relays, tmp_path / "r0", upstream.url)
        second = await relay(relays, tmp_path / "r1", first.url)
        async with RelayShards([second.url]) as shards:
            import asyncio

            task = asyncio.create_task(shards.fetch_shard(_ref(data)))
            await wait_until(lambda: shards.received_bytes > 0)
            # The leaf holds bytes while the origin has not sent the blob's last byte.
            assert upstream.finished == set()
            upstream.gate.set()
            assert await task == data
    finally:
        await upstream.close()


async def test_a_client_under_the_second_level_gets_bytes_before_the_origin_finishes(
    tmp_path: Path, relays: list[RelayServer]
) -> None:
    """The issue's topology (origin -> 2 relays -> 1 second-level relay -> client) and a
    checkpoint of several shards: the client holds bytes while the origin has not finished
    sending a single shard, the last one included."""
    import asyncio

    upstream = await GatedUpstream().start()
    try:
        pieces = [os.urandom(512 * 1024) for _ in range(4)]
        for piece in pieces:
            upstream.add(piece, gated=True)
        whole = b"".join(pieces)
        checkpoint = _checkpoint(1, {"model.safetensors": pieces})
        first = [await relay(relays, tmp_path / f"r{i}", upstream.url) for i in range(2)]
        second = await relay(relays, tmp_path / "r2", first[0].url, first[1].url)
        store = CheckpointStore(tmp_path / "client", network_id=NETWORK_ID)
        async with RelayShards([second.url]) as shards:
            task = asyncio.create_task(store.ensure(checkpoint, shards))
            await wait_until(lambda: shards.received_bytes > 0)
            assert upstream.finished == set()  # not one shard, so not the last, fully sent
            upstream.gate.set()
            directory = await task
        assert (directory / "model.safetensors").read_bytes() == whole
        assert upstream.finished == {_ref(p).blake3.hex() for p in pieces}
    finally:
        await upstream.close()


async def test_a_relay_killed_mid_transfer_and_the_client_finishes_elsewhere(
    tmp_path: Path, relays: list[RelayServer]
) -> None:
    upstream = await GatedUpstream().start()
    try:
        data = os.urandom(2 * 1024 * 1024)
        upstream.add(data, gated=True)
        doomed = await relay(relays, tmp_path / "a", upstream.url)
        spare = await relay(relays, tmp_path / "b", upstream.url)
        async with RelayShards([doomed.url, spare.url]) as shards:
            import asyncio

            shards.health[spare.url].failures = 1e6  # the doomed relay is picked first
            task = asyncio.create_task(shards.fetch_shard(_ref(data)))
            await wait_until(lambda: shards.received_bytes > 0)
            relays.remove(doomed)
            await doomed.close()
            upstream.gate.set()
            assert await task == data
            assert shards.health[doomed.url].failures >= 1
        # The spare resumed the transfer where the doomed relay stopped.
        assert counter(spare, "rollnet_relay_served_bytes_total") < len(data)
    finally:
        await upstream.close()


async def test_a_relay_that_trickles_bytes_is_left_for_a_faster_one(tmp_path: Path) -> None:
    """A relay sending just enough to beat the read timeout cannot hold a shard: past
    ``slow_after`` at under ``slow_share`` of the best measured bandwidth the client resumes
    from another relay with Range, and samples the slow one less."""
    import asyncio

    from aiohttp import web

    data = os.urandom(1024 * 1024)
    fast = await GatedUpstream().start()
    fast.add(data)

    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = len(data)
        await response.prepare(request)
        for offset in range(0, len(data), 1024):  # 1 KiB every 50 ms: about 20 KiB/s
            await response.write(data[offset : offset + 1024])
            await asyncio.sleep(0.05)
        return response

    app = web.Application()
    app.router.add_get("/v1/blobs/{digest}", trickle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert isinstance(server, asyncio.Server)
    slow = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with RelayShards([slow, fast.url], slow_after=0.5) as shards:
            shards.health[fast.url].bandwidth = 50e6  # measured on earlier shards
            shards.health[fast.url].failures = 1e6  # the slow relay is asked first
            got = await asyncio.wait_for(shards.fetch_shard(_ref(data)), timeout=20)
        assert got == data
        [(_, resumed)] = fast.requests
        assert resumed is not None
        assert resumed.startswith("bytes=")
        assert int(resumed.removeprefix("bytes=").rstrip("-")) > 0
        assert shards.health[slow].failures >= 1
        assert 0 < shards.health[slow].bandwidth < 0.05 * 50e6
    finally:
        await fast.close()
        await runner.cleanup()


async def test_a_corrupted_shard_is_refetched_and_its_relay_reported(
    tmp_path: Path, relays: list[RelayServer]
) -> None:
    trainer = Identity.generate()
    source = model_dir(tmp_path / "model", os.urandom(4 * SHARD))
    checkpoint = await publish_to_origin(tmp_path / "origin", source, 1, trainer, shard_size=SHARD)
    origin = await relay(relays, tmp_path / "origin")
    bad = await relay(relays, tmp_path / "bad", origin.url)
    good = await relay(relays, tmp_path / "good", origin.url)
    weights = next(f for f in checkpoint_files(checkpoint) if f.path == "model.safetensors")
    victim = weights.shards[1]
    stored = tmp_path / "bad" / "blobs" / victim.blake3.hex()
    stored.write_bytes(b"\x00" * victim.size)  # same size, wrong bytes
    reports: list[BadShardReport] = []
    store = CheckpointStore(tmp_path / "client", network_id=NETWORK_ID)
    async with RelayShards(
        [bad.url, good.url], on_bad_shard=reports.append, rng=random.Random(0)
    ) as shards:
        shards.health[good.url].failures = 1e6  # the bad relay is asked first
        directory = await store.ensure(checkpoint, shards)
    assert (directory / "model.safetensors").read_bytes() == (
        source / "model.safetensors"
    ).read_bytes()
    assert [(r.relay, r.blake3) for r in reports] == [(bad.url, victim.blake3)]
    assert shards.health[bad.url].bad_shards == 1


async def test_a_manifest_with_a_bad_signature_is_refused_before_any_fetch(
    tmp_path: Path, relays: list[RelayServer]
) -> None:
    trainer = Identity.generate()
    source = model_dir(tmp_path / "model", os.urandom(SHARD))
    checkpoint = await publish_to_origin(tmp_path / "origin", source, 1, trainer)
    checkpoint.signature = bytes([checkpoint.signature[0] ^ 1]) + checkpoint.signature[1:]
    origin = await relay(relays, tmp_path / "origin")
    store = CheckpointStore(tmp_path / "client", network_id=NETWORK_ID)
    async with RelayShards([origin.url]) as shards:
        with pytest.raises(CheckpointVerificationError, match="signature"):
            await store.ensure(checkpoint, shards)
    assert counter(origin, "rollnet_relay_served_bytes_total") == 0
    assert store.steps() == []


async def test_an_interrupted_client_resumes_and_fetches_only_what_is_missing(
    tmp_path: Path,
) -> None:
    import asyncio

    import blake3

    upstream = await GatedUpstream().start()
    try:
        small, large = os.urandom(1000), os.urandom(1024 * 1024)
        upstream.add(small)
        upstream.add(large, gated=True)
        checkpoint = _checkpoint(3, {"config.json": [small], "model.safetensors": [large]})
        root, partial = tmp_path / "ckpt", tmp_path / "ckpt" / ".relay-partial"
        store = CheckpointStore(root, network_id=NETWORK_ID)
        shards = RelayShards([upstream.url], partial_dir=partial)
        task = asyncio.create_task(store.ensure(checkpoint, shards))
        await wait_until(lambda: shards.received_bytes >= len(small) + len(large) // 2)
        await wait_until(lambda: (root / ".partial-step-3" / "config.json").is_file())
        task.cancel()  # the process is interrupted
        with pytest.raises(asyncio.CancelledError):
            await task
        await shards.aclose()
        # What arrived of the unfinished shard was saved for the next run.
        part = partial / f"{blake3.blake3(large).hexdigest()}.part"
        assert part.stat().st_size == len(large) // 2
        upstream.requests.clear()
        upstream.gate.set()
        # A new process, the same directories.
        store = CheckpointStore(root, network_id=NETWORK_ID)
        async with RelayShards([upstream.url], partial_dir=partial) as shards:
            directory = await store.ensure(checkpoint, shards)
        assert (directory / "model.safetensors").read_bytes() == large
        # Only the missing half of the large file was asked for; the small file not at all.
        assert upstream.requests == [
            (blake3.blake3(large).hexdigest(), f"bytes={len(large) // 2}-")
        ]
    finally:
        await upstream.close()


def test_partial_shards_saved_long_ago_are_deleted_when_a_download_begins(
    tmp_path: Path,
) -> None:
    """A partial shard is kept for the resume that follows its interruption; one of a
    checkpoint superseded meanwhile is never asked for again, and does not pile up."""
    partial = tmp_path / ".relay-partial"
    partial.mkdir()
    stale, fresh = partial / f"{'a' * 64}.part", partial / f"{'b' * 64}.part"
    writing = partial / f".{'c' * 64}.part.tmp"
    for path in (stale, fresh, writing):
        path.write_bytes(b"x" * 10)
    hours_ago = os.stat(fresh).st_mtime - 7 * 3600
    os.utime(stale, (hours_ago, hours_ago))
    os.utime(writing, (hours_ago, hours_ago))
    shards = RelayShards(["http://relay.invalid"], partial_dir=partial)
    shards.hint_step(9)  # the checkpoint store's call before each download
    assert sorted(p.name for p in partial.iterdir()) == sorted([fresh.name, writing.name])
    assert shards.prune_partials(now=os.stat(fresh).st_mtime + 6 * 3600 + 1) == 1
    assert not fresh.exists()
    # Nothing to prune: no directory yet, or none given.
    assert (
        RelayShards(["http://relay.invalid"], partial_dir=tmp_path / "none").prune_partials() == 0
    )
    assert RelayShards(["http://relay.invalid"]).prune_partials() == 0


async def test_an_interrupted_file_of_many_shards_resumes_with_the_shards_missing(
    tmp_path: Path,
) -> None:
    """A large file is many shards: those written before the interruption are checked on
    disk and kept, the one in transit resumes with Range, and only what never arrived is
    asked for."""
    import asyncio

    upstream = await GatedUpstream().start()
    try:
        pieces = [os.urandom(256 * 1024) for _ in range(4)]
        for piece in pieces[:3]:
            upstream.add(piece)
        last = upstream.add(pieces[3], gated=True)
        whole = b"".join(pieces)
        checkpoint = _checkpoint(4, {"model.safetensors": pieces})
        root, partial = tmp_path / "ckpt", tmp_path / "ckpt" / ".relay-partial"
        store = CheckpointStore(root, network_id=NETWORK_ID)
        shards = RelayShards([upstream.url], partial_dir=partial)
        task = asyncio.create_task(store.ensure(checkpoint, shards))

        def three_written() -> bool:
            log = next((root / ".partial-step-4").glob("*.written"), None)
            return log is not None and len(log.read_text().split()) == 3

        await wait_until(three_written)
        await wait_until(lambda: shards.received_bytes >= 3 * len(pieces[0]) + len(pieces[3]) // 2)
        task.cancel()  # the process is interrupted
        with pytest.raises(asyncio.CancelledError):
            await task
        await shards.aclose()
        upstream.requests.clear()
        upstream.gate.set()
        # A new process, the same directories.
        store = CheckpointStore(root, network_id=NETWORK_ID)
        async with RelayShards([upstream.url], partial_dir=partial) as shards:
            directory = await store.ensure(checkpoint, shards)
        assert (directory / "model.safetensors").read_bytes() == whole
        # Three shards came from the disk; of the fourth only the half that never arrived.
        assert store.bytes_resumed == 3 * len(pieces[0])
        assert upstream.requests == [(last, f"bytes={len(pieces[3]) // 2}-")]
        # Nothing of the partial download is left behind.
        assert sorted(p.name for p in root.iterdir()) == [".relay-partial", "step-4"]
        assert sorted(os.listdir(directory)) == [".manifest.pb", "model.safetensors"]
    finally:
        await upstream.close()


async def test_a_kept_shard_that_no_longer_matches_is_fetched_again(tmp_path: Path) -> None:
    """Shards an interrupted download logged as written are checked before they are kept."""
    import blake3

    trainer = Identity.generate()
    source = model_dir(tmp_path / "model", os.urandom(4 * SHARD))
    origin_dir = tmp_path / "origin"
    checkpoint = await publish_to_origin(origin_dir, source, 1, trainer, shard_size=SHARD)
    weights = next(f for f in checkpoint_files(checkpoint) if f.path == "model.safetensors")
    partial = tmp_path / "client" / ".partial-step-1"
    partial.mkdir(parents=True)
    stem = "." + blake3.blake3(b"model.safetensors" + weights.content.blake3).hexdigest()[:32]
    good = (source / "model.safetensors").read_bytes()
    damaged = bytearray(good)
    damaged[SHARD + 7] ^= 1  # shard 1 damaged on disk; shards 0 and 2 intact
    (partial / f"{stem}.part").write_bytes(bytes(damaged))
    (partial / f"{stem}.written").write_text("0\n1\n2\nbogus\n99\n")
    server = await start_relay(RelayConfig(data_dir=origin_dir))
    try:
        store = CheckpointStore(tmp_path / "client", network_id=NETWORK_ID)
        async with RelayShards([server.url]) as shards:
            directory = await store.ensure(checkpoint, shards)
    finally:
        await server.close()
    assert (directory / "model.safetensors").read_bytes() == good
    assert store.bytes_resumed == weights.shards[0].size + weights.shards[2].size


@pytest.mark.slow
async def test_a_chain_of_real_steps_as_deltas_and_a_late_joiner(
    tmp_path: Path, relays: list[RelayServer]
) -> None:
    trainer = Identity.generate()
    steps = write_trainer_steps(tmp_path / "trainer", 3)
    origin_dir = tmp_path / "origin"
    checkpoints = []
    for number, directory in enumerate(steps):
        base = DeltaBase(number - 1, steps[number - 1]) if number else None
        checkpoints.append(
            await publish_to_origin(origin_dir, directory, number, trainer, delta_base=base)
        )
    origin = await relay(relays, origin_dir)
    first = await relay(relays, tmp_path / "r0", origin.url)
    second = await relay(relays, tmp_path / "r1", first.url)
    follower = CheckpointStore(tmp_path / "follower", network_id=NETWORK_ID, keep=2)
    for number, checkpoint in enumerate(checkpoints):
        async with RelayShards([second.url], step=number) as shards:
            directory = await follower.ensure(checkpoint, shards)
        for name in ("model.safetensors", "config.json", "tokenizer.json"):
            assert (directory / name).read_bytes() == (steps[number] / name).read_bytes()
    # Step 0 came whole; every file of steps 1-3 that has a delta (the weights always; a tiny
    # file only when its delta is less than half of it) was rebuilt from it, the rest came whole.
    files = len(checkpoint_files(checkpoints[0]))
    with_delta = [sum(f.HasField("delta") for f in checkpoint_files(c)) for c in checkpoints[1:]]
    assert all(
        f.HasField("delta")
        for c in checkpoints[1:]
        for f in checkpoint_files(c)
        if f.path == "model.safetensors"
    )
    assert follower.delta_files == sum(with_delta)
    assert follower.full_files == files + 3 * files - sum(with_delta)
    weights = next(f for f in checkpoint_files(checkpoints[3]) if f.path == "model.safetensors")
    assert weights.delta.content.size * 10 < weights.content.size
    # A node that joins at step 3 has no base: it gets the full files.
    late = CheckpointStore(tmp_path / "late", network_id=NETWORK_ID)
    async with RelayShards([second.url]) as shards:
        directory = await late.ensure(checkpoints[3], shards)
    assert (directory / "model.safetensors").read_bytes() == (
        steps[3] / "model.safetensors"
    ).read_bytes()
    assert (late.full_files, late.delta_files) == (files, 0)


async def test_shards_no_relay_delivers_come_from_the_coordinator(tmp_path: Path) -> None:
    """A store with relays falls back to the source ensure() is given (the coordinator's blob
    service in workers and validators) for what the relays cannot deliver."""
    trainer = Identity.generate()
    source = model_dir(tmp_path / "model", os.urandom(SHARD))
    origin = tmp_path / "origin"
    checkpoint = await publish_to_origin(origin, source, 1, trainer)

    class OriginFiles:
        async def fetch_shard(self, shard: common_pb2.BlobRef) -> bytes:
            return (origin / "blobs" / shard.blake3.hex()).read_bytes()

    async with RelayShards(["http://127.0.0.1:9"], attempts_per_relay=1) as dead:
        store = CheckpointStore(tmp_path / "client", network_id=NETWORK_ID, relays=dead)
        directory = await store.ensure(checkpoint, OriginFiles())
    assert (directory / "model.safetensors").read_bytes() == (
        source / "model.safetensors"
    ).read_bytes()
    assert dead.health["http://127.0.0.1:9"].failures > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["relay", "--upstream", "ftp://x"], "is not an http:// or https:// URL"),
        (["relay", "--upstream", "http://127.0.0.1:1"], "--upstream needs --data-dir"),
        (["relay", "--origin", "/nonexistent"], "no blobs/ directory"),
        (
            [
                *("relay", "--upstream", "http://127.0.0.1:1", "--data-dir", "d"),
                *("--coordinator", "127.0.0.1:1"),
            ],
            "--coordinator needs --key FILE",
        ),
        (
            [
                "worker",
                "--coordinator",
                "127.0.0.1:1",
                "--key",
                "k",
                "--data-dir",
                "d",
                "--relay",
                "127.0.0.1:7090",
            ],
            "is not an http:// or https:// URL",
        ),
        (
            [
                "validator",
                "--coordinator",
                "127.0.0.1:1",
                "--key",
                "k",
                "--data-dir",
                "d",
                "--relay",
                ",",
            ],
            "give at least one relay URL",
        ),
    ],
)
def test_relay_command_line_mistakes(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from rollnet.reference.cli import main

    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_terminal_progress_draws_one_line_on_a_terminal_only() -> None:
    import io

    from rollnet.sdk.broadcast import TerminalProgress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen, log = Terminal(), io.StringIO()
    TerminalProgress("step 7", stream=log)(5, 10)
    assert log.getvalue() == ""
    progress = TerminalProgress("step 7", stream=screen, hz=1e9)
    progress(0, 2 * 1024 * 1024)
    progress(2 * 1024 * 1024, 2 * 1024 * 1024)
    lines = screen.getvalue().split("\r")[1:]
    assert lines[0].startswith("step 7 [")
    assert "0.0%" in lines[0]
    assert "100.0% 2.0/2.0 MiB" in lines[1]
    assert lines[1].endswith("\n")
