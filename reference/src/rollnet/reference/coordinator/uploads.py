"""Uploads no record references yet: per-node quota, free-space reserve, orphan sweeping.

A blob's row is written by the transaction of the commitment (or checkpoint) that references it,
so between an upload and that transaction the file belongs to nobody. Without bounds, any
registered node could fill the coordinator's disk with blobs it never commits (or whose
commitments are refused). :class:`PendingUploads` closes that:

* a worker is charged, against ``upload_quota_bytes``, for every upload it is streaming (from
  the header, whatever the content: it may be swept before the stream ends) and for every file
  its uploads created that nothing references yet (refused ``UPLOAD_QUOTA_EXCEEDED`` beyond it).
  The stream that creates a file owns it; a commitment that records it frees it
  (:meth:`PendingUploads.settle`). Charges are in whole file-system blocks (a file takes at
  least one), so many tiny files cost what they take on the disk;
* no upload may take the store's file system below ``min_free_disk_bytes``, counting the bytes
  of every upload still streaming, small ones held in memory in whole blocks (``STORAGE_FULL``,
  with a retry hint);
* every tracked file is looked up at each sweep (:func:`sweep_orphans`): one a record references
  is settled (another replica may have recorded it), one nothing references ``orphan_blob_ttl``
  after it arrived is deleted, freeing its uploader's quota.

Trusted uploaders (trainers) are not charged, but their files are tracked all the same: a shard
no published manifest names is an orphan too. On start, files that no blob row and no manifest
references are adopted as uploads of unknown origin (:func:`adopt_unreferenced`), aged from
their modification time, so orphans left by a previous run are swept too.

Deleting races with recording: a commitment (or checkpoint) *pins* the digests it is about to
record (:meth:`PendingUploads.pin`) before it checks that they exist, until its row is written
(the recording runs to its end even if its caller goes away), and a pinned or settled digest is
never deleted. The sweeper takes a file away under the same lock (a rename), so a commitment
either finds the blob gone (``BLOB_NOT_FOUND``) or keeps it.
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
from sqlalchemy.orm import Session

from rollnet.ledger import artifacts
from rollnet.reference.coordinator.blobstore import BlobStore
from rollnet.sdk.checkpoints import manifest_blobs
from rollnet.v1 import checkpoint_pb2

log = logging.getLogger(__name__)

UNKNOWN_UPLOADER = ""
"""The uploader of a file found unreferenced on start (charged to nobody)."""

_CHECK_CHUNK = 500
"""Digests per reference query (well under SQLite's bound-parameter limit)."""


UPLOAD_STREAMS_PER_LEASE = 2
"""A worker's uploads streaming at once, per lease it may hold (``max_leases_per_node``): one
batch per lease, and a retry's stream while the coordinator has yet to see the first one end."""


class QuotaExceeded(Exception):
    """The node's unreferenced uploads would exceed its quota."""


@dataclass(eq=False, slots=True)
class _Pending:
    node_id: str  # UNKNOWN_UPLOADER: charged to nobody (a trainer's upload, or found on start)
    size: int
    since: float  # wall-clock seconds, comparable with file modification times


@dataclass(eq=False, slots=True)
class Reservation:
    """One upload stream's claim, from its header until :meth:`PendingUploads.finish`."""

    node_id: str | None  # None: a trusted uploader (never charged)
    digest: bytes
    size: int
    charged: bool  # whether ``size`` is charged to ``node_id`` for this stream
    resend: bool = False  # a free re-send of a file the node owns
    in_memory: bool = False  # gathered in memory until stored (not yet on the disk)
    received: int = 0


def footprint(size: int, block_bytes: int) -> int:
    """Bytes a file of ``size`` bytes takes on a file system of ``block_bytes`` blocks: whole
    blocks, at least one (an empty file still takes an inode and a directory entry)."""
    return max(1, -(-size // block_bytes)) * block_bytes


def block_size(root: str | os.PathLike[str]) -> int:
    """The file system's allocation unit under ``root`` (its fragment size)."""
    stats = os.statvfs(root)
    return max(stats.f_frsize or stats.f_bsize, 1)


class PendingUploads:
    """Stored uploads no record references yet, by digest, and every node's charge.

    A node is charged for the uploads it is streaming (their declared size, from the header) and
    for the files its uploads created that nothing references yet. Accounting is per stream, not
    per digest: two streams of the same content are both charged while they run, and the one
    whose bytes become the file owns it. Re-sending a file the node already owns (a retry whose
    answer was lost: same digest, same size, one at a time) is not charged again, unless the
    file is gone by the end and the re-send would store it anew.

    Every size is counted as the file would take on the disk, in whole ``block_bytes`` blocks
    (1: exact bytes), for the quota, the tracked total and the bytes held in memory alike.

    A node may stream at most ``max_streams`` uploads at once (None: no cap): the quota alone
    would let one node hold a thousand streams of 1 MiB open (slowloris), each with a temporary
    file, and exhaust the coordinator's file descriptors.
    """

    def __init__(
        self,
        quota_bytes: int,
        clock: Callable[[], float] = time.time,
        *,
        block_bytes: int = 1,
        max_streams: int | None = None,
    ) -> None:
        if block_bytes < 1:
            raise ValueError(f"block_bytes must be at least 1, not {block_bytes}")
        if max_streams is not None and max_streams < 1:
            raise ValueError(f"max_streams must be at least 1, not {max_streams}")
        self.max_streams = max_streams
        self._streams: Counter[str] = Counter()  # uploads streaming now, per charged node
        self.quota_bytes = quota_bytes
        self.clock = clock
        self.block_bytes = block_bytes
        self._pending: dict[bytes, _Pending] = {}
        self._charged: Counter[str] = Counter()  # streaming + pending bytes, per node
        self._pins: Counter[bytes] = Counter()
        self._total = 0  # pending bytes
        self._streaming = 0  # bytes received so far by the uploads still streaming
        self._resending: set[bytes] = set()  # files a free re-send is streaming for
        # Of the uploads in flight, the blocks their bytes held in memory will take on the disk.
        self._buffered = 0
        self._lock = threading.Lock()
        #: Sweeps completed (the first one follows the adoption on start).
        self.sweeps = 0
        #: Shards of published checkpoints (never orphans), kept up to date by the sweeps.
        self.shards = ShardIndex()

    # ------------------------------------------------------------------ accounting
    def begin(
        self, node_id: str | None, digest: bytes, size: int, *, in_memory: bool = False
    ) -> Reservation:
        """Claim room for an upload before its bytes arrive (``node_id`` None: trusted;
        ``in_memory``: its bytes are gathered in memory until stored).

        Raises :class:`QuotaExceeded` when the node's charge plus ``size`` would exceed the
        quota, or the node streams ``max_streams`` uploads already. Every reservation must end
        with :meth:`finish`, once its bytes are stored or dropped (not when its caller goes
        away: a store in progress still needs the room).
        """
        with self._lock:
            if node_id is None:
                return Reservation(None, digest, size, charged=False, in_memory=in_memory)
            if self.max_streams is not None and self._streams[node_id] >= self.max_streams:
                raise QuotaExceeded(
                    f"this node is streaming {self._streams[node_id]} uploads already, the most "
                    f"it may at once; finish or cancel one first"
                )
            self._streams[node_id] += 1
            try:
                return self._reserve(node_id, digest, size, in_memory)
            except BaseException:
                self._end_stream(node_id)
                raise

    def _reserve(self, node_id: str, digest: bytes, size: int, in_memory: bool) -> Reservation:
        """The reservation of :meth:`begin` (its lock held)."""
        owned = self._pending.get(digest)
        if (
            owned is not None
            and owned.node_id == node_id
            and owned.size == size
            and digest not in self._resending
        ):
            # A re-send of a file the node owns (a retry whose answer was lost): free, one at
            # a time per file; should the file be swept meanwhile, :meth:`admit` charges the
            # new one before it is stored.
            self._resending.add(digest)
            return Reservation(
                node_id, digest, size, charged=False, resend=True, in_memory=in_memory
            )
        self._charge(node_id, size)
        return Reservation(node_id, digest, size, charged=True, in_memory=in_memory)

    def admit(self, reservation: Reservation) -> None:
        """A new file is about to be stored from this stream: a free re-send is charged now
        (raises :class:`QuotaExceeded` if that does not fit), anything else already was."""
        if reservation.node_id is None or reservation.charged:
            return
        with self._lock:
            self._charge(reservation.node_id, reservation.size)
            reservation.charged = True

    def footprint(self, size: int) -> int:
        """What a file of ``size`` bytes counts for: its whole blocks."""
        return footprint(size, self.block_bytes)

    def _charge(self, node_id: str, size: int) -> None:
        used, cost = self._charged[node_id], self.footprint(size)
        if used + cost > self.quota_bytes:
            raise QuotaExceeded(
                f"{used} bytes of this node's uploads are in flight or not referenced by any "
                f"commitment yet; {size} more (taking {cost} on the disk, in whole "
                f"{self.block_bytes}-byte blocks) would exceed its quota of {self.quota_bytes} "
                f"bytes (unreferenced uploads are deleted after the orphan TTL)"
            )
        self._charged[node_id] += cost

    def received(self, reservation: Reservation, count: int) -> None:
        """``count`` more bytes of the stream arrived."""
        with self._lock:
            if reservation.in_memory:
                self._buffered += self._held(reservation.received + count) - self._held(
                    reservation.received
                )
            reservation.received += count
            self._streaming += count

    def _held(self, received: int) -> int:
        """The blocks ``received`` bytes held in memory will take once stored (none yet: 0)."""
        return self.footprint(received) if received else 0

    def created(self, reservation: Reservation, size: int) -> None:
        """The stream's bytes became the stored file (called on the thread that renamed it,
        possibly after :meth:`finish` if the caller was cancelled): it is tracked, charged to
        its uploader unless trusted, until a record references it or it is swept."""
        with self._lock:
            if reservation.digest not in self._pending:
                owner = UNKNOWN_UPLOADER if reservation.node_id is None else reservation.node_id
                self._track(reservation.digest, _Pending(owner, size, self.clock()))

    def finish(self, reservation: Reservation, *, stored: bool) -> None:
        """End a stream (``stored``: it completed, its content is stored now).

        A trusted upload that completed takes over a tracked file of the same content (a
        trainer's shard a worker happened to upload first): uncharged, aged anew.
        """
        with self._lock:
            if reservation.node_id is not None:
                self._end_stream(reservation.node_id)
            self._streaming -= reservation.received
            if reservation.in_memory:
                self._buffered -= self._held(reservation.received)
            if reservation.resend:
                self._resending.discard(reservation.digest)
            if reservation.charged and reservation.node_id is not None:
                self._uncharge(reservation.node_id, reservation.size)
            entry = self._pending.get(reservation.digest)
            if stored and reservation.node_id is None and entry is not None:
                self._drop(reservation.digest)
                self._track(
                    reservation.digest, _Pending(UNKNOWN_UPLOADER, entry.size, self.clock())
                )

    def _end_stream(self, node_id: str) -> None:
        self._streams[node_id] -= 1
        if not self._streams[node_id]:
            del self._streams[node_id]

    def streams(self, node_id: str) -> int:
        """Uploads ``node_id`` is streaming now."""
        with self._lock:
            return self._streams[node_id]

    def settle(self, digests: Iterable[bytes]) -> None:
        """These blobs are referenced now: they stop counting and are never swept."""
        with self._lock:
            for digest in digests:
                self._drop(digest)

    def adopt(self, digest: bytes, size: int, since: float) -> None:
        """Track a file of unknown origin (found unreferenced on start) for sweeping."""
        with self._lock:
            if digest not in self._pending:
                self._track(digest, _Pending(UNKNOWN_UPLOADER, size, since))

    def pending_bytes(self, node_id: str | None = None) -> int:
        """A node's charge (streaming and unreferenced), or all tracked unreferenced bytes."""
        with self._lock:
            return self._total if node_id is None else self._charged[node_id]

    def streaming_bytes(self) -> int:
        """Bytes received so far by the uploads still streaming (held in memory, or in temporary
        files the disk's free space already shows): counted against the reserve. A stream that
        sent its header and nothing else holds no room."""
        with self._lock:
            return self._streaming

    def buffered_bytes(self) -> int:
        """What the bytes of uploads in flight held in memory (not yet on the disk: its free
        space does not show them yet) will take on the disk, in whole blocks."""
        with self._lock:
            return self._buffered

    def is_pending(self, digest: bytes) -> bool:
        """Whether ``digest`` is a stored upload nothing references yet."""
        with self._lock:
            return digest in self._pending

    def tracked(self) -> list[bytes]:
        """Every tracked digest."""
        with self._lock:
            return list(self._pending)

    def _track(self, digest: bytes, entry: _Pending) -> None:
        self._pending[digest] = entry
        self._total += self.footprint(entry.size)
        if entry.node_id != UNKNOWN_UPLOADER:
            self._charged[entry.node_id] += self.footprint(entry.size)

    def _drop(self, digest: bytes) -> None:
        entry = self._pending.pop(digest, None)
        if entry is not None:
            self._total -= self.footprint(entry.size)
            if entry.node_id != UNKNOWN_UPLOADER:
                self._uncharge(entry.node_id, entry.size)

    def _uncharge(self, node_id: str, size: int) -> None:
        self._charged[node_id] -= self.footprint(size)
        if self._charged[node_id] <= 0:
            del self._charged[node_id]

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
    def delete_unreferenced(
        self, store: BlobStore, candidates: Iterable[bytes], ttl: float
    ) -> tuple[int, int]:
        """Delete candidates still tracked, at least ``ttl`` old and unpinned: (files, bytes they
        took, in whole blocks).

        The caller has checked that no row references the candidates; one settled, replaced or
        pinned since is kept. Under the lock a file is only renamed away (a metadata change):
        unlinking a large file can take milliseconds, and the lock is taken on the event loop.
        """
        files = freed = 0
        doomed: list[str] = []
        cutoff = self.clock() - ttl
        for digest in candidates:
            with self._lock:
                entry = self._pending.get(digest)
                if entry is None or entry.since > cutoff or self._pins[digest] > 0:
                    continue
                try:
                    detached = store.detach(digest)
                except OSError as error:  # kept, and tried again at the next sweep
                    log.warning("orphan blob %s not deleted: %s", digest.hex(), error)
                    continue
                self._drop(digest)
            files += 1
            freed += self.footprint(entry.size)
            if detached is not None:
                doomed.append(detached)
        for path in doomed:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as error:  # a renamed-away file: removed on the next start
                log.warning("could not unlink %s: %s", path, error)
        return files, freed


class ShardIndex:
    """Every shard digest named by a published checkpoint manifest (deltas' shards too), read
    incrementally: manifests never change and steps only grow, so a refresh parses only the new
    ones."""

    def __init__(self) -> None:
        self.shards: set[bytes] = set()
        self._step = -1

    def refresh(self, session: Session) -> set[bytes]:
        """Add the manifests published since the last refresh; returns every shard digest."""
        for step, manifest in artifacts.manifests_after(session, self._step):
            try:
                parsed = checkpoint_pb2.CheckpointManifest.FromString(manifest)
            except DecodeError:  # recorded only after parsing; never expected
                log.error("a recorded checkpoint manifest does not parse; its shards are kept")
                raise
            self.shards.update(shard.blake3 for _, shard in manifest_blobs(parsed))
            self._step = step
        return self.shards


def unreferenced(session: Session, digests: list[bytes], shards: ShardIndex) -> list[bytes]:
    """The digests that no blob row records (or only a pruned one: its bytes were deleted, so
    bytes stored again under it are nobody's) and no published manifest names."""
    left: list[bytes] = []
    for start in range(0, len(digests), _CHECK_CHUNK):
        chunk = digests[start : start + _CHECK_CHUNK]
        names = [d.hex() for d in chunk]
        recorded = artifacts.unpruned_blobs(session, names)
        left += [d for d, name in zip(chunk, names, strict=True) if name not in recorded]
    if left:
        named = shards.refresh(session)
        left = [d for d in left if d not in named]
    return left


def sweep_orphans(
    pending: PendingUploads, store: BlobStore, session_factory: Callable[[], Session], ttl: float
) -> tuple[int, int]:
    """Settle tracked uploads a record references, delete those ``ttl`` old that none does.

    Every tracked upload is looked up, not only the old ones: one whose commitment another
    replica recorded (or whose answer was replayed from the idempotency record) is settled at
    the next sweep instead of staying charged. Blocking: run it on a thread.
    """
    try:
        candidates = pending.tracked()
        if not candidates:
            return 0, 0
        with session_factory() as session:
            left = unreferenced(session, candidates, pending.shards)
        orphans = set(left)
        pending.settle(d for d in candidates if d not in orphans)
        return pending.delete_unreferenced(store, left, ttl)
    finally:
        pending.sweeps += 1


def adopt_unreferenced(
    pending: PendingUploads, store: BlobStore, session_factory: Callable[[], Session]
) -> int:
    """Track every stored file that no row or manifest references; returns how many.

    Run once on start (blocking: on a thread). Each file is aged from its modification time.
    The store is walked in chunks, so memory stays flat however many blobs it holds.
    """
    adopted = 0
    with session_factory() as session:
        files = store.stored()
        while chunk := list(itertools.islice(files, _CHECK_CHUNK)):
            left = set(unreferenced(session, [digest for digest, _, _ in chunk], pending.shards))
            for digest, size, mtime in chunk:
                if digest in left:
                    pending.adopt(digest, size, mtime)
                    adopted += 1
    return adopted


def delete_uncredited(
    pending: PendingUploads, store: BlobStore, blob_hexes: Iterable[str]
) -> tuple[list[str], int]:
    """Delete the stored batches of uncredited work: (the digests now gone, bytes freed in whole
    blocks). Blocking: run it on a thread.

    A batch binds its lease, so no other commitment can name it; a digest a published manifest
    names (never a batch in practice) is kept all the same. One that cannot be removed is left
    out, to be tried again at the next sweep; one already gone counts as gone.
    """
    shards = pending.shards.shards
    gone: list[str] = []
    freed = 0
    for blob_hex in blob_hexes:
        digest = bytes.fromhex(blob_hex)
        if digest in shards:
            continue
        try:
            try:
                size: int | None = store.size(digest)
            except FileNotFoundError:
                size = None  # deleted by an earlier sweep that stopped before recording it
            store.remove(digest)
        except OSError as error:
            log.warning("batch %s of uncredited work not deleted: %s", blob_hex, error)
            continue
        gone.append(blob_hex)
        if size is not None:
            freed += pending.footprint(size)
    return gone, freed


def has_room(store_root: str | os.PathLike[str], size: int, reserve: int) -> bool:
    """Whether storing ``size`` more bytes leaves at least ``reserve`` bytes free (the caller
    counts the uploads still streaming in ``size``)."""
    return reserve <= 0 or shutil.disk_usage(store_root).free - size >= reserve
