"""The relay's blob store: verified blobs on disk, fetches in flight, versions kept.

A blob is fetched from upstream once however many clients ask for it: the first request starts
a :class:`Fetch`, which writes the bytes to a partial file as they arrive, and every request
(the first and all later ones, with or without ``Range``) streams from that file as far as it
has got, waiting for more. So a relay passes bytes down the tree while they are still coming
up: a tree of depth d costs about one shard's time plus d round trips, not d shard times.

When the last byte is in, the BLAKE3 digest (hashed as the bytes arrive) must equal the name;
only then is the file renamed into ``blobs/`` and served from there. A blob that does not match
is dropped and its clients' responses are cut short, so no client receives a complete wrong
blob from this relay (clients check digests all the same: a relay is not trusted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import aiohttp
import blake3

from rollnet.reference.relay.metrics import RelayMetrics
from rollnet.sdk.broadcast.client import BLOB_PATH

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


class BlobUnavailable(Exception):
    """No upstream could deliver the blob (or it did not match its digest)."""

    def __init__(self, message: str, *, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Fetch:
    """One blob coming from upstream, readable while it arrives."""

    digest: str
    partial: Path
    size: int | None = None
    received: int = 0
    done: bool = False
    error: BlobUnavailable | None = None
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def wait_for_size(self) -> int:
        """The blob's size, once upstream has said it."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.size is not None or self.error is not None)
        if self.error is not None:
            raise self.error
        assert self.size is not None
        return self.size

    def readable(self) -> int:
        """Bytes a client may be sent now: all once verified; until then all but the last, so
        no response completes before the digest is checked."""
        if self.done:
            return self.received
        return min(self.received, (self.size or 0) - 1)

    async def spans(self, start: int, end: int) -> AsyncIterator[tuple[int, int]]:
        """``(offset, length)`` spans of ``[start, end)`` as they become readable in
        :attr:`partial` (a client sends them from the file, with ``sendfile``); raises if the
        fetch fails. The span that ends with the blob's last byte comes only after the digest
        matched, and so does the end of an empty range at the blob's end."""
        position = start
        while position < end:
            async with self.changed:
                await self.changed.wait_for(
                    lambda at=position: self.readable() > at or self.error is not None  # type: ignore[misc]
                )
                available = self.readable()
            if self.error is not None:
                raise self.error
            stop = min(available, end)
            yield position, stop - position
            position = stop
        if end == self.size:  # an empty blob, too, is sent only once verified
            async with self.changed:
                await self.changed.wait_for(lambda: self.done or self.error is not None)
            if self.error is not None:
                raise self.error


class BlobCache:
    """Blobs under ``root/blobs`` (verified), in-flight fetches under ``root/partial``.

    ``upstreams``: base URLs of relays or origins to fetch from (tried in turn, resuming with
    ``Range`` on the next after a failure); empty for an origin, which serves ``root/blobs``
    only. ``keep_versions``: how many checkpoint steps' blobs are kept (steps are learned from
    the ``step`` hint of requests and from prefetched manifests); blobs of older steps are
    deleted. ``max_bytes`` (0: none) caps the bytes stored: past it the least recently used
    blobs that no kept step names are deleted.
    """

    def __init__(
        self,
        root: Path,
        *,
        upstreams: Sequence[str],
        metrics: RelayMetrics,
        keep_versions: int = 3,
        max_bytes: int = 0,
        trusted: bool = False,
    ) -> None:
        self.root = root
        self.blobs = root / "blobs"
        self.partial_dir = root / "partial"
        self.upstreams = [url.rstrip("/") for url in upstreams]
        self.metrics = metrics
        self.keep_versions = keep_versions
        self.max_bytes = max_bytes
        self.trusted = trusted
        self.fetches: dict[str, Fetch] = {}
        self.steps: dict[int, set[str]] = {}
        self.sizes: dict[str, int] = {}
        """Blob sizes the signed manifests of kept steps give (a relay watching the
        coordinator): an upstream that claims another size is refused before a byte is
        stored, so it cannot fill the disk with a blob that could never match."""
        self.hints_trusted = True
        """Whether clients' ``?step=`` hints decide which versions are kept. A relay that
        watches the coordinator learns steps from signed manifests and turns this off, so a
        client claiming a far-future step cannot make it drop the blobs everyone needs."""
        self._session: aiohttp.ClientSession | None = None
        self._next_upstream = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.blobs.mkdir(parents=True, exist_ok=True)
        # Stored blobs, least recently used first, with their sizes.
        self._stored: OrderedDict[str, int] = OrderedDict()
        found = []
        for entry in os.scandir(self.blobs):
            with contextlib.suppress(OSError):
                stat = entry.stat()
                found.append((stat.st_mtime, entry.name, stat.st_size))
        for _, name, size in sorted(found):
            self._stored[name] = size
        if not trusted:
            shutil_rmtree(self.partial_dir)
            self.partial_dir.mkdir(parents=True, exist_ok=True)

    async def close(self) -> None:
        """Stop fetches and close upstream connections."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._session is not None:
            await self._session.close()

    def path(self, digest: str) -> Path | None:
        """The stored file of ``digest``, if it is complete here (and now the most recently
        used)."""
        candidate = self.blobs / digest
        if not candidate.is_file():
            return None
        if digest in self._stored:
            self._stored.move_to_end(digest)
        return candidate

    def stored_bytes(self) -> int:
        """Bytes of the blobs stored."""
        if self.trusted:  # an origin's directory is written by the trainer, not by this cache
            total = 0
            for entry in os.scandir(self.blobs):
                with contextlib.suppress(OSError):
                    total += entry.stat().st_size
            return total
        return sum(self._stored.values())

    def _evict(self, digest: str) -> None:
        self._stored.pop(digest, None)
        with contextlib.suppress(FileNotFoundError):
            (self.blobs / digest).unlink()
            self.metrics.blobs_evicted.inc()

    def _enforce_cap(self, newest: str) -> None:
        if not self.max_bytes:
            return
        total = sum(self._stored.values())
        if total <= self.max_bytes:
            return
        kept = sorted(self.steps)[-self.keep_versions :]
        protected = set().union(*(self.steps[s] for s in kept)) if kept else set()
        for digest in list(self._stored):
            if total <= self.max_bytes:
                break
            # Never the blob just stored: requests that joined its fetch still open it.
            if digest in protected or digest in self.fetches or digest == newest:
                continue
            total -= self._stored[digest]
            self._evict(digest)

    def note_step(
        self, step: int, digests: Sequence[str], sizes: Mapping[str, int] | None = None
    ) -> None:
        """Tie ``digests`` to checkpoint ``step``, and drop the blobs of steps no longer kept.
        ``sizes``: the blobs' sizes, from a signed manifest (:attr:`sizes`)."""
        self.steps.setdefault(step, set()).update(digests)
        if sizes:
            self.sizes.update(sizes)
        kept = sorted(self.steps)[-self.keep_versions :]
        doomed = [s for s in self.steps if s not in kept]
        if not doomed:
            return
        keep = set().union(*(self.steps[s] for s in kept))
        for old in doomed:
            for digest in self.steps.pop(old) - keep:
                self.sizes.pop(digest, None)
                if digest not in self.fetches:
                    self._evict(digest)
        self.metrics.stored_bytes.set(self.stored_bytes())

    def fetch(self, digest: str) -> Fetch:
        """The fetch of ``digest`` in flight, started now if there is none."""
        current = self.fetches.get(digest)
        if current is not None:
            return current
        if not self.upstreams:
            raise BlobUnavailable(f"blob {digest} is not here", status=404)
        current = Fetch(digest, self.partial_dir / f"{digest}.{secrets.token_hex(4)}")
        current.partial.touch()
        self.fetches[digest] = current
        self.metrics.inflight.inc()
        task = asyncio.create_task(self._run(current))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return current

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, connect=10, sock_read=60),
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=32),
                auto_decompress=False,
                # Shards are megabytes: large reads cost far fewer Python steps per byte.
                read_bufsize=4 << 20,
            )
        return self._session

    async def _run(self, fetch: Fetch) -> None:
        hasher = blake3.blake3()
        errors: list[str] = []
        # Every upstream said 404: the blob is nowhere, which is not a gateway's failure (a
        # 502 would have clients retry what cannot come).
        nowhere = True
        try:
            # Unbuffered: each chunk reaches the OS at once, where readers of the partial file
            # see it; writes land in the page cache, so they do not hold up the loop.
            with open(fetch.partial, "wb", buffering=0) as out:  # noqa: ASYNC230
                for attempt in range(2 * len(self.upstreams)):
                    upstream = self.upstreams[(self._next_upstream + attempt) % len(self.upstreams)]
                    try:
                        await self._pull(fetch, upstream, out, hasher)
                        break
                    except (aiohttp.ClientError, TimeoutError, BlobUnavailable) as error:
                        errors.append(f"{upstream}: {error or type(error).__name__}")
                        self.metrics.upstream_errors.inc()
                        nowhere = nowhere and getattr(error, "status", 0) == 404
                else:
                    status = 404 if nowhere else 502
                    raise BlobUnavailable("; ".join(errors[-3:]) or "no upstream", status=status)
                self._next_upstream += 1
            if hasher.hexdigest() != fetch.digest:
                raise BlobUnavailable(f"upstream sent bytes that do not match {fetch.digest}")
            os.replace(fetch.partial, self.blobs / fetch.digest)
            fetch.partial = self.blobs / fetch.digest
            self._stored[fetch.digest] = fetch.received
            async with fetch.changed:
                fetch.done = True
                fetch.changed.notify_all()
            self.fetches.pop(fetch.digest, None)  # not in flight: the cap may take it
            self._enforce_cap(fetch.digest)
            self.metrics.stored_bytes.set(self.stored_bytes())
        except BlobUnavailable as error:
            log.warning("relay_fetch_failed", extra={"blake3": fetch.digest, "error": str(error)})
            await self._fail(fetch, error)
        except BaseException as error:
            await self._fail(fetch, BlobUnavailable(f"fetch stopped: {error!r}"))
            raise
        finally:
            self.fetches.pop(fetch.digest, None)
            self.metrics.inflight.dec()

    async def _fail(self, fetch: Fetch, error: BlobUnavailable) -> None:
        async with fetch.changed:
            fetch.error = error
            fetch.changed.notify_all()
        with contextlib.suppress(FileNotFoundError):
            fetch.partial.unlink()

    async def _pull(
        self, fetch: Fetch, upstream: str, out: BinaryIO, hasher: blake3.blake3
    ) -> None:
        headers = {"Range": f"bytes={fetch.received}-"} if fetch.received else {}
        url = f"{upstream}{BLOB_PATH}{fetch.digest}"
        async with self._http().get(url, headers=headers) as response:
            if response.status == 404:
                raise BlobUnavailable(f"{upstream} does not have it", status=404)
            if fetch.received and response.status != 206:
                raise BlobUnavailable(f"{upstream} did not resume at {fetch.received}")
            if response.status not in (200, 206):
                raise BlobUnavailable(f"{upstream} answered HTTP {response.status}")
            total = _total_size(response, fetch.received)
            signed = self.sizes.get(fetch.digest)
            if signed is not None and total != signed:
                raise BlobUnavailable(f"{upstream} says {total} bytes, the manifest {signed}")
            if self.max_bytes and total > self.max_bytes:
                raise BlobUnavailable(f"{upstream} says {total} bytes, over the relay's cap")
            if fetch.size is None:
                async with fetch.changed:
                    fetch.size = total
                    fetch.changed.notify_all()
            elif total != fetch.size:
                raise BlobUnavailable(f"{upstream} says {total} bytes, not {fetch.size}")
            async for chunk in response.content.iter_chunked(4 * _CHUNK):
                if fetch.received + len(chunk) > fetch.size:
                    raise BlobUnavailable(f"{upstream} sent more than {fetch.size} bytes")
                out.write(chunk)
                hasher.update(chunk)
                self.metrics.upstream_bytes.inc(len(chunk))
                async with fetch.changed:
                    fetch.received += len(chunk)
                    fetch.changed.notify_all()
        if fetch.received != fetch.size:
            raise BlobUnavailable(f"{upstream} stopped at {fetch.received} of {fetch.size} bytes")


def _total_size(response: aiohttp.ClientResponse, start: int) -> int:
    if response.status == 206:
        content_range = response.headers.get("Content-Range", "")
        _, _, total = content_range.partition("/")
        if not content_range.startswith(f"bytes {start}-") or not total.isdigit():
            raise BlobUnavailable(f"bad Content-Range {content_range!r} for bytes={start}-")
        return int(total)
    length = response.headers.get("Content-Length")
    if length is None or not length.isdigit():
        raise BlobUnavailable("upstream gave no Content-Length")
    return int(length)


def shutil_rmtree(path: Path) -> None:
    """Remove a directory tree if it is there (leftover partial files of a previous run)."""
    shutil.rmtree(path, ignore_errors=True)
