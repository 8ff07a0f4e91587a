"""The relay on its own: Range on stored and arriving blobs, names, the per-address limit,
versions kept, a lying upstream, failover, prefetching announced checkpoints, metrics."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import blake3
import pytest
from broadcast_testing import GatedUpstream, model_dir, publish_to_origin

from rollnet.reference.relay import RelayConfig, RelayServer, prefetch_checkpoints, start_relay
from rollnet.sdk.checkpoints import manifest_blobs
from rollnet.sdk.identity import Identity
from rollnet.sdk.testing import NETWORK_ID, wait_until
from rollnet.v1 import checkpoint_pb2


@pytest.fixture
async def upstream() -> AsyncIterator[GatedUpstream]:
    server = await GatedUpstream().start()
    yield server
    await server.close()


@pytest.fixture
async def relays() -> AsyncIterator[list[RelayServer]]:
    started: list[RelayServer] = []
    yield started
    for relay in started:
        await relay.close()


async def relay(
    started: list[RelayServer], root: Path, *upstreams: str, **options: object
) -> RelayServer:
    server = await start_relay(RelayConfig(data_dir=root, upstreams=upstreams, **options))  # type: ignore[arg-type]
    started.append(server)
    return server


async def get(url: str, **headers: str) -> tuple[int, bytes, dict[str, str]]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        return response.status, await response.read(), dict(response.headers)


def sample(server: RelayServer, name: str, **labels: str) -> float:
    return server.metrics.registry.get_sample_value(name, labels or None) or 0.0


async def test_ranges_of_a_stored_blob(
    tmp_path: Path, upstream: GatedUpstream, relays: list[RelayServer]
) -> None:
    data = os.urandom(1000)
    digest = upstream.add(data)
    server = await relay(relays, tmp_path / "r", upstream.url)
    url = f"{server.url}/v1/blobs/{digest}"
    assert (await get(url))[:2] == (200, data)  # fetched, then stored
    assert server.cache.path(digest) is not None
    status, body, headers = await get(url, Range="bytes=10-19")
    assert (status, body, headers["Content-Range"]) == (206, data[10:20], "bytes 10-19/1000")
    assert (await get(url, Range="bytes=-5"))[:2] == (206, data[-5:])
    assert (await get(url, Range="bytes=1000-"))[0] == 416
    assert "immutable" in headers["Cache-Control"]
    assert sample(server, "rollnet_relay_cache_hits_total") == 3
    assert len(upstream.requests) == 1


async def test_ranges_of_a_blob_still_arriving(
    tmp_path: Path, upstream: GatedUpstream, relays: list[RelayServer]
) -> None:
    data = os.urandom(256 * 1024)
    digest = upstream.add(data, gated=True)
    server = await relay(relays, tmp_path / "r", upstream.url)
    url = f"{server.url}/v1/blobs/{digest}"
    whole = asyncio.create_task(get(url))
    tail = asyncio.create_task(get(url, Range=f"bytes={len(data) - 100}-"))
    middle = asyncio.create_task(get(url, Range="bytes=100-199"))
    assert (await middle)[:2] == (206, data[100:200])  # served from the half that arrived
    assert not tail.done()
    upstream.gate.set()
    assert (await whole)[:2] == (200, data)
    status, body, headers = await tail
    assert (status, body) == (206, data[-100:])
    assert headers["Content-Range"] == f"bytes {len(data) - 100}-{len(data) - 1}/{len(data)}"
    # Three requests, one upstream fetch: the others joined it.
    assert len(upstream.requests) == 1
    assert sample(server, "rollnet_relay_cache_misses_total") == 1
    assert sample(server, "rollnet_relay_cache_joins_total") == 2


async def test_names_and_missing_blobs(tmp_path: Path, relays: list[RelayServer]) -> None:
    (tmp_path / "origin" / "blobs").mkdir(parents=True)
    origin = await relay(relays, tmp_path / "origin")
    assert (await get(f"{origin.url}/v1/blobs/{'A' * 64}"))[0] == 400
    assert (await get(f"{origin.url}/v1/blobs/..%2F..%2Fetc%2Fpasswd"))[0] in (400, 404)
    assert (await get(f"{origin.url}/v1/blobs/{'0' * 64}"))[0] == 404
    assert sample(origin, "rollnet_relay_requests_total", status="404") == 1


async def test_the_limit_per_address(
    tmp_path: Path, upstream: GatedUpstream, relays: list[RelayServer]
) -> None:
    digest = upstream.add(b"x" * 100)
    server = await relay(relays, tmp_path / "r", upstream.url, rate_limit=0.5, burst=2)
    url = f"{server.url}/v1/blobs/{digest}"
    assert [(await get(url))[0] for _ in range(2)] == [200, 200]
    status, _, headers = await get(url)
    assert status == 429
    assert int(headers["Retry-After"]) >= 1
    assert sample(server, "rollnet_relay_rate_limited_total") == 1


def test_an_ipv6_client_is_limited_by_its_slash_64() -> None:
    """One subscriber holds a /64: new addresses in it share one bucket, as at the
    coordinator; other networks and IPv4 addresses have their own."""
    from rollnet.reference.relay.server import RateLimiter

    limiter = RateLimiter(0.001, 2)
    assert limiter.admit("2001:db8:0:1::1") == 0.0
    assert limiter.admit("2001:db8:0:1::2") == 0.0
    assert limiter.admit("2001:db8:0:1:ffff:ffff:ffff:ffff") > 0
    assert limiter.admit("2001:db8:0:2::1") == 0.0
    assert limiter.admit("::ffff:192.0.2.7") == 0.0  # IPv4-mapped: the IPv4 address's bucket
    assert limiter.admit("192.0.2.7") == 0.0
    assert limiter.admit("192.0.2.7") > 0
    assert limiter.admit("192.0.2.8") == 0.0


async def test_only_the_newest_versions_are_kept(
    tmp_path: Path, upstream: GatedUpstream, relays: list[RelayServer]
) -> None:
    old, shared, new = (upstream.add(os.urandom(100)) for _ in range(3))
    server = await relay(relays, tmp_path / "r", upstream.url, keep_versions=1)
    for digest in (old, shared):
        assert (await get(f"{server.url}/v1/blobs/{digest}?step=1"))[0] == 200
    for digest in (shared, new):
        assert (await get(f"{server.url}/v1/blobs/{digest}?step=2"))[0] == 200
    assert server.cache.path(old) is None
    assert server.cache.path(shared) is not None
    assert server.cache.path(new) is not None
    assert sample(server, "rollnet_relay_blobs_evicted_total") == 1
    # Once versions follow signed manifests (a relay watching the coordinator), a client's
    # claim of a far-future step evicts nothing.
    server.cache.hints_trusted = False
    assert (await get(f"{server.url}/v1/blobs/{old}?step=99"))[0] == 200
    assert set(server.cache.steps) == {2}
    assert server.cache.path(shared) is not None


async def test_past_its_cap_the_least_recently_used_blob_goes(
    tmp_path: Path, upstream: GatedUpstream, relays: list[RelayServer]
) -> None:
    first, second, third = (upstream.add(os.urandom(100)) for _ in range(3))
    server = await relay(relays, tmp_path / "r", upstream.url, max_bytes=250)
    for digest in (first, second, first, third):  # the second is now the least recently used
        assert (await get(f"{server.url}/v1/blobs/{digest}"))[0] == 200
    assert server.cache.path(second) is None
    assert server.cache.path(first) is not None
    assert server.cache.path(third) is not None
    assert sample(server, "rollnet_relay_stored_bytes") == 200
    # A restarted relay knows what it holds.
    await server.close()
    relays.remove(server)
    again = await relay(relays, tmp_path / "r", upstream.url, max_bytes=250)
    assert again.cache.stored_bytes() == 200


async def test_a_lying_upstream_does_not_poison_the_relay(
    tmp_path: Path, upstream: GatedUpstream, relays: list[RelayServer]
) -> None:
    data = os.urandom(10_000)
    digest = blake3.blake3(data).hexdigest()
    upstream.blobs[digest] = b"\x00" * len(data)  # served under the wrong name
    server = await relay(relays, tmp_path / "r", upstream.url)
    # Refused (502) when the mismatch is found before the response starts, cut short after:
    # never a complete response with the wrong bytes.
    try:
        status, _, _ = await get(f"{server.url}/v1/blobs/{digest}")
    except aiohttp.ClientPayloadError:
        status = None
    assert status in (None, 502)
    # A client already receiving when the mismatch is found sees its transfer cut short.
    other = os.urandom(200_000)
    other_digest = blake3.blake3(other).hexdigest()
    upstream.blobs[other_digest] = b"\x01" * len(other)
    upstream.gated.add(other_digest)
    receiving = asyncio.create_task(get(f"{server.url}/v1/blobs/{other_digest}"))
    await wait_until(lambda: other_digest in server.cache.fetches)
    await wait_until(lambda: server.cache.fetches[other_digest].received > 0)
    upstream.gate.set()
    with pytest.raises(aiohttp.ClientPayloadError):
        await receiving
    assert server.cache.path(other_digest) is None
    await wait_until(lambda: digest not in server.cache.fetches)
    assert server.cache.path(digest) is None
    assert not any((tmp_path / "r" / "partial").iterdir())


async def test_an_upstream_claiming_another_size_stores_nothing(
    tmp_path: Path, upstream: GatedUpstream, relays: list[RelayServer]
) -> None:
    """A blob a signed manifest sizes (a relay watching the coordinator), or one larger than
    the relay's cap, is refused when the upstream claims another size, before a byte is
    written: a hostile upstream cannot fill the disk with a blob that could never match."""
    data = os.urandom(10_000)
    digest = upstream.add(data)
    huge = upstream.add(os.urandom(5_000))
    server = await relay(relays, tmp_path / "r", upstream.url, max_bytes=4_000)
    server.cache.note_step(1, [digest], {digest: 9_999})
    assert (await get(f"{server.url}/v1/blobs/{digest}"))[0] == 502
    assert (await get(f"{server.url}/v1/blobs/{huge}"))[0] == 502
    assert sample(server, "rollnet_relay_upstream_bytes_total") == 0
    assert server.cache.path(digest) is None
    # The size the manifest signs is taken.
    server.cache.note_step(1, [digest], {digest: len(data)})
    server.cache.max_bytes = 0
    assert (await get(f"{server.url}/v1/blobs/{digest}"))[:2] == (200, data)


async def test_an_upstream_killed_mid_transfer_is_resumed_from_the_next(
    tmp_path: Path, upstream: GatedUpstream, relays: list[RelayServer]
) -> None:
    """A relay whose upstream dies while a blob streams through it resumes the blob from its
    next upstream with Range; its client, already receiving, gets the whole blob."""
    data = os.urandom(2 * 1024 * 1024)
    digest = upstream.add(data, gated=True)
    spare = await GatedUpstream().start()
    try:
        spare.add(data)
        server = await relay(relays, tmp_path / "r", upstream.url, spare.url)
        request = asyncio.create_task(get(f"{server.url}/v1/blobs/{digest}"))
        await wait_until(lambda: sample(server, "rollnet_relay_upstream_bytes_total") > 0)
        assert upstream._runner is not None
        await upstream._runner.cleanup()  # killed: the half-sent response is cut off
        status, body, _ = await request
        assert (status, body == data) == (200, True)
        assert spare.requests == [(digest, f"bytes={len(data) // 2}-")]
        assert sample(server, "rollnet_relay_upstream_bytes_total") == len(data)
        assert sample(server, "rollnet_relay_upstream_errors_total") == 1
    finally:
        await spare.close()


async def test_a_dead_upstream_is_skipped(
    tmp_path: Path, upstream: GatedUpstream, relays: list[RelayServer]
) -> None:
    data = os.urandom(5000)
    digest = upstream.add(data)
    server = await relay(relays, tmp_path / "r", "http://127.0.0.1:9", upstream.url)
    assert (await get(f"{server.url}/v1/blobs/{digest}"))[:2] == (200, data)
    assert sample(server, "rollnet_relay_upstream_errors_total") >= 1


async def test_announced_checkpoints_are_prefetched(
    tmp_path: Path, relays: list[RelayServer]
) -> None:
    trainer = Identity.generate()
    source = model_dir(tmp_path / "model", os.urandom(300_000))
    checkpoint = await publish_to_origin(
        tmp_path / "origin", source, 4, trainer, shard_size=100_000
    )
    forged = checkpoint_pb2.Checkpoint()
    forged.CopyFrom(checkpoint)
    forged.signature = bytes(64)
    origin = await relay(relays, tmp_path / "origin")
    server = await relay(relays, tmp_path / "r", origin.url)

    async def announced() -> AsyncIterator[checkpoint_pb2.Checkpoint]:
        yield forged  # refused: its blobs are not fetched
        yield checkpoint

    await prefetch_checkpoints(server.cache, announced(), network_id=NETWORK_ID)
    manifest = checkpoint_pb2.CheckpointManifest.FromString(checkpoint.manifest)
    digests = {ref.blake3.hex() for _, ref in manifest_blobs(manifest)}
    assert all(server.cache.path(d) is not None for d in digests)
    assert sample(server, "rollnet_relay_prefetched_blobs_total") == len(digests)
    assert server.cache.steps == {4: digests}
    page = (await get(f"{server.url}/metrics"))[1].decode()
    assert f"rollnet_relay_prefetched_blobs_total {float(len(digests))}" in page
