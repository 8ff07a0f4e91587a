"""Shards from a tree of untrusted relays: a :class:`~rollnet.sdk.checkpoints.ShardSource`.

:class:`RelayShards` fetches each shard over HTTP (``GET /v1/blobs/<blake3 hex>``) from one of
several relays, picked at random in proportion to *success rate x measured bandwidth*, so fast
and reliable relays carry most of the load while every relay keeps a small share (a relay that
failed is tried again as its failures age: healing). Every shard's BLAKE3 digest and size are
checked here before its bytes are handed on; a relay that served a wrong shard is reported
(:attr:`RelayShards.reports`, a warning log line, ``on_bad_shard``, and to the coordinator with
the node's next heartbeat: :meth:`RelayShards.take_relay_reports`) and the shard is fetched
again from another relay. A transfer cut short is resumed with an HTTP ``Range`` request, from
the same relay or another, and when ``partial_dir`` is given the bytes of an unfinished shard
are saved there when its transfer stops (an interrupted process, every relay failing), so the
next run resumes after them.

Nothing a relay serves is trusted: the worst a relay can do is waste a client's time.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import aiohttp
import blake3

from rollnet.v1 import common_pb2, node_service_pb2

log = logging.getLogger(__name__)

BLOB_PATH = "/v1/blobs/"
"""Where relays (and origins) serve blobs: ``BLOB_PATH + <blake3 hex>``."""

_HALF_LIFE_S = 30.0
_FLOOR_SHARE = 0.02


class RelayError(Exception):
    """No relay could deliver a shard that matches its digest."""


class ShardSink(Protocol):
    """Where a shard's bytes go as they arrive (the store's file, at the shard's offset):
    :meth:`RelayShards.fetch_checked_into`."""

    def write(self, position: int, data: bytes) -> None:
        """Put ``data`` at ``position`` within the shard (bytes of an attempt that fails its
        digest are written over by the next)."""

    def read(self, size: int) -> bytes:
        """The shard's first ``size`` bytes as written (to save an unfinished shard)."""


@dataclass
class RelayHealth:
    """What a client has seen of one relay."""

    url: str
    successes: float = 0.0
    failures: float = 0.0
    bad_shards: int = 0
    """Shards it served whose digest did not match (each one reported)."""
    bandwidth: float = 0.0
    """Bytes per second, an exponentially weighted mean of its transfers (0: not measured)."""
    bytes_received: int = 0
    _seen: float = field(default_factory=time.monotonic)

    def decay(self, now: float) -> None:
        """Age successes and failures (half-life 30 s), so a relay that recovered is trusted
        again and one that went bad loses its record of past success."""
        factor = 0.5 ** ((now - self._seen) / _HALF_LIFE_S)
        self.successes *= factor
        self.failures *= factor
        self._seen = now

    @property
    def success_rate(self) -> float:
        """Laplace-smoothed share of successful transfers."""
        return (self.successes + 1.0) / (self.successes + self.failures + 2.0)


@dataclass(frozen=True)
class BadShardReport:
    """A relay served bytes that do not match a shard's digest."""

    relay: str
    blake3: bytes
    detail: str
    step: int | None = None
    """The checkpoint step the shard belongs to, when the client was told."""
    detected_at: float = field(default_factory=time.time)
    """``time.time()`` when the mismatch was found."""

    def to_proto(self) -> node_service_pb2.RelayReport:
        """The report as a heartbeat carries it to the coordinator."""
        report = node_service_pb2.RelayReport(
            relay_url=self.relay, shard_blake3=self.blake3, checkpoint_step=self.step or 0
        )
        report.detected_at.FromNanoseconds(round(self.detected_at * 1e9))
        return report


MAX_PENDING_REPORTS = 64
"""Reports waiting for the coordinator (older ones are dropped past this)."""


class RelayShards:
    """A :class:`~rollnet.sdk.checkpoints.ShardSource` reading from relays (or origins, or a
    plain HTTP cache in front of one: anything serving ``GET /v1/blobs/<hex>`` with ``Range``).

    ``step`` is passed to relays as a hint (``?step=N``) so they keep versions together.
    ``partial_dir``: where the bytes of a shard whose transfer stopped unfinished are kept for
    the next attempt, across restarts (none: an unfinished shard starts over). Bytes saved more
    than ``partial_max_age`` seconds ago are deleted when the next checkpoint's download begins
    (:meth:`hint_step`): a resume comes soon after its interruption, and the shards of a
    checkpoint superseded meanwhile are never asked for again.
    Use as an async context manager, or call :meth:`aclose`.
    """

    def __init__(
        self,
        relays: Sequence[str],
        *,
        step: int | None = None,
        partial_dir: Path | None = None,
        attempts_per_relay: int = 3,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        on_bad_shard: Callable[[BadShardReport], None] | None = None,
        rng: random.Random | None = None,
        slow_after: float = 30.0,
        slow_share: float = 0.05,
        partial_max_age: float = 6 * 3600.0,
    ) -> None:
        urls = [url.rstrip("/") for url in relays if url.strip()]
        if not urls:
            raise ValueError("at least one relay URL is needed")
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"relay URL {url!r} must start with http:// or https://")
        self.health = {url: RelayHealth(url) for url in urls}
        self.step = step
        self.partial_dir = partial_dir
        self.partial_max_age = partial_max_age
        self.attempts = attempts_per_relay * len(urls)
        self.reports: deque[BadShardReport] = deque(maxlen=1000)
        """The newest bad-shard reports (the last 1,000)."""
        self._pending: deque[BadShardReport] = deque(maxlen=MAX_PENDING_REPORTS)
        self.on_bad_shard = on_bad_shard
        self.received_bytes = 0
        """Shard bytes received from relays so far (all attempts)."""
        self.first_byte_at: float | None = None
        """``time.time()`` when the first shard byte arrived (progress lines, benchmarks)."""
        self.slow_after = slow_after
        self.slow_share = slow_share
        """A transfer still running after ``slow_after`` seconds at less than ``slow_share`` of
        the best bandwidth measured among the relays is given up and resumed elsewhere with
        ``Range``: a relay that trickles bytes (just fast enough for the read timeout) cannot
        hold a shard. Relative, so a node whose own link is slow is not affected."""
        self._rng = rng or random.Random()
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout, sock_read=read_timeout
        )
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RelayShards:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=16),
                auto_decompress=False,
                # Shards are megabytes: large reads cost far fewer Python steps per byte.
                read_bufsize=4 << 20,
            )
        return self._session

    def take_relay_reports(self, limit: int) -> list[node_service_pb2.RelayReport]:
        """Up to ``limit`` bad-shard reports not yet taken, oldest first, as a heartbeat carries
        them to the coordinator (:class:`~rollnet.sdk.node.NodeSession` asks before each
        heartbeat, through :meth:`~rollnet.sdk.checkpoints.CheckpointStore.take_relay_reports`).
        Each report is taken once."""
        taken: list[node_service_pb2.RelayReport] = []
        while self._pending and len(taken) < limit:
            taken.append(self._pending.popleft().to_proto())
        return taken

    def hint_step(self, step: int) -> None:
        """Send ``?step=N`` with the next requests (relays keep versions together by it);
        :class:`~rollnet.sdk.checkpoints.CheckpointStore` calls it before each download. Saved
        partial shards older than ``partial_max_age`` are deleted then."""
        self.step = step
        self.prune_partials()

    def prune_partials(self, *, now: float | None = None) -> int:
        """Delete the partial shards saved more than ``partial_max_age`` seconds before ``now``
        (default: the time); how many were deleted."""
        if self.partial_dir is None:
            return 0
        cutoff = (time.time() if now is None else now) - self.partial_max_age
        deleted = 0
        try:
            entries = list(os.scandir(self.partial_dir))
        except FileNotFoundError:
            return 0
        for entry in entries:
            if not entry.name.endswith(".part"):
                continue  # includes a ".<digest>.part.tmp" being written now
            try:
                if entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
                    deleted += 1
            except FileNotFoundError:
                pass
        if deleted:
            log.info("deleted %d partial shards saved before %s", deleted, time.ctime(cutoff))
        return deleted

    def pick(self, exclude: set[str]) -> RelayHealth:
        """A relay sampled in proportion to success rate x bandwidth; ``exclude``d ones only
        when nothing else is left. Unmeasured relays count as the best measured one, so each
        is tried; every relay keeps at least a small share of the picks."""
        now = time.monotonic()
        candidates = [h for h in self.health.values() if h.url not in exclude] or list(
            self.health.values()
        )
        for health in candidates:
            health.decay(now)
        best = max((h.bandwidth for h in candidates), default=0.0) or 1.0
        weights = [h.success_rate * (h.bandwidth or best) for h in candidates]
        floor = _FLOOR_SHARE * max(weights)
        weights = [max(w, floor) for w in weights]
        return self._rng.choices(candidates, weights=weights)[0]

    async def fetch_shard(self, shard: common_pb2.BlobRef) -> bytes:
        """The shard's bytes, checked against its digest and size."""
        return await self.fetch_checked_shard(shard)

    async def fetch_checked_shard(self, shard: common_pb2.BlobRef) -> bytes:
        """The shard's bytes, checked against its digest and size as they arrived (a
        :class:`~rollnet.sdk.checkpoints.CheckedShardSource`: the store does not hash them
        again)."""
        return b"".join(await self.fetch_checked_chunks(shard))

    async def fetch_checked_chunks(self, shard: common_pb2.BlobRef) -> list[bytes]:
        """The same, as the pieces the bytes arrived in (their concatenation is the shard)."""
        buffer = _Partial(self.partial_dir, shard.blake3.hex(), shard.size)
        await self._fetch(shard, buffer)
        return buffer.chunks()

    async def fetch_checked_into(self, shard: common_pb2.BlobRef, sink: ShardSink) -> None:
        """Write the shard to ``sink`` as its bytes arrive, each piece hashed and written
        straight from the buffer it was received in, so a shard never sits in memory whole
        (no fresh pages to fault in per shard: the CPU a byte costs is one receive, one hash and
        one write). Returns once the bytes written match the digest and size; raises
        :class:`RelayError` when no relay delivered them (``sink`` then holds bytes that are
        not the shard, to be written over)."""
        await self._fetch(shard, _Partial(self.partial_dir, shard.blake3.hex(), shard.size, sink))

    async def _fetch(self, shard: common_pb2.BlobRef, buffer: _Partial) -> None:
        digest = shard.blake3.hex()
        tried: set[str] = set()
        last_error = "no attempt"
        try:
            for _ in range(self.attempts):
                relay = self.pick(tried)
                tried.add(relay.url)
                try:
                    await self._transfer(relay, shard, buffer)
                except (aiohttp.ClientError, TimeoutError, _RelayRefused) as error:
                    relay.failures += 1
                    last_error = f"{relay.url}: {error or type(error).__name__}"
                    log.info(
                        "relay_transfer_failed", extra={"relay": relay.url, "error": last_error}
                    )
                    continue
                if buffer.digest() == shard.blake3:
                    relay.successes += 1
                    buffer.discard()
                    return
                if buffer.sources == {relay.url}:
                    self._report(relay, shard, "served bytes that do not match the shard digest")
                last_error = f"{relay.url}: digest mismatch"
                buffer.reset()
        finally:
            buffer.close()
        raise RelayError(f"shard {digest}: no relay delivered it ({last_error})")

    def _report(self, relay: RelayHealth, shard: common_pb2.BlobRef, detail: str) -> None:
        relay.bad_shards += 1
        relay.failures += 5  # bad bytes weigh more than a dropped connection
        report = BadShardReport(relay.url, shard.blake3, detail, step=self.step)
        self.reports.append(report)
        self._pending.append(report)
        log.warning(
            "relay_bad_shard",
            extra={"relay": relay.url, "blake3": shard.blake3.hex(), "detail": detail},
        )
        if self.on_bad_shard is not None:
            self.on_bad_shard(report)

    async def _transfer(
        self, relay: RelayHealth, shard: common_pb2.BlobRef, buffer: _Partial
    ) -> None:
        start = buffer.size
        if start >= shard.size:
            return
        headers = {"Range": f"bytes={start}-"} if start else {}
        params = {"size": str(shard.size)}
        if self.step is not None:
            params["step"] = str(self.step)
        url = f"{relay.url}{BLOB_PATH}{shard.blake3.hex()}"
        began = time.monotonic()
        received = 0
        async with self._http().get(url, headers=headers, params=params) as response:
            if response.status == 200 and start:
                buffer.reset()  # the relay ignored the range: take it from the start
            elif response.status == 206:
                content_range = response.headers.get("Content-Range", "")
                if not content_range.startswith(f"bytes {start}-"):
                    raise _RelayRefused(f"answered range {content_range!r} to bytes={start}-")
            elif response.status != 200:
                raise _RelayRefused(f"HTTP {response.status}")
            buffer.sources.add(relay.url)
            floor = self.slow_share * max(h.bandwidth for h in self.health.values())
            async for chunk in response.content.iter_any():
                if buffer.size + len(chunk) > shard.size:
                    raise _RelayRefused("sent more bytes than the shard has")
                if self.first_byte_at is None:
                    self.first_byte_at = time.time()
                self.received_bytes += len(chunk)
                buffer.append(chunk)
                received += len(chunk)
                elapsed = time.monotonic() - began
                if floor and elapsed > self.slow_after and received / elapsed < floor:
                    relay.bytes_received += received
                    relay.bandwidth = received / elapsed  # measured now: sampled less from here
                    raise _RelayRefused(f"{received / elapsed:,.0f} B/s, too slow")
        relay.bytes_received += received
        elapsed = max(time.monotonic() - began, 1e-6)
        if received >= 64 * 1024:
            rate = received / elapsed
            relay.bandwidth = rate if not relay.bandwidth else 0.7 * relay.bandwidth + 0.3 * rate
        if buffer.size != shard.size:
            raise _RelayRefused(f"ended after {buffer.size} of {shard.size} bytes")


class _RelayRefused(Exception):
    """The relay answered, but not with the shard."""


class _Partial:
    """A shard's bytes so far, hashed as they come, kept in memory or (with ``sink``) written
    there as they come. With ``directory``, bytes
    left over when the transfer stops unfinished (the process is interrupted, every relay
    failed) are saved to ``directory/<digest>.part``, and the next attempt, in this process or
    the next, resumes after them with ``Range``; a shard that arrives whole never touches the
    disk here (the store writes it once, in place)."""

    def __init__(
        self, directory: Path | None, digest: str, size: int, sink: ShardSink | None = None
    ) -> None:
        self.sources: set[str] = set()
        self._sink = sink
        self._hasher = blake3.blake3()
        self._chunks: list[bytes] = []  # written as they came (pwritev)
        self._path = None if directory is None else directory / f"{digest}.part"
        self._finished = False
        self.size = 0
        if self._path is not None and self._path.is_file():
            earlier = self._path.read_bytes()
            if 0 < len(earlier) <= size:
                self.append(earlier)
                self.sources.add("(an earlier run)")

    def append(self, chunk: bytes) -> None:
        if self._sink is None:
            self._chunks.append(chunk)
        else:
            self._sink.write(self.size, chunk)
        self._hasher.update(chunk)
        self.size += len(chunk)

    def digest(self) -> bytes:
        """BLAKE3 of the bytes so far."""
        return bytes(self._hasher.digest())

    def chunks(self) -> list[bytes]:
        """The bytes so far, in the pieces they came in."""
        return list(self._chunks)

    def contents(self) -> bytes:
        if self._sink is not None:
            return self._sink.read(self.size)
        if len(self._chunks) > 1:
            self._chunks = [b"".join(self._chunks)]
        return self._chunks[0] if self._chunks else b""

    def reset(self) -> None:
        self.sources.clear()
        self._hasher = blake3.blake3()
        self._chunks.clear()
        self.size = 0

    def discard(self) -> None:
        """The shard is done with: forget any saved bytes."""
        self._finished = True
        if self._path is not None:
            self._path.unlink(missing_ok=True)

    def close(self) -> None:
        """Save what arrived of an unfinished shard for the next attempt."""
        if self._finished or self._path is None:
            return
        self._finished = True
        if self.size:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._path.with_name(f".{self._path.name}.tmp")
            tmp.write_bytes(self.contents())
            os.replace(tmp, self._path)
        else:
            self._path.unlink(missing_ok=True)


def sample_weights(health: Sequence[RelayHealth]) -> list[float]:
    """The share of picks each relay gets now (for progress lines and tests)."""
    best = max((h.bandwidth for h in health), default=0.0) or 1.0
    weights = [h.success_rate * (h.bandwidth or best) for h in health]
    floor = _FLOOR_SHARE * max(weights, default=1.0)
    weights = [max(w, floor) for w in weights]
    total = math.fsum(weights) or 1.0
    return [w / total for w in weights]


def relay_list(value: str) -> list[str]:
    """Parse ``URL[,URL...]`` (a command-line option); raises ``ValueError``."""
    urls = [part.strip() for part in value.split(",") if part.strip()]
    if not urls:
        raise ValueError("give at least one relay URL")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
    return urls


__all__ = [
    "BLOB_PATH",
    "BadShardReport",
    "RelayError",
    "RelayHealth",
    "RelayShards",
    "ShardSink",
    "relay_list",
    "sample_weights",
]
