"""A real grpc.aio server on 127.0.0.1:0 with the request verifier, and signed clients for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from rollnet.sdk import (
    ConnectionConfig,
    FieldViolation,
    Identity,
    KnownKey,
    RequestVerifier,
    RetryPolicy,
    VerifierConfig,
    abort,
    current_caller,
    current_request_id,
    default_method_policy,
    open_channel,
)
from rollnet.sdk.testing import NETWORK_ID
from rollnet.v1 import (
    blob_service_pb2,
    blob_service_pb2_grpc,
    checkpoint_pb2,
    checkpoint_service_pb2,
    checkpoint_service_pb2_grpc,
    common_pb2,
    node_pb2,
    node_service_pb2,
    node_service_pb2_grpc,
)


@dataclass
class PlannedFailure:
    """An error the test servicer returns instead of answering one call."""

    code: grpc.StatusCode
    reason: str
    message: str = "planned failure"
    retry_after: float | None = None
    field_violations: tuple[FieldViolation, ...] = ()
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass
class Observed:
    """What a handler saw for one call: its request, verified caller and request id."""

    method: str
    request: Any
    caller_node_id: str
    caller_role: int
    caller_registered: bool
    request_id: str


class NodeServicer(node_service_pb2_grpc.NodeServiceServicer):
    """Trivial NodeService that records what it sees and can fail on demand."""

    def __init__(self) -> None:
        self.observed: list[Observed] = []
        self.failures: list[PlannedFailure] = []

    async def _observe(self, method: str, request: Any, context: Any) -> None:
        caller = current_caller()
        self.observed.append(
            Observed(
                method,
                request,
                caller.node_id,
                caller.role,
                caller.registered,
                current_request_id(),
            )
        )
        if self.failures:
            failure = self.failures.pop(0)
            await abort(
                context,
                failure.code,
                failure.reason,
                failure.message,
                retry_after=failure.retry_after,
                field_violations=failure.field_violations,
                metadata=failure.metadata,
            )

    async def RegisterNode(
        self, request: node_service_pb2.RegisterNodeRequest, context: Any
    ) -> node_service_pb2.RegisterNodeResponse:
        await self._observe("RegisterNode", request, context)
        caller = current_caller()
        return node_service_pb2.RegisterNodeResponse(
            node=node_pb2.Node(node_id=caller.node_id, public_key=caller.public_key),
            network_id=NETWORK_ID,
        )

    async def GetNode(
        self, request: node_service_pb2.GetNodeRequest, context: Any
    ) -> node_service_pb2.GetNodeResponse:
        await self._observe("GetNode", request, context)
        return node_service_pb2.GetNodeResponse(node=node_pb2.Node(node_id=request.node_id))

    async def ListNodes(
        self, request: node_service_pb2.ListNodesRequest, context: Any
    ) -> node_service_pb2.ListNodesResponse:
        await self._observe("ListNodes", request, context)
        return node_service_pb2.ListNodesResponse()

    async def DeregisterNode(
        self, request: node_service_pb2.DeregisterNodeRequest, context: Any
    ) -> node_service_pb2.DeregisterNodeResponse:
        await self._observe("DeregisterNode", request, context)
        return node_service_pb2.DeregisterNodeResponse(released_leases=len(request.request_id))


class BlobServicer(blob_service_pb2_grpc.BlobServiceServicer):
    """In-memory content-addressed store: checks the declared digest and size of uploads."""

    def __init__(self) -> None:
        self.blobs: dict[bytes, bytes] = {}
        self.get_failures: list[tuple[int, PlannedFailure]] = []
        """(after how many chunks, failure) for the next GetBlob calls."""
        self.get_requests: list[blob_service_pb2.GetBlobRequest] = []

    async def UploadBlob(
        self, request_iterator: AsyncIterator[blob_service_pb2.UploadBlobRequest], context: Any
    ) -> blob_service_pb2.UploadBlobResponse:
        import blake3

        current_caller()  # must be set by the verifier
        header: blob_service_pb2.BlobHeader | None = None
        content = bytearray()
        async for message in request_iterator:
            if header is None:
                header = message.header
            else:
                content += message.chunk
        assert header is not None
        digest = blake3.blake3(bytes(content)).digest()
        if digest != header.blob.blake3:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "BLOB_HASH_MISMATCH",
                "content does not match the header",
            )
        present = digest in self.blobs
        self.blobs[digest] = bytes(content)
        return blob_service_pb2.UploadBlobResponse(
            blob=common_pb2.BlobRef(blake3=digest, size=len(content)), already_present=present
        )

    async def GetBlob(
        self, request: blob_service_pb2.GetBlobRequest, context: Any
    ) -> AsyncIterator[blob_service_pb2.GetBlobResponse]:
        self.get_requests.append(request)
        content = self.blobs.get(request.blake3)
        if content is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, "BLOB_NOT_FOUND", "no such blob")
        assert content is not None
        end = len(content) if request.length == 0 else request.offset + request.length
        fail_after, failure = self.get_failures.pop(0) if self.get_failures else (-1, None)
        for sent, start in enumerate(range(request.offset, end, 4)):
            if failure is not None and sent == fail_after:
                await abort(context, failure.code, failure.reason, failure.message)
            yield blob_service_pb2.GetBlobResponse(
                offset=start, chunk=content[start : min(end, start + 4)], total_size=len(content)
            )


class CheckpointServicer(checkpoint_service_pb2_grpc.CheckpointServiceServicer):
    """Serves a fixed list of checkpoints to watchers; can drop the stream once."""

    def __init__(self) -> None:
        self.steps: list[int] = [1, 2, 3, 4, 5]
        self.drop_after: int | None = None
        """Fail the next watch with UNAVAILABLE after this many messages."""
        self.watch_requests: list[int] = []

    async def WatchCheckpoints(
        self, request: checkpoint_service_pb2.WatchCheckpointsRequest, context: Any
    ) -> AsyncIterator[checkpoint_service_pb2.WatchCheckpointsResponse]:
        self.watch_requests.append(request.after_step)
        drop_after, self.drop_after = self.drop_after, None
        sent = 0
        for step in self.steps:
            if step <= request.after_step:
                continue
            if sent == drop_after:
                await abort(context, grpc.StatusCode.UNAVAILABLE, "NOT_SERVING", "draining")
            yield checkpoint_service_pb2.WatchCheckpointsResponse(
                checkpoint=checkpoint_pb2.Checkpoint(step=step)
            )
            sent += 1


@dataclass
class Swarm:
    """The server side of a test: verifier, registered keys and servicers."""

    port: int
    verifier: RequestVerifier
    keys: dict[bytes, KnownKey]
    nodes: NodeServicer
    blobs: BlobServicer
    checkpoints: CheckpointServicer
    worker: Identity
    operator: Identity

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def config(self, **overrides: Any) -> ConnectionConfig:
        options: dict[str, Any] = {
            "target": self.target,
            "network_id": NETWORK_ID,
            "timeout": 5.0,
            "retry": RetryPolicy(max_attempts=4, initial_backoff=0.001, max_backoff=0.01),
        }
        options.update(overrides)
        return ConnectionConfig(**options)

    def channel(self, identity: Identity, **overrides: Any) -> grpc.aio.Channel:
        return open_channel(self.config(**overrides), identity)

    def register(self, identity: Identity, role: int, *, banned: bool = False) -> None:
        self.keys[identity.public_key] = KnownKey(identity.node_id, role, banned)


@pytest.fixture
async def swarm() -> AsyncIterator[Swarm]:
    keys: dict[bytes, KnownKey] = {}

    async def resolve(public_key: bytes) -> KnownKey | None:
        return keys.get(public_key)

    verifier = RequestVerifier(
        VerifierConfig(
            audience=NETWORK_ID, key_resolver=resolve, method_policy=default_method_policy()
        )
    )
    server = grpc.aio.server(interceptors=[verifier])
    # The generated .pyi marks every RPC abstract; these servicers implement only what tests call.
    nodes = NodeServicer()  # type: ignore[abstract]
    checkpoints = CheckpointServicer()  # type: ignore[abstract]
    blobs = BlobServicer()
    node_service_pb2_grpc.add_NodeServiceServicer_to_server(nodes, server)
    checkpoint_service_pb2_grpc.add_CheckpointServiceServicer_to_server(checkpoints, server)
    blob_service_pb2_grpc.add_BlobServiceServicer_to_server(blobs, server)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    worker, operator = Identity.generate(), Identity.generate()
    state = Swarm(port, verifier, keys, nodes, blobs, checkpoints, worker, operator)
    state.register(worker, common_pb2.ROLE_WORKER)
    state.register(operator, common_pb2.ROLE_OPERATOR)
    try:
        yield state
    finally:
        await server.stop(None)
