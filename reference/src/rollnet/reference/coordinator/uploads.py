"""Uploads no record references yet: per-node quota, free-space reserve, orphan sweeping.

A blob's row is written by the transaction of the commitment (or checkpoint) that references it,
so between an upload and that transaction the file belongs to nobody. Without bounds, any
registered node could fill the coordinator's disk with blobs it never commits (or whose
commitments are refused). :class:`PendingUploads` closes that:

* a worker's uploads that nothing references yet count against its quota
  (``upload_quota_bytes``; refused ``UPLOAD_QUOTA_EXCEEDED`` beyond it), and stop counting once a
  commitment records them (:meth:`PendingUploads.settle`);
* no upload may take the store's file system below ``min_free_disk_bytes`` (``STORAGE_FULL``,
  with a retry hint);
* an upload nothing references ``orphan_blob_ttl`` after it arrived is deleted by
  :func:`sweep_orphans`, which also frees its uploader's quota.

Trusted uploaders (trainers, whose checkpoint shards are referenced by their manifest only when
published) are not charged: only the reserve applies to them. On start, files that no blob row
and no checkpoint manifest references are adopted as uploads of unknown origin
(:func:`adopt_unreferenced`), aged from their modification time, so orphans left by a previous
run are swept too.

Deleting races with committing: a commitment (or checkpoint) *pins* the digests it is about to
record (:meth:`PendingUploads.pin`) before it checks that they exist, and a pinned or settled
digest is never deleted. The sweeper deletes under the same lock, so a commitment either finds
the blob gone (``BLOB_NOT_FOUND``) or keeps it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from google.protobuf.message import DecodeError
from sqlalchemy import select
from sqlalchemy.orm import Session

from rollnet.ledger.models import Blob, Checkpoint
from rollnet.reference.coordinator.blobstore import BlobStore
from rollnet.v1 import checkpoint_pb2

log = logging.getLogger(__name__)

UNKNOWN_UPLOADER = ""
"""The uploader of a file found unreferenced on start (charged to nobody)."""

_CHECK_CHUNK = 500
"""Digests per reference query (well under SQLite's bound-parameter limit)."""
_DELETE_CHUNK = 64
"""Files deleted per hold of the lock (a commitment waiting to pin waits at most that long)."""


class QuotaExceeded(Exception):
    """The node's unreferenced uploads would exceed its quota."""


@dataclass(eq=False, slots=True)
class _Pending:
    node_id: str
    size: int
    since: float  # wall-clock seconds, comparable with file modification times


class PendingUploads:
    """Uploads no record references yet, by digest, with each uploader's total."""

    def __init__(self, quota_bytes: int, clock: Callable[[], float] = time.time) -> None:
        self.quota_bytes = quota_bytes
        self.clock = clock
        self._pending: dict[bytes, _Pending] = {}
        self._by_node: Counter[str] = Counter()
        self._pins: Counter[bytes] = Counter()
        self._total = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ accounting
    def reserve(self, node_id: str, digest: bytes, size: int) -> bool:
        """Charge an upload to ``node_id`` before its bytes arrive.

        Returns whether a charge was made (False when the digest is already pending: whoever
        uploaded it first carries it). Raises :class:`QuotaExceeded` when the node's pending
        bytes plus ``size`` would exceed the quota.
        """
        with self._lock:
            if digest in self._pending:
                return False
            used = self._by_node[node_id]
            if used + size > self.quota_bytes:
                raise QuotaExceeded(
                    f"{used} bytes of this node's uploads are not referenced by any commitment "
                    f"yet; {size} more would exceed its quota of {self.quota_bytes} bytes "
                    f"(unreferenced uploads are deleted after the orphan TTL)"
                )
            self._pending[digest] = _Pending(node_id, size, self.clock())
            self._by_node[node_id] += size
            self._total += size
            return True

    def release(self, digest: bytes) -> None:
        """Undo a reservation whose upload failed or found the content already stored."""
        with self._lock:
            self._drop(digest)

    def settle(self, digests: Iterable[bytes]) -> None:
        """These blobs are referenced now: they stop counting and are never swept."""
        with self._lock:
            for digest in digests:
                self._drop(digest)

    def adopt(self, digest: bytes, size: int, since: float) -> None:
        """Track a file of unknown origin (found unreferenced on start) for sweeping."""
        with self._lock:
            if digest not in self._pending:
                self._pending[digest] = _Pending(UNKNOWN_UPLOADER, size, since)
                self._total += size

    def pending_bytes(self, node_id: str | None = None) -> int:
        """Unreferenced bytes of one node, or of all tracked uploads."""
        with self._lock:
            return self._total if node_id is None else self._by_node[node_id]

    def is_pending(self, digest: bytes) -> bool:
        """Whether ``digest`` is an upload nothing references yet."""
        with self._lock:
            return digest in self._pending

    def _drop(self, digest: bytes) -> None:
        entry = self._pending.pop(digest, None)
        if entry is not None:
            self._total -= entry.size
            self._by_node[entry.node_id] -= entry.size
            if self._by_node[entry.node_id] <= 0:
                del self._by_node[entry.node_id]

    # ------------------------------------------------------------------ pins
    @contextlib.contextmanager
    def pin(self, digests: Iterable[bytes]) -> Iterator[None]:
        """Keep ``digests`` from being swept while a record referencing them is written."""
        held = list(digests)
        with self._lock:
            self._pins.update(held)
        try:
            yield
        finally:
            with self._lock:
                self._pins.subtract(held)
                for digest in held:
                    if self._pins[digest] <= 0:
                        del self._pins[digest]

    # ------------------------------------------------------------------ sweeping
    def expired(self, ttl: float) -> list[bytes]:
        """Digests tracked for at least ``ttl`` seconds (candidates: still to be checked)."""
        cutoff = self.clock() - ttl
        with self._lock:
            return [d for d, entry in self._pending.items() if entry.since <= cutoff]

    def delete_unreferenced(
        self, store: BlobStore, candidates: Iterable[bytes], ttl: float
    ) -> tuple[int, int]:
        """Delete candidates still tracked, expired and unpinned; returns (files, bytes).

        The caller has checked that no row references the candidates; one that was settled,
        re-reserved or pinned since is kept.
        """
        files = freed = 0
        chunk: list[bytes] = []
        for digest in candidates:
            chunk.append(digest)
            if len(chunk) == _DELETE_CHUNK:
                deleted, size = self._delete_chunk(store, chunk, ttl)
                files, freed, chunk = files + deleted, freed + size, []
        if chunk:
            deleted, size = self._delete_chunk(store, chunk, ttl)
            files, freed = files + deleted, freed + size
        return files, freed

    def _delete_chunk(self, store: BlobStore, digests: list[bytes], ttl: float) -> tuple[int, int]:
        cutoff = self.clock() - ttl
        files = freed = 0
        with self._lock:
            for digest in digests:
                entry = self._pending.get(digest)
                if entry is None or entry.since > cutoff or self._pins[digest] > 0:
                    continue
                store.remove(digest)
                self._drop(digest)
                files += 1
                freed += entry.size
        return files, freed


def unreferenced(session: Session, digests: list[bytes]) -> list[bytes]:
    """The digests no blob row records (checkpoint shards are excluded by the caller)."""
    left: list[bytes] = []
    for start in range(0, len(digests), _CHECK_CHUNK):
        chunk = digests[start : start + _CHECK_CHUNK]
        names = [d.hex() for d in chunk]
        recorded = set(session.scalars(select(Blob.hash).where(Blob.hash.in_(names))))
        left += [d for d, name in zip(chunk, names, strict=True) if name not in recorded]
    return left


def checkpoint_shards(session: Session) -> set[bytes]:
    """Every shard digest named by a published checkpoint manifest."""
    shards: set[bytes] = set()
    for manifest in session.scalars(select(Checkpoint.manifest)):
        try:
            parsed = checkpoint_pb2.CheckpointManifest.FromString(manifest)
        except DecodeError:  # recorded only after parsing; never expected
            log.error("a recorded checkpoint manifest does not parse; its shards are kept")
            raise
        shards.update(shard.blake3 for item in parsed.files for shard in item.shards)
    return shards


def sweep_orphans(
    pending: PendingUploads, store: BlobStore, session_factory: Callable[[], Session], ttl: float
) -> tuple[int, int]:
    """Delete tracked uploads older than ``ttl`` that nothing references; (files, bytes).

    Blocking: run it on a thread.
    """
    candidates = pending.expired(ttl)
    if not candidates:
        return 0, 0
    with session_factory() as session:
        left = unreferenced(session, candidates)
        if left:
            shards = checkpoint_shards(session)
            left = [d for d in left if d not in shards]
    # Referenced after all: recorded by another replica sharing this blob directory (this one
    # saw the upload, not the commitment), or by a checkpoint. No longer an orphan to track.
    unknown = set(left)
    pending.settle(d for d in candidates if d not in unknown)
    return pending.delete_unreferenced(store, left, ttl)


def adopt_unreferenced(
    pending: PendingUploads, store: BlobStore, session_factory: Callable[[], Session]
) -> int:
    """Track every stored file that no row or manifest references; returns how many.

    Run once on start (blocking: on a thread). Each file is aged from its modification time.
    The store is walked in chunks, so memory stays flat however many blobs it holds.
    """
    adopted = 0
    with session_factory() as session:
        shards = checkpoint_shards(session)
        files = store.stored()
        while chunk := list(itertools.islice(files, _CHECK_CHUNK)):
            left = set(unreferenced(session, [digest for digest, _, _ in chunk])) - shards
            for digest, size, mtime in chunk:
                if digest in left:
                    pending.adopt(digest, size, mtime)
                    adopted += 1
    return adopted


def has_room(store_root: str | os.PathLike[str], size: int, reserve: int) -> bool:
    """Whether storing ``size`` more bytes leaves at least ``reserve`` bytes free."""
    return reserve <= 0 or shutil.disk_usage(store_root).free - size >= reserve
