"""Blob intake: streamed uploads (size, digest, quota and free-space reserve) and downloads."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from functools import partial

from rollnet.ledger import artifacts
from rollnet.ledger.enums import NodeRole
from rollnet.reference.coordinator.blobstore import (
    BlobDigestMismatch,
    BlobSizeMismatch,
    BlobTooLarge,
    StoredBlob,
)
from rollnet.reference.coordinator.context import CoordinatorContext
from rollnet.reference.coordinator.refusal import Refusal, invalid
from rollnet.reference.coordinator.standing import (
    REFUSED_STATES,
    Caller,
    refuse_unless_in_standing,
)
from rollnet.reference.coordinator.uploads import QuotaExceeded, has_room
from rollnet.sdk.errors import ErrorReason
from rollnet.v1 import blob_service_pb2, common_pb2

_DRAIN_SECONDS = 30.0
"""Longest a refused upload's remaining bytes are read before the refusal is sent."""


async def _drain(chunks: AsyncIterator[bytes], limit: int, seconds: float) -> None:
    """Read and drop up to ``limit`` more bytes of ``chunks``, for at most ``seconds``."""

    async def read() -> None:
        left = limit
        async for chunk in chunks:
            left -= len(chunk)
            if left <= 0:
                return

    with contextlib.suppress(Exception):  # the refusal is the answer, whatever happens here
        await asyncio.wait_for(read(), seconds)


class BlobDesk:
    """BlobService: stores streamed blobs and streams stored ones back."""

    def __init__(self, ctx: CoordinatorContext) -> None:
        self.ctx = ctx

    async def upload(
        self, caller: Caller, header: blob_service_pb2.BlobHeader, chunks: AsyncIterator[bytes]
    ) -> blob_service_pb2.UploadBlobResponse:
        """Store a streamed blob after checking its size and digest.

        A worker may upload rollout batches only, charged to its quota of unreferenced uploads
        until a commitment records them; a trainer's checkpoint shards are not charged. No
        upload may take the store below its free-space reserve.
        """
        config = self.ctx.config
        digest, size = header.blob.blake3, header.blob.size
        trusted = caller.role == NodeRole.TRAINER
        refused = self.ctx.metrics.uploads_refused
        if header.kind != blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH and not trusted:
            refused.labels("role").inc()
            raise Refusal(ErrorReason.ROLE_NOT_ALLOWED, "only trainers upload checkpoint shards")
        if size > self.ctx.blobs.max_bytes:
            raise Refusal(
                ErrorReason.BLOB_TOO_LARGE,
                f"blob of {size} bytes exceeds the cap of {self.ctx.blobs.max_bytes}",
            )
        # An ejected (or deregistered) worker has nothing left to commit: no quota, no disk.
        # Its state as the call's key was resolved (no read on this per-lease path); a key
        # evicted since then is read again, and so is one whose cached state would refuse: the
        # node may have registered again (or been reinstated) since, here or on another replica.
        # SubmitCommitment reads it in its transaction.
        state = self.ctx.cached_state(caller.public_key)
        if state is None or state in REFUSED_STATES:
            await self.ctx.run_read(partial(refuse_unless_in_standing, caller=caller))
        uploads = self.ctx.uploads

        def over_quota(error: QuotaExceeded) -> Refusal:
            refused.labels("quota").inc()
            return Refusal(ErrorReason.UPLOAD_QUOTA_EXCEEDED, str(error))

        def storage_full(what: str) -> Refusal:
            refused.labels("storage").inc()
            return Refusal(
                ErrorReason.STORAGE_FULL,
                f"{what} would leave less than the reserve of {config.min_free_disk_bytes} "
                f"bytes free",
                retry_after=config.blob_sweep_interval.total_seconds(),
            )

        # The reserve is kept at the header, at every chunk of a large upload (written to its
        # temporary file as it comes) and before a small one is stored; bytes held in memory by
        # uploads in flight count, as the disk's free space does not show them yet.
        if not self.ctx.blobs.exists(digest) and not has_room(
            self.ctx.blobs.root,
            uploads.footprint(size) + uploads.buffered_bytes(),
            config.min_free_disk_bytes,
        ):
            raise storage_full(f"storing {size} bytes")
        # Charged from the header, whether or not the content is stored already (it may be
        # swept before the stream ends); the stream whose bytes become the file owns it, told
        # by the thread that renames it into place (even if this call is cancelled meanwhile).
        to_disk = self.ctx.blobs.streams_to_disk(size)
        try:
            reservation = uploads.begin(
                None if trusted else caller.node_id, digest, size, in_memory=not to_disk
            )
        except QuotaExceeded as error:
            raise over_quota(error) from None

        full: list[Refusal] = []  # set when the disk reached the reserve mid-stream

        async def counted() -> AsyncIterator[bytes]:
            async for chunk in chunks:
                uploads.received(reservation, len(chunk))
                # Written to the temporary file before any other coroutine runs: the check and
                # the write cannot interleave with another upload's.
                if to_disk and not has_room(
                    self.ctx.blobs.root,
                    len(chunk) + uploads.buffered_bytes(),
                    config.min_free_disk_bytes,
                ):
                    full.append(storage_full("the rest of this upload"))
                    raise full[0]
                yield chunk

        def admit(_size: int) -> None:
            uploads.admit(reservation)
            # Its bytes and those of the other small uploads not on the disk yet must fit now.
            if not to_disk and not has_room(
                self.ctx.blobs.root, uploads.buffered_bytes(), config.min_free_disk_bytes
            ):
                raise storage_full(f"storing these {size} bytes")

        try:
            stored: StoredBlob = await self.ctx.blobs.write(
                digest,
                size,
                counted(),
                on_created=lambda actual: uploads.created(reservation, actual),
                admit=admit,
                on_done=lambda complete: uploads.finish(reservation, stored=complete),
            )
        except QuotaExceeded as error:  # a free re-send that would store its file anew
            raise over_quota(error) from None
        except BlobTooLarge as error:
            raise Refusal(ErrorReason.BLOB_TOO_LARGE, str(error)) from error
        except BlobSizeMismatch as error:
            raise Refusal(ErrorReason.BLOB_SIZE_MISMATCH, str(error)) from error
        except BlobDigestMismatch as error:
            raise Refusal(ErrorReason.BLOB_HASH_MISMATCH, str(error)) from error
        except Refusal:
            if full:
                # The temporary file is gone and the room released; read (and drop) what the
                # client still sends, up to its declared size and for a bounded time, before
                # answering: a client still sending when the call ends sees gRPC's INTERNAL
                # instead of this refusal.
                await _drain(chunks, size - reservation.received, _DRAIN_SECONDS)
            raise
        # No database write here: the file is the blob. Its row is written in the transaction
        # of the commitment (or checkpoint) that references it, saving a commit per upload.
        return blob_service_pb2.UploadBlobResponse(
            blob=common_pb2.BlobRef(blake3=stored.digest, size=stored.size),
            already_present=stored.already_present,
        )

    async def download(
        self, request: blob_service_pb2.GetBlobRequest, chunk_size: int = 1 << 20
    ) -> AsyncIterator[blob_service_pb2.GetBlobResponse]:
        """Stream a stored blob from ``offset``."""
        if not self.ctx.blobs.exists(request.blake3):
            name = request.blake3.hex()
            row = await self.ctx.run_read(lambda session: artifacts.get_blob(session, name))
            if row is not None and row.pruned_at is not None:
                raise Refusal(
                    ErrorReason.BLOB_NOT_FOUND,
                    f"blob {name} (the batch of uncredited work) was deleted at "
                    f"{row.pruned_at.isoformat()}, rejected_blob_ttl after its validation ended",
                )
            raise Refusal(ErrorReason.BLOB_NOT_FOUND, f"no blob {name}")
        offset = request.offset
        end: int | None = request.offset + request.length if request.length else None
        while True:
            want = chunk_size if end is None else min(chunk_size, end - offset)
            if want <= 0:
                return
            total, data = self.ctx.blobs.read_range(request.blake3, offset, want)
            if offset > total:
                raise invalid(("offset", f"{offset} is beyond the blob's size {total}"))
            if not data:
                if offset == total and offset == request.offset:
                    yield blob_service_pb2.GetBlobResponse(offset=offset, total_size=total)
                return
            yield blob_service_pb2.GetBlobResponse(offset=offset, chunk=data, total_size=total)
            offset += len(data)
