"""Prefetching announced checkpoints: a relay that watches the coordinator
(``WatchCheckpoints``) pulls each new checkpoint's blobs before its clients ask, and ties them to
the step so older versions are dropped.

Coordinators answer reads from registered keys only, so :func:`watch_coordinator` registers the
relay's key first, in the relay role (``ROLE_RELAY``: reads only, it may not lease a task; it
shows in the node list with software version ``rollnet-relay/...``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from rollnet.reference.relay.cache import BlobCache, BlobUnavailable
from rollnet.sdk import RollnetClient
from rollnet.sdk.checkpoints import (
    CheckpointVerificationError,
    manifest_blobs,
    verify_checkpoint,
)
from rollnet.sdk.errors import RollnetError
from rollnet.sdk.node import PROTOCOL_VERSION
from rollnet.sdk.version import software_version
from rollnet.v1 import checkpoint_pb2, common_pb2, node_service_pb2

RELAY_SOFTWARE_VERSION = software_version("relay")

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
        sizes = {ref.blake3.hex(): ref.size for _, ref in manifest_blobs(manifest)}
        digests = list(sizes)
        cache.note_step(manifest.step, digests, sizes)
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


async def watch_coordinator(
    cache: BlobCache,
    client: RollnetClient,
    *,
    network_id: str,
    retry_after: float = 1.0,
    max_retry_after: float = 30.0,
) -> None:
    """Register the relay's key (signing ``client``'s calls) and prefetch every checkpoint the
    coordinator announces, from the newest on, until cancelled. From then on the versions kept
    follow the signed manifests, not clients' hints.

    A coordinator that cannot be reached, refuses the key or ends the stream does not end the
    watch: each failure is logged (``relay_watch_failed``) and counted
    (``rollnet_relay_watch_errors_total``), and the watch starts again after ``retry_after``
    seconds, doubling up to ``max_retry_after`` while it keeps failing, after the last step
    prefetched."""
    cache.hints_trusted = False
    delay = retry_after
    while True:
        seen = max(cache.steps, default=0)
        try:
            await register_relay(client)
            await prefetch_checkpoints(cache, client.checkpoints.watch(seen), network_id=network_id)
            error: str = "the coordinator ended the stream"
        except Exception as failure:  # whatever it was, the relay keeps serving and retries
            error = str(failure) or type(failure).__name__
            if not isinstance(failure, RollnetError):
                log.warning("relay_watch_error", exc_info=True)
        if max(cache.steps, default=0) > seen:
            delay = retry_after  # it worked for a while: start the back-off again
        cache.metrics.watch_errors.inc()
        log.warning("relay_watch_failed", extra={"error": error, "retry_in_s": delay})
        await asyncio.sleep(delay)
        delay = min(2 * delay, max_retry_after)


def refuses_unknown_role(error: RollnetError) -> bool:
    """Whether ``error`` is a coordinator's refusal of a role it does not know (its bounds on
    ``RegisterNodeRequest.role``: INVALID_ARGUMENT naming the field)."""
    return error.code == grpc.StatusCode.INVALID_ARGUMENT and "role" in error.message


async def register_relay(client: RollnetClient) -> common_pb2.Role.ValueType:
    """Register the relay's key as ``ROLE_RELAY``; a coordinator older than that role refuses
    it as an invalid argument, and then the key registers as a worker (what relays did before).
    Returns the role registered."""
    for role in (common_pb2.ROLE_RELAY, common_pb2.ROLE_WORKER):
        try:
            await client.nodes.register_node(
                node_service_pb2.RegisterNodeRequest(
                    public_key=client.signer.identity.public_key,
                    role=role,
                    protocol_version=PROTOCOL_VERSION,
                    software_version=RELAY_SOFTWARE_VERSION,
                )
            )
        except RollnetError as error:
            if role != common_pb2.ROLE_RELAY or not refuses_unknown_role(error):
                raise
            log.warning("relay_registered_as_worker", extra={"reason": error.message})
            continue
        return role
    raise AssertionError("unreachable: the worker registration returns or raises")
