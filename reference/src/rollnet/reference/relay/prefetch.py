"""Prefetching announced checkpoints: a relay that watches the coordinator
(``WatchCheckpoints``) pulls each new checkpoint's blobs before its clients ask, and ties them to
the step so older versions are dropped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from rollnet.reference.relay.cache import BlobCache, BlobUnavailable
from rollnet.sdk.checkpoints import (
    CheckpointVerificationError,
    manifest_blobs,
    verify_checkpoint,
)
from rollnet.v1 import checkpoint_pb2

log = logging.getLogger(__name__)


async def prefetch_checkpoints(
    cache: BlobCache,
    checkpoints: AsyncIterator[checkpoint_pb2.Checkpoint],
    *,
    network_id: str,
    concurrency: int = 4,
) -> None:
    """For each checkpoint announced, fetch every blob its (signature-checked) manifest names."""
    async for checkpoint in checkpoints:
        try:
            manifest = verify_checkpoint(checkpoint, network_id=network_id)
        except CheckpointVerificationError as error:
            log.warning("relay_prefetch_refused", extra={"error": str(error)})
            continue
        digests = list(dict.fromkeys(ref.blake3.hex() for _, ref in manifest_blobs(manifest)))
        cache.note_step(manifest.step, digests)
        limit = asyncio.Semaphore(concurrency)

        async def one(digest: str, limit: asyncio.Semaphore = limit) -> None:
            async with limit:
                if cache.path(digest) is not None:
                    return
                fetch = cache.fetch(digest)
                try:
                    await fetch.wait_for_size()
                    async with fetch.changed:
                        await fetch.changed.wait_for(lambda: fetch.done or fetch.error is not None)
                except BlobUnavailable as error:
                    log.warning(
                        "relay_prefetch_failed", extra={"blake3": digest, "error": str(error)}
                    )
                    return
                if fetch.done:
                    cache.metrics.prefetched.inc()

        await asyncio.gather(*(one(d) for d in digests))
        log.info("relay_prefetched", extra={"step": manifest.step, "blobs": len(digests)})
