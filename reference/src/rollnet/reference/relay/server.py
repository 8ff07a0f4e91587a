"""The relay's HTTP server (aiohttp): ``GET``/``HEAD /v1/blobs/<blake3 hex>``, ``/metrics``,
``/healthz``.

A relay is a pull-through cache of immutable, content-addressed blobs (checkpoint shards and
deltas). A stored blob is sent with ``sendfile`` (``Range`` and conditional requests included);
a blob still arriving from upstream is streamed from its partial file as it grows (see
:mod:`rollnet.reference.relay.cache`). In origin mode (``upstreams`` empty) the relay serves
the blobs its directory holds and nothing else. Each client address (an IPv6 one: its /64)
gets a token bucket of requests (``rate_limit`` per second, ``burst`` at once); past it the
answer is ``429`` with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rollnet.reference.relay.cache import BlobCache, BlobUnavailable
from rollnet.reference.relay.metrics import RelayMetrics
from rollnet.sdk.broadcast.client import BLOB_PATH
from rollnet.sdk.verifier import network_of

log = logging.getLogger(__name__)

_DIGEST = re.compile(r"[0-9a-f]{64}")
# ASCII digits only (RFC 9110); ``\d`` would take other scripts' digits too.
_RANGE = re.compile(r"bytes=([0-9]*)-([0-9]*)")
_IMMUTABLE = "public, max-age=31536000, immutable"


@dataclass(frozen=True)
class RelayConfig:
    """How a relay runs."""

    data_dir: Path
    """Where blobs are kept (``blobs/``, ``partial/``); the origin's directory in origin mode."""
    upstreams: Sequence[str] = ()
    """Relays or origins to fetch from, in order of preference; empty: origin mode."""
    host: str = "127.0.0.1"
    port: int = 0
    keep_versions: int = 3
    """Checkpoint steps whose blobs are kept."""
    max_bytes: int = 0
    """Most bytes of blobs stored (least recently used ones outside the kept steps go first);
    0: no cap."""
    rate_limit: float = 0.0
    """Requests per second per client address (0: no limit)."""
    burst: int = 0
    """Requests a client address may make at once (0: twice ``rate_limit``, at least 8)."""

    @property
    def origin(self) -> bool:
        """Origin mode: serve ``data_dir/blobs`` only."""
        return not self.upstreams


@dataclass
class _Bucket:
    tokens: float
    stamp: float = field(default_factory=time.monotonic)


class RateLimiter:
    """A token bucket per client address; an IPv6 address counts as its /64 network (one
    subscriber is routed a /64 at least, so buckets per full address would let one client
    take 2**64 of them), as at the coordinator
    (:func:`~rollnet.sdk.verifier.network_of`)."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst or max(8, int(2 * rate))
        self._buckets: dict[str, _Bucket] = {}

    def admit(self, address: str) -> float:
        """0 when a request from ``address`` may go ahead, else seconds until it may."""
        if self.rate <= 0:
            return 0.0
        address = network_of(address)
        now = time.monotonic()
        bucket = self._buckets.get(address)
        if bucket is None:
            if len(self._buckets) > 100_000:  # forget idle addresses rather than grow forever
                self._buckets = {a: b for a, b in self._buckets.items() if now - b.stamp < 60}
            bucket = self._buckets[address] = _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.stamp) * self.rate)
        bucket.stamp = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate


class RelayServer:
    """A running relay; ``url`` is where clients and lower relays reach it."""

    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self.metrics = RelayMetrics()
        self.cache = BlobCache(
            config.data_dir,
            upstreams=config.upstreams,
            metrics=self.metrics,
            keep_versions=config.keep_versions,
            max_bytes=config.max_bytes,
            trusted=config.origin,
        )
        self.limiter = RateLimiter(config.rate_limit, config.burst)
        self.app = web.Application()
        self.app.router.add_get(BLOB_PATH + "{digest}", self.blob)  # GET and HEAD
        self.app.router.add_get("/metrics", self.metrics_page)
        self.app.router.add_get("/healthz", self.health)
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.background: list[asyncio.Task[None]] = []

    @property
    def url(self) -> str:
        """``http://host:port`` of the listening socket."""
        host = self.config.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    async def start(self) -> RelayServer:
        """Bind and serve."""
        self._runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port, backlog=1024)
        await site.start()
        self.port = _bound_port(site)
        self.metrics.stored_bytes.set(self.cache.stored_bytes())
        log.info("relay_started", extra={"url": self.url, "upstreams": list(self.config.upstreams)})
        return self

    async def close(self) -> None:
        """Stop serving, stop fetches and background tasks."""
        for task in self.background:
            task.cancel()
        for task in self.background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._runner is not None:
            await self._runner.cleanup()
        await self.cache.close()

    async def health(self, request: web.Request) -> web.Response:
        """200 while serving."""
        return web.Response(text="ok\n")

    async def metrics_page(self, request: web.Request) -> web.Response:
        """Prometheus text exposition."""
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    def _refuse(self, status: int, message: str, **headers: str) -> web.Response:
        self.metrics.requests.labels(str(status)).inc()
        return web.Response(status=status, text=message + "\n", headers=headers)

    async def blob(self, request: web.Request) -> web.StreamResponse:
        """One blob, whole or a byte range, stored or still arriving."""
        wait = self.limiter.admit(request.remote or "")
        if wait:
            self.metrics.rate_limited.inc()
            return self._refuse(429, "too many requests", **{"Retry-After": str(int(wait) + 1)})
        digest = request.match_info["digest"]
        if not _DIGEST.fullmatch(digest):
            return self._refuse(400, "a blob is named by its BLAKE3 digest: 64 lowercase hex")
        step = request.query.get("step", "")
        if step.isdigit() and not self.config.origin and self.cache.hints_trusted:
            self.cache.note_step(int(step), [digest])
        stored = self.cache.path(digest)
        if stored is not None:
            self.metrics.cache_hits.inc()
            whole = web.FileResponse(stored, chunk_size=1 << 20)
            whole.headers["Cache-Control"] = _IMMUTABLE
            whole.headers["Content-Type"] = "application/octet-stream"
            self.metrics.requests.labels("200").inc()
            self.metrics.served_bytes.inc(stored.stat().st_size)
            return whole
        try:
            joined = digest in self.cache.fetches
            fetch = self.cache.fetch(digest)
            (self.metrics.cache_joins if joined else self.metrics.cache_misses).inc()
            size = await fetch.wait_for_size()
        except BlobUnavailable as error:
            return self._refuse(error.status, str(error))
        span = _byte_range(request.headers.get("Range"), size)
        if span is None:
            return self._refuse(
                416, "range not satisfiable", **{"Content-Range": f"bytes */{size}"}
            )
        start, end, partial = span
        response = web.StreamResponse(status=206 if partial else 200)
        response.headers["Accept-Ranges"] = "bytes"
        response.headers["Cache-Control"] = _IMMUTABLE
        response.headers["Content-Type"] = "application/octet-stream"
        response.content_length = end - start
        if partial:
            response.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        await response.prepare(request)
        self.metrics.requests.labels(str(response.status)).inc()
        if request.method == "HEAD":
            return response
        transport = request.transport
        try:
            if transport is None:
                raise ConnectionResetError("the client went away")
            # Bytes go from the file to the socket with sendfile (no copy through Python; asyncio
            # falls back to reads and writes where the transport cannot, e.g. TLS). The file is
            # opened now: once verified it is renamed into the store, and this handle follows it.
            loop = asyncio.get_running_loop()
            with open(fetch.partial, "rb") as handle:  # noqa: ASYNC230 - a local file, at once
                async for offset, length in fetch.spans(start, end):
                    if transport.is_closing():  # sendfile would raise RuntimeError
                        raise ConnectionResetError("the client went away")
                    await loop.sendfile(transport, handle, offset, length)
                    self.metrics.served_bytes.inc(length)
        except BlobUnavailable:
            # Cut the response short: the client sees a transfer that failed, never a
            # complete response with bytes that do not match.
            if request.transport is not None:
                request.transport.abort()
            return response
        except ConnectionError:
            return response  # the client went away; the fetch goes on for the others
        await response.write_eof()
        return response


def _byte_range(header: str | None, size: int) -> tuple[int, int, bool] | None:
    """``(start, end, is_partial)`` for a ``Range`` header; ``None`` when not satisfiable. A
    header this does not understand (several ranges, other units) gets the whole blob."""
    if not header:
        return 0, size, False
    match = _RANGE.fullmatch(header.strip())
    if match is None:
        return 0, size, False
    first, last = match.groups()
    if not first and not last:
        return 0, size, False
    if not first:
        length = min(_position(last), size)
        return (size - length, size, True) if length else None
    start = _position(first)
    end = min(_position(last) + 1, size) if last else size
    if start >= size or end <= start:
        return None
    return start, end, True


def _position(digits: str) -> int:
    # Past 19 digits a position lies beyond any blob, and int() refuses 4300 digits or more.
    return int(digits) if len(digits) <= 19 else 1 << 63


def _bound_port(site: web.TCPSite) -> int:
    server: Any = site._server
    return int(server.sockets[0].getsockname()[1])


async def start_relay(config: RelayConfig) -> RelayServer:
    """Start a relay (tests and the CLI): ``(await start_relay(config)).url``."""
    return await RelayServer(config).start()
