"""Blobs: streamed, size-capped, BLAKE3-checked on arrival, content-addressed, duplicates free,
ranged downloads. Malformed streams are driven through the raw signed channel."""

from __future__ import annotations

import blake3
import grpc
import pytest
from coordinator_testing import raw_upload, register, upload_chunk, upload_header

from rollnet.reference.coordinator.config import CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.sdk import ErrorReason, Identity, RollnetError
from rollnet.sdk.testing import connect
from rollnet.v1 import blob_service_pb2, common_pb2

KIND = blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH


async def test_blob_upload_rules_and_ranged_download(
    coordinator_config: CoordinatorConfig,
) -> None:
    coordinator = await start_coordinator(with_overrides(coordinator_config, max_blob_bytes=4096))
    worker = Identity.generate()
    client = connect(coordinator.address, worker)
    try:
        await register(client, worker, common_pb2.ROLE_WORKER)
        data = bytes(range(256)) * 10  # 2560 bytes
        digest = blake3.blake3(data).digest()

        stored = await client.blobs.upload(data, KIND, chunk_size=1000)
        assert (stored.blob.blake3, stored.blob.size, stored.already_present) == (
            digest,
            len(data),
            False,
        )
        again = await client.blobs.upload(data, KIND, chunk_size=700)
        assert again.already_present, "a duplicate upload is free"
        # A digest the caller has already (a publisher's) is sent as given: the coordinator
        # checks it against the bytes all the same.
        given = await client.blobs.upload(data, KIND, digest=digest)
        assert (given.blob.blake3, given.already_present) == (digest, True)
        with pytest.raises(RollnetError) as wrong:
            await client.blobs.upload(data, KIND, digest=blake3.blake3(b"other").digest())
        assert wrong.value.reason == ErrorReason.BLOB_HASH_MISMATCH
        with pytest.raises(ValueError, match="32-byte BLAKE3 digest, not 16 bytes"):
            await client.blobs.upload(data, KIND, digest=digest[:16])
        assert coordinator.ctx.blobs.path_of(digest).read_bytes() == data

        assert await client.blobs.download(digest) == data
        assert await client.blobs.download(digest, offset=1000, length=300) == data[1000:1300]
        assert await client.blobs.download(digest, offset=2500) == data[2500:]

        # Over the cap: refused from the header, before any byte is stored.
        big = b"x" * 5000
        with pytest.raises(RollnetError) as refused:
            await client.blobs.upload(big, KIND)
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.value.reason == ErrorReason.BLOB_TOO_LARGE

        other = b"honest bytes" * 10
        other_digest = blake3.blake3(other).digest()
        cases = {
            # Bytes that do not hash to the declared digest.
            ErrorReason.BLOB_HASH_MISMATCH: [
                upload_header(other_digest, len(other)),
                upload_chunk(b"y" * 120),
            ],
            # Fewer or more bytes than declared.
            ErrorReason.BLOB_SIZE_MISMATCH: [
                upload_header(other_digest, len(other)),
                upload_chunk(other[:50]),
            ],
        }
        for reason, messages in cases.items():
            error = await raw_upload(client, messages)
            assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, reason)
        error = await raw_upload(client, [upload_header(other_digest, 5), upload_chunk(other)])
        assert error.reason == ErrorReason.BLOB_SIZE_MISMATCH
        # No header first, a second header, or nothing at all.
        for messages in (
            [upload_chunk(other)],
            [upload_header(other_digest, len(other)), upload_header(other_digest, len(other))],
            [],
        ):
            error = await raw_upload(client, messages)
            assert (error.code, error.reason) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                ErrorReason.BLOB_HEADER_INVALID,
            )
        # A malformed header is bad input, with the field named.
        error = await raw_upload(client, [upload_header(b"short", 3), upload_chunk(b"abc")])
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "header.blob.blake3" in {v.field for v in error.field_violations}

        # Nothing of the refused uploads was stored, and no partial file is left behind.
        with pytest.raises(RollnetError) as refused:
            await client.blobs.download(other_digest)
        assert refused.value.code == grpc.StatusCode.NOT_FOUND
        assert refused.value.reason == ErrorReason.BLOB_NOT_FOUND
        leftovers = [p for p in coordinator.ctx.blobs.root.rglob("*") if p.is_file()]
        assert leftovers == [coordinator.ctx.blobs.path_of(digest)]
    finally:
        await client.close()
        await coordinator.stop(grace=0.1)
