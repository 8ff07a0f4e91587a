"""Typed clients against the real server: retries, request ids, blob upload and download."""

from __future__ import annotations

from collections.abc import AsyncIterator

import blake3
import grpc
import pytest
from sdk_testing import PlannedFailure, Swarm

from rollnet.sdk import (
    BlobClient,
    BlobIntegrityError,
    CheckpointClient,
    ConnectionConfig,
    ErrorReason,
    Identity,
    InvalidArgument,
    NodeClient,
    RequestSigner,
    ResourceExhausted,
    RetryPolicy,
    RollnetClient,
    Unauthenticated,
    Unavailable,
    from_rpc_error,
    method_path,
)
from rollnet.sdk.testing import NETWORK_ID
from rollnet.v1 import blob_service_pb2, common_pb2, node_service_pb2

POLICY = RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05, jitter=0.0)
ROLLOUT = blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH


class Sleeps:
    """Records the back-off waits instead of sleeping (retries need no real time here)."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def unavailable() -> PlannedFailure:
    return PlannedFailure(grpc.StatusCode.UNAVAILABLE, ErrorReason.NOT_SERVING)


async def test_unavailable_twice_is_one_logical_call_with_one_request_id(swarm: Swarm) -> None:
    swarm.nodes.failures += [unavailable(), unavailable()]
    sleeps = Sleeps()
    request = node_service_pb2.DeregisterNodeRequest(reason="bye")
    async with swarm.channel(swarm.worker) as channel:
        response = await NodeClient(channel, retry=POLICY, sleep=sleeps).deregister_node(request)
    attempts = swarm.nodes.observed
    assert len(attempts) == 3
    request_ids = {seen.request.request_id for seen in attempts}
    assert len(request_ids) == 1
    (request_id,) = request_ids
    assert len(request_id) == 32
    assert response.released_leases == 32  # the servicer echoes the request id's length
    assert request.request_id == ""  # the caller's message is left alone
    assert sleeps.delays == pytest.approx([0.01, 0.02])


async def test_caller_request_id_is_kept(swarm: Swarm) -> None:
    swarm.nodes.failures.append(unavailable())
    async with swarm.channel(swarm.worker) as channel:
        await NodeClient(channel, retry=POLICY, sleep=Sleeps()).deregister_node(
            node_service_pb2.DeregisterNodeRequest(request_id="mine")
        )
    assert [seen.request.request_id for seen in swarm.nodes.observed] == ["mine", "mine"]


async def test_retry_info_is_honoured(swarm: Swarm) -> None:
    swarm.nodes.failures.append(
        PlannedFailure(
            grpc.StatusCode.RESOURCE_EXHAUSTED, ErrorReason.RATE_LIMITED, retry_after=0.75
        )
    )
    sleeps = Sleeps()
    async with swarm.channel(swarm.worker) as channel:
        await NodeClient(channel, retry=POLICY, sleep=sleeps).get_node(
            node_service_pb2.GetNodeRequest()
        )
    assert len(swarm.nodes.observed) == 2
    assert sleeps.delays == pytest.approx([0.75])


async def test_resource_exhausted_without_retry_info_is_not_retried(swarm: Swarm) -> None:
    swarm.nodes.failures.append(
        PlannedFailure(grpc.StatusCode.RESOURCE_EXHAUSTED, ErrorReason.MESSAGE_TOO_LARGE)
    )
    async with swarm.channel(swarm.worker) as channel:
        with pytest.raises(ResourceExhausted):
            await NodeClient(channel, retry=POLICY, sleep=Sleeps()).get_node(
                node_service_pb2.GetNodeRequest()
            )
    assert len(swarm.nodes.observed) == 1


async def test_invalid_argument_is_not_retried(swarm: Swarm) -> None:
    swarm.nodes.failures.append(
        PlannedFailure(grpc.StatusCode.INVALID_ARGUMENT, ErrorReason.INVALID_FIELDS)
    )
    sleeps = Sleeps()
    async with swarm.channel(swarm.worker) as channel:
        with pytest.raises(InvalidArgument):
            await NodeClient(channel, retry=POLICY, sleep=sleeps).get_node(
                node_service_pb2.GetNodeRequest()
            )
    assert len(swarm.nodes.observed) == 1
    assert sleeps.delays == []


async def test_retries_stop_at_max_attempts(swarm: Swarm) -> None:
    swarm.nodes.failures += [unavailable() for _ in range(10)]
    async with swarm.channel(swarm.worker) as channel:
        with pytest.raises(Unavailable) as info:
            await NodeClient(channel, retry=POLICY, sleep=Sleeps()).get_node(
                node_service_pb2.GetNodeRequest()
            )
    assert len(swarm.nodes.observed) == POLICY.max_attempts
    assert info.value.reason == ErrorReason.NOT_SERVING


def test_backoff_grows_caps_and_jitters() -> None:
    policy = RetryPolicy(initial_backoff=1.0, multiplier=2.0, max_backoff=5.0, jitter=0.2)
    for attempt, base in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (9, 5.0)]:
        delays = [policy.backoff(attempt) for _ in range(200)]
        assert all(base * 0.8 <= d <= base * 1.2 for d in delays)
        assert max(delays) - min(delays) > 0.05 * base  # jitter actually spreads them
    assert policy.backoff(1, retry_after=30.0) >= 30.0


async def test_facade_connects_and_signs(swarm: Swarm) -> None:
    async with RollnetClient.connect(swarm.config(), swarm.worker) as client:
        response = await client.nodes.get_node(node_service_pb2.GetNodeRequest(node_id="f"))
    assert response.node.node_id == "f"
    assert swarm.nodes.observed[0].caller_node_id == swarm.worker.node_id


async def test_upload_then_download(swarm: Swarm) -> None:
    content = bytes(range(256)) * 41  # 10496 bytes, 11 chunks of 1000
    async with swarm.channel(swarm.worker) as channel:
        blobs = BlobClient(channel, retry=POLICY, sleep=Sleeps())
        stored = await blobs.upload(content, ROLLOUT, chunk_size=1000)
        assert stored.blob.blake3 == blake3.blake3(content).digest()
        assert stored.blob.size == len(content)
        assert not stored.already_present
        again = await blobs.upload(content, ROLLOUT)
        assert again.already_present
        assert await blobs.download(stored.blob.blake3) == content
        assert await blobs.download(stored.blob.blake3, offset=5, length=7) == content[5:12]


async def test_upload_from_async_iterable(swarm: Swarm) -> None:
    async def pieces() -> AsyncIterator[bytes]:
        for piece in (b"abc", b"", b"defg"):
            yield piece

    async with swarm.channel(swarm.worker) as channel:
        stored = await BlobClient(channel).upload(pieces(), ROLLOUT, chunk_size=2)
    assert swarm.blobs.blobs[stored.blob.blake3] == b"abcdefg"


async def test_download_resumes_after_a_dropped_stream(swarm: Swarm) -> None:
    content = bytes(range(40))
    digest = blake3.blake3(content).digest()
    swarm.blobs.blobs[digest] = content
    swarm.blobs.get_failures.append((3, unavailable()))
    async with swarm.channel(swarm.worker) as channel:
        blobs = BlobClient(channel, retry=POLICY, sleep=Sleeps())
        assert await blobs.download(digest) == content
    assert [r.offset for r in swarm.blobs.get_requests] == [0, 12]


async def test_download_checks_integrity(swarm: Swarm) -> None:
    digest = blake3.blake3(b"expected").digest()
    swarm.blobs.blobs[digest] = b"tampered"
    async with swarm.channel(swarm.worker) as channel:
        with pytest.raises(BlobIntegrityError):
            await BlobClient(channel).download(digest)


async def test_upload_header_altered_after_signing_is_refused(swarm: Swarm) -> None:
    def header(size: int) -> bytes:
        return blob_service_pb2.UploadBlobRequest(
            header=blob_service_pb2.BlobHeader(
                blob=common_pb2.BlobRef(blake3=blake3.blake3(b"x" * size).digest(), size=size),
                kind=ROLLOUT,
            )
        ).SerializeToString()

    method = method_path("BlobService", "UploadBlob")
    headers = RequestSigner(swarm.worker, NETWORK_ID).sign(method, header(1))

    async def stream(first: bytes) -> AsyncIterator[bytes]:
        yield first
        yield blob_service_pb2.UploadBlobRequest(chunk=b"x").SerializeToString()

    async with grpc.aio.insecure_channel(swarm.target) as channel:
        call: grpc.aio.StreamUnaryMultiCallable[bytes, bytes] = channel.stream_unary(
            method, request_serializer=None, response_deserializer=None
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(stream(header(2)), metadata=headers.as_metadata(), timeout=5)
        error = from_rpc_error(info.value)
        assert isinstance(error, Unauthenticated)
        assert error.reason == ErrorReason.BODY_HASH_MISMATCH
        # The same headers over the header they were made for are admitted.
        await call(stream(header(1)), metadata=headers.as_metadata(), timeout=5)
    assert list(swarm.blobs.blobs.values()) == [b"x"]


def test_connection_config_defaults() -> None:
    config = ConnectionConfig(target="h:1", network_id="n")
    assert config.tls is None
    assert config.retry == RetryPolicy()
    with pytest.raises(ValueError, match="network id"):
        RequestSigner(Identity.generate(), "bad id")


async def test_watch_resumes_after_the_last_step_seen(swarm: Swarm) -> None:
    swarm.checkpoints.drop_after = 2
    async with swarm.channel(swarm.worker) as channel:
        client = CheckpointClient(channel, retry=POLICY, sleep=Sleeps())
        steps = [checkpoint.step async for checkpoint in client.watch(after_step=1)]
    assert steps == [2, 3, 4, 5]
    assert swarm.checkpoints.watch_requests == [1, 3]


async def test_watch_gives_up_on_a_server_that_never_delivers(swarm: Swarm) -> None:
    swarm.checkpoints.drop_after = 0
    swarm.checkpoints.steps = [7]
    policy = RetryPolicy(max_attempts=1)
    async with swarm.channel(swarm.worker) as channel:
        client = CheckpointClient(channel, retry=policy, sleep=Sleeps())
        with pytest.raises(Unavailable):
            [checkpoint async for checkpoint in client.watch()]
