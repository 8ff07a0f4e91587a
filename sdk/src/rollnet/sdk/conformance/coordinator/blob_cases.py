"""The coordinator suite's cases: blobs."""

from __future__ import annotations

import os

from rollnet.sdk.conformance.coordinator._base import C, case, expect
from rollnet.sdk.conformance.suite import CaseFailure, Skipped
from rollnet.sdk.conformance.target import Target, upload_chunk, upload_header
from rollnet.sdk.conformance.wire import refusal
from rollnet.sdk.errors import RollnetError
from rollnet.v1 import blob_service_pb2


@case(
    "blob.roundtrip",
    "an uploaded batch reads back byte for byte; a second upload is already_present",
)
async def blob_roundtrip(target: Target) -> None:
    worker = await target.worker()
    data = os.urandom(3000)
    first = await worker.upload(data)
    expect(
        first.blob.size == len(data), f"the BlobRef says {first.blob.size} bytes, not {len(data)}"
    )
    expect(not first.already_present, "new content reported already_present")
    again = await worker.upload(data)
    expect(again.already_present, "the same content uploaded twice is not already_present")
    back = await worker.get_blob(first.blob.blake3)
    expect(back == data, f"GetBlob returned {len(back)} bytes that differ from the upload")
    part = await worker.get_blob(first.blob.blake3, offset=1000, length=500)
    expect(part == data[1000:1500], "GetBlob(offset 1000, length 500) is not those bytes")
    tail = await worker.get_blob(first.blob.blake3, offset=2900)
    expect(tail == data[2900:], "GetBlob(offset 2900, length 0) is not the rest of the blob")


@case("blob.hash_mismatch", "bytes that do not hash to the declared digest: BLOB_HASH_MISMATCH")
async def blob_hash_mismatch(target: Target) -> None:
    worker = await target.shared_worker()
    data = os.urandom(1000)
    other = os.urandom(1000)
    try:
        await worker.upload_messages([upload_header(data), upload_chunk(other)])
    except RollnetError as error:
        refusal(error, C.INVALID_ARGUMENT, "BLOB_HASH_MISMATCH")
        return
    raise CaseFailure("an upload whose bytes do not hash to the declared digest was accepted")


@case("blob.size_mismatch", "fewer or more bytes than declared: BLOB_SIZE_MISMATCH")
async def blob_size_mismatch(target: Target) -> None:
    worker = await target.shared_worker()
    data = os.urandom(1000)
    for declared in (len(data) + 1, len(data) - 1):
        try:
            await worker.upload_messages([upload_header(data, size=declared), upload_chunk(data)])
        except RollnetError as error:
            refusal(error, C.INVALID_ARGUMENT, "BLOB_SIZE_MISMATCH")
            continue
        raise CaseFailure(f"{len(data)} bytes declared as {declared} were accepted")


@case("blob.size_cap", "a header declaring 2^62 bytes: BLOB_TOO_LARGE, before any byte")
async def blob_size_cap(target: Target) -> None:
    worker = await target.shared_worker()
    try:
        await worker.upload_messages([upload_header(b"x", size=1 << 62)])
    except RollnetError as error:
        refusal(error, C.RESOURCE_EXHAUSTED, "BLOB_TOO_LARGE")
        return
    raise CaseFailure("a header declaring 2^62 bytes was accepted")


@case("blob.header", "a stream starting with a chunk, or with two headers: BLOB_HEADER_INVALID")
async def blob_header(target: Target) -> None:
    worker = await target.shared_worker()
    data = os.urandom(100)
    for what, messages in (
        ("a chunk first", [upload_chunk(data)]),
        ("two headers", [upload_header(data), upload_header(data), upload_chunk(data)]),
    ):
        try:
            await worker.upload_messages(messages)
        except RollnetError as error:
            try:
                refusal(error, C.INVALID_ARGUMENT, "BLOB_HEADER_INVALID")
            except CaseFailure as failure:
                raise CaseFailure(f"{what}: {failure}") from None
            continue
        raise CaseFailure(f"an upload with {what} was accepted")


@case("blob.worker_shard", "a worker uploading a checkpoint shard: ROLE_NOT_ALLOWED")
async def blob_worker_shard(target: Target) -> None:
    worker = await target.shared_worker()
    try:
        await worker.upload(os.urandom(100), blob_service_pb2.BLOB_KIND_CHECKPOINT_SHARD)
    except RollnetError as error:
        refusal(error, C.PERMISSION_DENIED, "ROLE_NOT_ALLOWED")
        return
    raise CaseFailure("a worker's checkpoint shard was accepted")


@case("blob.not_found", "GetBlob of a digest nobody uploaded: BLOB_NOT_FOUND")
async def blob_not_found(target: Target) -> None:
    worker = await target.shared_worker()
    try:
        await worker.get_blob(os.urandom(32))
    except RollnetError as error:
        refusal(error, C.NOT_FOUND, "BLOB_NOT_FOUND")
        return
    raise CaseFailure("GetBlob of an unknown digest answered content")


@case(
    "blob.quota",
    "uploads past the node's quota: UPLOAD_QUOTA_EXCEEDED from the header, no RetryInfo",
)
async def blob_quota(target: Target) -> None:
    quota = target.config.upload_quota_bytes
    if quota is None:
        raise Skipped("needs the target's upload quota (--upload-quota-bytes)")
    if quota > 64 << 20:
        raise Skipped(f"filling a quota of {quota} bytes takes too long; use at most 64 MiB")
    worker = await target.worker()
    chunk = 1 << 20
    stored = 0
    while stored <= quota:
        data = os.urandom(min(chunk, quota + 1 - stored) or 1)
        try:
            await worker.upload(data)
        except RollnetError as error:
            refusal(error, C.RESOURCE_EXHAUSTED, "UPLOAD_QUOTA_EXCEEDED")
            expect(error.retry_after is None, "UPLOAD_QUOTA_EXCEEDED carries a RetryInfo")
            expect(stored + len(data) > quota, f"refused at {stored + len(data)} of {quota} bytes")
            return
        stored += len(data)
    raise CaseFailure(f"{stored} bytes nothing references were accepted under a quota of {quota}")
