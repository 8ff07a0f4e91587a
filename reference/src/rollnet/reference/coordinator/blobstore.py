"""Content-addressed blob storage on the local file system.

A blob lives at ``<root>/<hex[:2]>/<hex>``. Uploads stream into a temporary file in the same
directory while BLAKE3 is computed; only when the digest and size match the declared ones is the
file fsynced and atomically renamed into place. A crash mid-upload therefore leaves at most a
stray temporary file (removed on the next start), never a wrong blob under a good name. Because
names are digests, a duplicate upload is a no-op and concurrent uploads of the same content race
harmlessly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import blake3

_TMP_SUFFIX = ".partial"

log = logging.getLogger(__name__)


class BlobDigestMismatch(ValueError):
    """The uploaded bytes do not hash to the declared digest."""


class BlobSizeMismatch(ValueError):
    """The uploaded byte count differs from the declared size."""


class BlobTooLarge(ValueError):
    """The upload exceeds the size cap."""


@dataclass(frozen=True, slots=True)
class StoredBlob:
    """A verified blob that is now stored."""

    digest: bytes
    size: int
    already_present: bool


class BlobStore:
    """Verified, content-addressed blobs under one directory.

    The most recently stored or read small blobs (up to ``cache_blob_bytes`` each,
    ``cache_bytes`` in all) are also kept in memory: a rollout batch is read back by the
    commitment that follows its upload, and again by the validator's download and the trainer's
    stream. A blob enters the cache only once it is durable on disk, and content addressing
    makes a cached copy the same bytes as the file.
    """

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int,
        cache_bytes: int = 64 << 20,
        cache_blob_bytes: int = 1 << 20,
    ) -> None:
        self.root = root
        self.max_bytes = max_bytes
        root.mkdir(parents=True, exist_ok=True)
        self._root = str(root)
        self._made_dirs: set[str] = set()
        self._cache: OrderedDict[bytes, bytes] = OrderedDict()
        self._cache_limit = cache_bytes
        self._cache_blob_limit = cache_blob_bytes
        self._cached_bytes = 0
        self._lock = threading.Lock()  # reads also run on worker threads

    @property
    def cached_bytes(self) -> int:
        """Bytes of blobs held in memory now (at most :attr:`cache_limit`)."""
        return self._cached_bytes

    @property
    def cache_limit(self) -> int:
        """The most bytes of blobs held in memory (the cache fills up to this, then evicts)."""
        return self._cache_limit

    def location_of(self, digest: bytes) -> str:
        """Where a blob is stored, relative to the store's root (``<hex[:2]>/<hex>``)."""
        name = digest.hex()
        return f"{name[:2]}/{name}"

    def path_of(self, digest: bytes) -> Path:
        """The path a blob with ``digest`` is (or would be) stored at."""
        return self.root / self.location_of(digest)

    def remove_partials(self) -> int:
        """Delete temporary files left by interrupted uploads; returns how many."""
        removed = 0
        for partial in self.root.glob(f"*/*{_TMP_SUFFIX}"):
            partial.unlink(missing_ok=True)
            removed += 1
        return removed

    def streams_to_disk(self, size: int) -> bool:
        """Whether a blob of ``size`` bytes is written to its temporary file as it arrives
        (larger than the in-memory limit) rather than gathered in memory."""
        return size > self._cache_blob_limit

    def exists(self, digest: bytes) -> bool:
        """Whether the blob is stored."""
        return digest in self._cache or os.path.isfile(self._path(digest))

    def size(self, digest: bytes) -> int:
        """The stored blob's size in bytes, without reading it (``FileNotFoundError`` if none)."""
        with self._lock:
            data = self._cache.get(digest)
        return len(data) if data is not None else os.stat(self._path(digest)).st_size

    async def write(
        self,
        digest: bytes,
        size: int,
        chunks: AsyncIterator[bytes],
        on_created: Callable[[int], None] | None = None,
        admit: Callable[[int], None] | None = None,
        on_done: Callable[[bool], None] | None = None,
    ) -> StoredBlob:
        """Store the streamed bytes if they hash to ``digest`` and total ``size``.

        Raises :class:`BlobTooLarge`, :class:`BlobSizeMismatch` or :class:`BlobDigestMismatch`;
        nothing is stored then. Content already stored is drained and not rewritten.

        * ``admit(size)``, called on the event loop just before a new file is stored (not for
          content already stored), may raise to refuse it.
        * ``on_created(size)`` is called (on a worker thread) the moment the file gets its final
          name.
        * ``on_done(stored)`` is called exactly once, when the write is over: ``stored`` when the
          content is stored (anew or already). Once the file is handed to the thread that fsyncs
          and renames it, that thread cannot be stopped: if this call is cancelled then, the
          store finishes on its own and ``on_done`` follows it, not the cancellation.
        """
        finished = False

        def done(stored: bool) -> None:
            nonlocal finished
            if not finished:
                finished = True
                if on_done is not None:
                    on_done(stored)

        deferred = False  # done() is left to the job that outlived a cancelled call
        handed_off = False  # the file is the worker thread's to settle or clean up
        gather = not self.streams_to_disk(size)
        fd, temporary = -1, ""
        try:
            if size > self.max_bytes:
                raise BlobTooLarge(f"blob of {size} bytes exceeds the cap of {self.max_bytes}")
            final = self._path(digest)
            hasher = blake3.blake3()
            received = 0
            # Small blobs (rollout batches) are gathered in memory and written by one call on a
            # worker thread: creating, writing, fsyncing and renaming a file each wait on the
            # file system (whose journal the database's fsyncs share), never on the event loop.
            # Large ones stream into their temporary file as they arrive.
            kept: list[bytes] = []
            if not gather:
                fd, temporary = self._create(final)
            async for chunk in chunks:
                received += len(chunk)
                if received > size:
                    raise BlobSizeMismatch(f"received more than the declared {size} bytes")
                hasher.update(chunk)
                if gather:
                    kept.append(chunk)
                else:
                    _write_all(fd, chunk)
            if received != size:
                raise BlobSizeMismatch(f"received {received} bytes, declared {size}")
            if hasher.digest() != digest:
                raise BlobDigestMismatch(
                    f"content hashes to {hasher.hexdigest()}, declared {digest.hex()}"
                )
            if self.exists(digest):
                done(True)
                return StoredBlob(digest, size, already_present=True)
            if admit is not None:
                admit(size)  # may refuse (raises): nothing is stored then
            handed_off = True
            if gather:
                data = b"".join(kept)
                job = asyncio.ensure_future(asyncio.to_thread(self._store, final, data, on_created))
            else:
                # The fsync waits on the disk for milliseconds: not on the event loop.
                job = asyncio.ensure_future(
                    asyncio.to_thread(_settle_and_close, fd, temporary, final, size, on_created)
                )
            # Shielded: once handed to the executor, the job runs to its end even if this call
            # is cancelled (a cancelled job that had not started would leave the file open).
            try:
                await asyncio.shield(job)
            except asyncio.CancelledError:
                deferred = True
                job.add_done_callback(lambda finished_job: done(_succeeded(finished_job)))
                raise
            if gather:
                self._remember(digest, data)
            done(True)
            return StoredBlob(digest, size, already_present=False)
        finally:
            if not gather and not handed_off and fd >= 0:
                os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary)
            if not deferred:
                done(False)  # nothing, if done(True) came first

    def _store(
        self, final: str, data: bytes, on_created: Callable[[int], None] | None = None
    ) -> None:
        """Write ``data`` to a temporary file, fsync it and rename it to ``final`` (blocking)."""
        fd, path = self._create(final)
        try:
            _write_all(fd, data)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise
        _settle_and_close(fd, path, final, len(data), on_created)

    def read_range(self, digest: bytes, offset: int, length: int) -> tuple[int, bytes]:
        """Return ``(total size, bytes[offset:offset+length])``; length 0 means to the end."""
        with self._lock:
            data = self._cache.get(digest)
            if data is not None:
                self._cache.move_to_end(digest)
        if data is None:
            with open(self._path(digest), "rb") as blob:
                total = os.fstat(blob.fileno()).st_size
                if total > self._cache_blob_limit:
                    blob.seek(min(offset, total))
                    return total, blob.read(length if length else -1)
                data = blob.read()
            self._remember(digest, data, stored_only=True)
        total = len(data)
        start = min(offset, total)
        return total, data[start : start + length] if length else data[start:]

    def detach(self, digest: bytes) -> str | None:
        """Take a blob out of the store at once: renamed to a temporary name (removed on the next
        start if the caller does not unlink it) and dropped from the cache. Returns the new path,
        or None if the blob was not stored. Renaming is a metadata change; the caller unlinks
        the returned path when it likes (freeing a large file's blocks takes a while)."""
        final = self._path(digest)
        doomed = f"{final}.{secrets.token_hex(8)}{_TMP_SUFFIX}"
        try:
            os.rename(final, doomed)
        except FileNotFoundError:
            doomed = ""
        # After the rename: a read that opened the file before it cannot cache it again
        # (_remember checks the name under the same lock).
        with self._lock:
            data = self._cache.pop(digest, None)
            if data is not None:
                self._cached_bytes -= len(data)
        return doomed or None

    def remove(self, digest: bytes) -> None:
        """Delete a stored blob (and its cached copy); a missing one is not an error."""
        doomed = self.detach(digest)
        if doomed is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(doomed)

    def stored(self) -> Iterator[tuple[bytes, int, float]]:
        """Every stored blob as ``(digest, size, modification time)``, lazily. An entry or
        directory that cannot be read is skipped (and logged), not fatal."""
        with os.scandir(self._root) as shards:
            prefixes = sorted(e.name for e in shards if e.is_dir() and len(e.name) == 2)
        for prefix in prefixes:
            try:
                with os.scandir(os.path.join(self._root, prefix)) as entries:
                    listed = [(e.name, e) for e in entries]
            except OSError as error:
                log.warning("blob directory %s/%s unreadable: %s", self._root, prefix, error)
                continue
            for name, entry in listed:
                if len(name) != 64 or not name.startswith(prefix):
                    continue  # temporary files and anything else that is not a blob
                try:
                    digest = bytes.fromhex(name)
                    stat = entry.stat()
                except ValueError:
                    continue
                except OSError as error:
                    if not isinstance(error, FileNotFoundError):
                        log.warning("blob %s unreadable: %s", name, error)
                    continue
                yield digest, stat.st_size, stat.st_mtime

    def _create(self, final: str) -> tuple[int, str]:
        """Open a new temporary file next to ``final``: ``(fd, path)``."""
        temporary = f"{final}.{secrets.token_hex(8)}{_TMP_SUFFIX}"
        directory = os.path.dirname(temporary)
        if directory not in self._made_dirs:
            os.makedirs(directory, exist_ok=True)
            self._made_dirs.add(directory)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            return os.open(temporary, flags, 0o644), temporary
        except FileNotFoundError:  # the directory was removed under us: make it again
            os.makedirs(directory, exist_ok=True)
            return os.open(temporary, flags, 0o644), temporary

    def _path(self, digest: bytes) -> str:
        return os.path.join(self._root, self.location_of(digest))

    def _remember(self, digest: bytes, data: bytes, *, stored_only: bool = False) -> None:
        """Cache ``data``; with ``stored_only``, only if the blob is still stored (a read that
        raced with :meth:`detach` must not bring the blob back)."""
        if not self._cache_limit or len(data) > self._cache_limit:
            return  # no cache (an operator's 0), or larger than all of it
        with self._lock:
            if digest in self._cache:
                return
            if stored_only and not os.path.isfile(self._path(digest)):
                return
            self._cache[digest] = data
            self._cached_bytes += len(data)
            while self._cached_bytes > self._cache_limit:
                _, evicted = self._cache.popitem(last=False)
                self._cached_bytes -= len(evicted)


def _succeeded(job: asyncio.Future[None]) -> bool:
    """Whether a store job that outlived its caller stored its file (its error is logged)."""
    if job.cancelled():
        return False
    error = job.exception()
    if error is not None:
        log.error("storing a blob after its upload was cancelled failed: %r", error)
        return False
    return True


def _settle_and_close(
    fd: int, temporary: str, final: str, size: int, on_created: Callable[[int], None] | None
) -> None:
    """Make the written file durable, give it its final name and close it (or, failing, remove
    it); then tell ``on_created``. Owns ``fd`` and the temporary file from the call on."""
    renamed = False
    try:
        os.fsync(fd)
        os.replace(temporary, final)
        renamed = True
    finally:
        try:
            os.close(fd)
        except OSError as error:  # after a successful fsync and rename, the blob is stored
            log.warning("closing %s: %s", temporary, error)
        if not renamed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
    if on_created is not None:
        try:
            on_created(size)
        except Exception:  # the blob is stored all the same: say so, do not fail the upload
            log.exception("recording the new blob %s failed", os.path.basename(final))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
