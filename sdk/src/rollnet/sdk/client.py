# gRPC deadlines are per call (and per attempt), so the RPC methods take `timeout` on purpose.
# ruff: noqa: ASYNC109
"""Typed async clients, one per service, and the connection they share.

Each RPC is one ``async def`` taking the request message plus keyword-only ``timeout`` (seconds
per attempt; ``None`` means the client's default for unary calls), ``metadata`` (extra pairs) and
``retry`` (a :class:`~rollnet.sdk.retry.RetryPolicy`; ``None`` means the client's default). It
returns the response message or raises a :class:`~rollnet.sdk.errors.RollnetError` subclass.

Requests are serialized once, deterministically, and the signing interceptor hashes exactly the
bytes that are sent. A mutating request whose ``request_id`` is empty gets a fresh one (uuid4 hex)
that every retry of that call reuses; the caller's message is never modified.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import blake3
import grpc
from google.protobuf import duration_pb2

from rollnet.sdk.errors import from_rpc_error
from rollnet.sdk.identity import Identity
from rollnet.sdk.methods import method_path
from rollnet.sdk.retry import RetryPolicy, is_retryable
from rollnet.sdk.signing import RequestSigner, signing_interceptors
from rollnet.v1 import (
    blob_service_pb2,
    checkpoint_pb2,
    checkpoint_service_pb2,
    commitment_service_pb2,
    common_pb2,
    ledger_service_pb2,
    node_service_pb2,
    rollout_pb2,
    rollout_service_pb2,
    task_service_pb2,
    validation_service_pb2,
)

Metadata = Sequence[tuple[str, str]]
"""Extra call metadata: (key, value) pairs, keys lowercase ASCII."""

DEFAULT_CHUNK_SIZE = 1 << 20
"""Bytes per upload chunk (well under gRPC's default 4 MiB message cap)."""

# Long polls (PullTask, PullValidationJob) may legitimately hold a call for `wait`; give the call
# this much time on top before calling it dead.
_LONG_POLL_MARGIN = 10.0


class BlobIntegrityError(Exception):
    """Downloaded bytes do not hash to the requested BLAKE3 digest."""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS for the channel. Paths are PEM files; ``None`` uses gRPC's defaults (system roots)."""

    root_certificates: Path | None = None
    client_certificate: Path | None = None
    """Certificate chain for mutual TLS (needs ``client_key``)."""
    client_key: Path | None = None
    server_name_override: str | None = None
    """Expected server name when it differs from the target host (tests, IP targets)."""


@dataclass(frozen=True, slots=True)
class ConnectionConfig:
    """Where and how to reach a coordinator."""

    target: str
    """``host:port``."""
    network_id: str
    """The coordinator's network id: the audience of every signed call."""
    tls: TlsConfig | None = None
    """``None`` for plaintext (local development only)."""
    timeout: float | None = 30.0
    """Default deadline of a unary call attempt, in seconds (``None``: no deadline)."""
    max_message_bytes: int = 64 << 20
    """Largest message sent or received."""
    keepalive_time: float | None = None
    """Seconds between HTTP/2 keepalive pings on an active connection (``None``: off). The server
    must allow pings this frequent, or it closes the connection with ``too_many_pings``."""
    keepalive_timeout: float = 20.0
    """Seconds to wait for a keepalive ack before the connection is considered dead."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Default retry policy of every client on the channel."""
    max_reconnect_backoff: float | None = 10.0
    """Longest wait, in seconds, between gRPC's attempts to re-open a broken connection
    (``None``: gRPC's default of 120 s, which can keep a node away long after an outage)."""
    user_agent: str = "rollnet-sdk/0.1"


def _channel_options(config: ConnectionConfig) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.primary_user_agent", config.user_agent),
        # The SDK retries by itself because each attempt must be signed afresh: a gRPC retry
        # policy would resend the same nonce after the server saw it, a refused replay.
        ("grpc.enable_retries", 0),
    ]
    if config.max_reconnect_backoff is not None:
        options.append(("grpc.max_reconnect_backoff_ms", int(config.max_reconnect_backoff * 1000)))
    if config.keepalive_time is not None:
        options += [
            ("grpc.keepalive_time_ms", int(config.keepalive_time * 1000)),
            ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout * 1000)),
        ]
    if config.tls is not None and config.tls.server_name_override:
        options.append(("grpc.ssl_target_name_override", config.tls.server_name_override))
    return options


def open_channel(
    config: ConnectionConfig, identity: Identity, *, signer: RequestSigner | None = None
) -> grpc.aio.Channel:
    """Open a ``grpc.aio`` channel whose every call is signed by ``identity`` for the network.

    Pass ``signer`` to share one (for example to adjust its ``clock_offset``).
    """
    signer = signer or RequestSigner(identity, config.network_id)
    interceptors = list(signing_interceptors(signer))
    options = _channel_options(config)
    if config.tls is None:
        return grpc.aio.insecure_channel(config.target, options=options, interceptors=interceptors)
    tls = config.tls
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(tls.root_certificates),
        private_key=_read(tls.client_key),
        certificate_chain=_read(tls.client_certificate),
    )
    return grpc.aio.secure_channel(
        config.target, credentials, options=options, interceptors=interceptors
    )


def _read(path: Path | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


M = TypeVar("M")


def _with_request_id(request: M) -> M:
    """A copy of ``request`` with a fresh request id when it has an empty ``request_id`` field."""
    descriptor = getattr(request, "DESCRIPTOR", None)
    if descriptor is None or "request_id" not in descriptor.fields_by_name:
        return request
    if getattr(request, "request_id", ""):
        return request
    filled = type(request)()
    filled.CopyFrom(request)  # type: ignore[attr-defined]
    filled.request_id = uuid.uuid4().hex  # type: ignore[attr-defined]
    return filled


def _serialize(request: Any) -> bytes:
    data: bytes = request.SerializeToString(deterministic=True)
    return data


class _ServiceClient:
    """Shared machinery: per-attempt deadline, retries, error conversion."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        timeout: float | None = 30.0,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``timeout`` and ``retry`` are the defaults of every call; ``sleep`` waits between
        attempts (tests pass one that records the delays)."""
        self._channel = channel
        self._timeout = timeout
        self._retry = retry or RetryPolicy()
        self._sleep = sleep

    async def _unary(
        self,
        method: str,
        request: Any,
        response_type: type[M],
        *,
        timeout: float | None,
        metadata: Metadata | None,
        retry: RetryPolicy | None,
        default_timeout: float | None = None,
    ) -> M:
        payload = _serialize(_with_request_id(request))
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, M] = self._channel.unary_unary(
            method,
            request_serializer=None,
            response_deserializer=response_type.FromString,  # type: ignore[attr-defined]
        )
        deadline = timeout if timeout is not None else (default_timeout or self._timeout)

        async def attempt() -> M:
            response: M = await call(payload, timeout=deadline, metadata=_metadata(metadata))
            return response

        return await self._with_retries(attempt, retry)

    async def _with_retries(
        self, attempt: Callable[[], Awaitable[M]], retry: RetryPolicy | None
    ) -> M:
        policy = retry or self._retry
        number = 1
        while True:
            try:
                return await attempt()
            except grpc.aio.AioRpcError as exc:
                error = from_rpc_error(exc)
                if number >= policy.max_attempts or not is_retryable(error):
                    raise error from exc
            await self._sleep(policy.backoff(number, error.retry_after))
            number += 1

    async def _server_stream(
        self,
        method: str,
        make_request: Callable[[], Any],
        response_type: type[M],
        on_message: Callable[[M], None],
        *,
        timeout: float | None,
        metadata: Metadata | None,
        retry: RetryPolicy | None,
    ) -> AsyncIterator[M]:
        """Stream responses; after a retryable failure, reconnect with ``make_request()``.

        ``on_message`` updates the resume cursor that ``make_request`` reads. The attempt count
        starts over whenever an attempt delivered a message, so a long stream survives many
        disconnects but a server that fails at once is not retried forever.
        """
        policy = retry or self._retry
        call_factory: grpc.aio.UnaryStreamMultiCallable[bytes, M] = self._channel.unary_stream(
            method,
            request_serializer=None,
            response_deserializer=response_type.FromString,  # type: ignore[attr-defined]
        )
        number = 1
        while True:
            progressed = False
            call = call_factory(
                _serialize(make_request()), timeout=timeout, metadata=_metadata(metadata)
            )
            try:
                async for response in call:
                    progressed = True
                    on_message(response)
                    yield response
                return
            except grpc.aio.AioRpcError as exc:
                error = from_rpc_error(exc)
                if progressed:
                    number = 1
                if number >= policy.max_attempts or not is_retryable(error):
                    raise error from exc
            finally:
                call.cancel()
            await self._sleep(policy.backoff(number, error.retry_after))
            number += 1


def _metadata(metadata: Metadata | None) -> tuple[tuple[str, str], ...] | None:
    return tuple(metadata) if metadata else None


# The longest wait a request may carry (docs/protocol.md, "Bounds on every field"); a longer one
# is the server's to refuse, and must not overflow the deadline computed here first.
_MAX_WAIT = 86_400.0


def _long_poll_timeout(default: float | None, wait: duration_pb2.Duration) -> float | None:
    if default is None:
        return None
    seconds = min(max(wait.seconds + wait.nanos / 1e9, 0.0), _MAX_WAIT)
    return max(default, seconds + _LONG_POLL_MARGIN)


class NodeClient(_ServiceClient):
    """``rollnet.v1.NodeService``: admission and liveness."""

    _REGISTER = method_path("NodeService", "RegisterNode")
    _HEARTBEAT = method_path("NodeService", "Heartbeat")
    _DEREGISTER = method_path("NodeService", "DeregisterNode")
    _GET = method_path("NodeService", "GetNode")
    _LIST = method_path("NodeService", "ListNodes")
    _EJECT = method_path("NodeService", "EjectNode")
    _BAN = method_path("NodeService", "BanNode")
    _REINSTATE = method_path("NodeService", "ReinstateNode")

    async def register_node(
        self,
        request: node_service_pb2.RegisterNodeRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> node_service_pb2.RegisterNodeResponse:
        """Register the signing key with a role (idempotent for the same key and role)."""
        return await self._unary(
            self._REGISTER,
            request,
            node_service_pb2.RegisterNodeResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )

    async def heartbeat(
        self,
        request: node_service_pb2.HeartbeatRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> node_service_pb2.HeartbeatResponse:
        """Report liveness; the reply extends held leases and carries commands."""
        return await self._unary(
            self._HEARTBEAT,
            request,
            node_service_pb2.HeartbeatResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )

    async def deregister_node(
        self,
        request: node_service_pb2.DeregisterNodeRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> node_service_pb2.DeregisterNodeResponse:
        """Leave the swarm cleanly: open leases are given back."""
        return await self._unary(
            self._DEREGISTER,
            request,
            node_service_pb2.DeregisterNodeResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )

    async def get_node(
        self,
        request: node_service_pb2.GetNodeRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> node_service_pb2.GetNodeResponse:
        """Return one node."""
        return await self._unary(
            self._GET,
            request,
            node_service_pb2.GetNodeResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )

    async def list_nodes(
        self,
        request: node_service_pb2.ListNodesRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> node_service_pb2.ListNodesResponse:
        """List nodes (operator)."""
        return await self._unary(
            self._LIST,
            request,
            node_service_pb2.ListNodesResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )

    async def eject_node(
        self,
        request: node_service_pb2.EjectNodeRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> node_service_pb2.EjectNodeResponse:
        """Eject a node: its leases are revoked (operator)."""
        return await self._unary(
            self._EJECT,
            request,
            node_service_pb2.EjectNodeResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )

    async def ban_node(
        self,
        request: node_service_pb2.BanNodeRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> node_service_pb2.BanNodeResponse:
        """Ban a node's key for good (operator)."""
        return await self._unary(
            self._BAN,
            request,
            node_service_pb2.BanNodeResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )

    async def reinstate_node(
        self,
        request: node_service_pb2.ReinstateNodeRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> node_service_pb2.ReinstateNodeResponse:
        """Undo a node's ejection; it works again from its next heartbeat (operator)."""
        return await self._unary(
            self._REINSTATE,
            request,
            node_service_pb2.ReinstateNodeResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )


class TaskClient(_ServiceClient):
    """``rollnet.v1.TaskService``: leases on rollout tasks (worker role)."""

    _PULL = method_path("TaskService", "PullTask")
    _PROGRESS = method_path("TaskService", "ReportProgress")
    _FAIL = method_path("TaskService", "FailTask")

    async def pull_task(
        self,
        request: task_service_pb2.PullTaskRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> task_service_pb2.PullTaskResponse:
        """Long-poll for a task. Without ``timeout`` the deadline covers ``request.wait``."""
        return await self._unary(
            self._PULL,
            request,
            task_service_pb2.PullTaskResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
            default_timeout=_long_poll_timeout(self._timeout, request.wait),
        )

    async def report_progress(
        self,
        request: task_service_pb2.ReportProgressRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> task_service_pb2.ReportProgressResponse:
        """Report progress on a leased task (extends the lease)."""
        return await self._unary(
            self._PROGRESS,
            request,
            task_service_pb2.ReportProgressResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )

    async def fail_task(
        self,
        request: task_service_pb2.FailTaskRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> task_service_pb2.FailTaskResponse:
        """Give a leased task back with a reason."""
        return await self._unary(
            self._FAIL,
            request,
            task_service_pb2.FailTaskResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )


class BlobClient(_ServiceClient):
    """``rollnet.v1.BlobService``: content-addressed uploads and downloads."""

    _UPLOAD = method_path("BlobService", "UploadBlob")
    _GET = method_path("BlobService", "GetBlob")

    async def upload(
        self,
        data: bytes | bytearray | memoryview | AsyncIterable[bytes],
        kind: blob_service_pb2.BlobKind.ValueType,
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> blob_service_pb2.UploadBlobResponse:
        """Upload one blob; returns its content address as stored.

        The BLAKE3 digest and size go in the header message, so they are computed first: an
        async iterable is read into memory before anything is sent. A retry resends everything.
        """
        if chunk_size < 1:
            raise ValueError("chunk_size must be positive")
        if isinstance(data, AsyncIterable):
            buffer = bytearray()
            async for piece in data:
                buffer += piece
            content = memoryview(buffer)
        else:
            content = memoryview(data).cast("B")
        header = blob_service_pb2.UploadBlobRequest(
            header=blob_service_pb2.BlobHeader(
                blob=common_pb2.BlobRef(blake3=blake3.blake3(content).digest(), size=len(content)),
                kind=kind,
            )
        )
        call: grpc.aio.StreamUnaryMultiCallable[bytes, blob_service_pb2.UploadBlobResponse] = (
            self._channel.stream_unary(
                self._UPLOAD,
                request_serializer=None,
                response_deserializer=blob_service_pb2.UploadBlobResponse.FromString,
            )
        )

        async def messages() -> AsyncIterator[bytes]:
            yield _serialize(header)
            for start in range(0, len(content), chunk_size):
                chunk = bytes(content[start : start + chunk_size])
                yield _serialize(blob_service_pb2.UploadBlobRequest(chunk=chunk))

        async def attempt() -> blob_service_pb2.UploadBlobResponse:
            response: blob_service_pb2.UploadBlobResponse = await call(
                messages(), timeout=timeout, metadata=_metadata(metadata)
            )
            return response

        return await self._with_retries(attempt, retry)

    def iter_download(
        self,
        blake3_digest: bytes,
        *,
        offset: int = 0,
        length: int = 0,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> AsyncIterator[bytes]:
        """Stream a blob's bytes (from ``offset``, ``length`` bytes or to the end when 0).

        ``timeout`` bounds each connection attempt (``None``: no deadline). A dropped stream is
        resumed from the next byte.
        """
        cursor = {"offset": offset, "remaining": length}

        def make_request() -> blob_service_pb2.GetBlobRequest:
            return blob_service_pb2.GetBlobRequest(
                blake3=blake3_digest, offset=cursor["offset"], length=cursor["remaining"]
            )

        def advance(response: blob_service_pb2.GetBlobResponse) -> None:
            cursor["offset"] = response.offset + len(response.chunk)
            if length:
                cursor["remaining"] = max(0, offset + length - cursor["offset"])

        async def chunks() -> AsyncIterator[bytes]:
            async for response in self._server_stream(
                self._GET,
                make_request,
                blob_service_pb2.GetBlobResponse,
                advance,
                timeout=timeout,
                metadata=metadata,
                retry=retry,
            ):
                yield response.chunk

        return chunks()

    async def download(
        self,
        blake3_digest: bytes,
        *,
        offset: int = 0,
        length: int = 0,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> bytes:
        """Download a blob (or a byte range of it) into memory.

        A whole blob is checked against ``blake3_digest``; :class:`BlobIntegrityError` when the
        bytes do not match.
        """
        parts = [
            chunk
            async for chunk in self.iter_download(
                blake3_digest,
                offset=offset,
                length=length,
                timeout=timeout,
                metadata=metadata,
                retry=retry,
            )
        ]
        content = b"".join(parts)
        if offset == 0 and length == 0 and blake3.blake3(content).digest() != blake3_digest:
            raise BlobIntegrityError(
                f"downloaded {len(content)} bytes do not hash to {blake3_digest.hex()}"
            )
        return content


class CommitmentClient(_ServiceClient):
    """``rollnet.v1.CommitmentService``: signed claims of finished work."""

    _SUBMIT = method_path("CommitmentService", "SubmitCommitment")
    _GET = method_path("CommitmentService", "GetCommitment")

    async def submit_commitment(
        self,
        request: commitment_service_pb2.SubmitCommitmentRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> commitment_service_pb2.SubmitCommitmentResponse:
        """Submit a commitment for a leased task; returns the coordinator's receipt."""
        return await self._unary(
            self._SUBMIT,
            request,
            commitment_service_pb2.SubmitCommitmentResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )

    async def get_commitment(
        self,
        request: commitment_service_pb2.GetCommitmentRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> commitment_service_pb2.GetCommitmentResponse:
        """Return a commitment and its state."""
        return await self._unary(
            self._GET,
            request,
            commitment_service_pb2.GetCommitmentResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )


class ValidationClient(_ServiceClient):
    """``rollnet.v1.ValidationService``: validation jobs and verdicts (validator role)."""

    _PULL = method_path("ValidationService", "PullValidationJob")
    _SUBMIT = method_path("ValidationService", "SubmitVerdict")

    async def pull_validation_job(
        self,
        request: validation_service_pb2.PullValidationJobRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> validation_service_pb2.PullValidationJobResponse:
        """Long-poll for a validation job. Without ``timeout`` the deadline covers the wait."""
        return await self._unary(
            self._PULL,
            request,
            validation_service_pb2.PullValidationJobResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
            default_timeout=_long_poll_timeout(self._timeout, request.wait),
        )

    async def submit_verdict(
        self,
        request: validation_service_pb2.SubmitVerdictRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> validation_service_pb2.SubmitVerdictResponse:
        """Record the verdict on a leased validation job."""
        return await self._unary(
            self._SUBMIT,
            request,
            validation_service_pb2.SubmitVerdictResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )


class CheckpointClient(_ServiceClient):
    """``rollnet.v1.CheckpointService``: signed checkpoint manifests."""

    _PUBLISH = method_path("CheckpointService", "PublishCheckpoint")
    _LATEST = method_path("CheckpointService", "GetLatestCheckpoint")
    _GET = method_path("CheckpointService", "GetCheckpoint")
    _WATCH = method_path("CheckpointService", "WatchCheckpoints")

    async def publish_checkpoint(
        self,
        request: checkpoint_service_pb2.PublishCheckpointRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> checkpoint_service_pb2.PublishCheckpointResponse:
        """Publish a checkpoint whose shards are uploaded (trainer role)."""
        return await self._unary(
            self._PUBLISH,
            request,
            checkpoint_service_pb2.PublishCheckpointResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )

    async def get_latest_checkpoint(
        self,
        request: checkpoint_service_pb2.GetLatestCheckpointRequest | None = None,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> checkpoint_service_pb2.GetLatestCheckpointResponse:
        """Return the newest published checkpoint."""
        return await self._unary(
            self._LATEST,
            request or checkpoint_service_pb2.GetLatestCheckpointRequest(),
            checkpoint_service_pb2.GetLatestCheckpointResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )

    async def get_checkpoint(
        self,
        request: checkpoint_service_pb2.GetCheckpointRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> checkpoint_service_pb2.GetCheckpointResponse:
        """Return the checkpoint of one step."""
        return await self._unary(
            self._GET,
            request,
            checkpoint_service_pb2.GetCheckpointResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )

    def watch(
        self,
        after_step: int = 0,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> AsyncIterator[checkpoint_pb2.Checkpoint]:
        """Yield each checkpoint published with a step greater than ``after_step``, live.

        Reconnects after a retryable failure, resuming after the last step seen.
        """
        cursor = {"after_step": after_step}

        def advance(response: checkpoint_service_pb2.WatchCheckpointsResponse) -> None:
            cursor["after_step"] = max(cursor["after_step"], response.checkpoint.step)

        async def checkpoints() -> AsyncIterator[checkpoint_pb2.Checkpoint]:
            async for response in self._server_stream(
                self._WATCH,
                lambda: checkpoint_service_pb2.WatchCheckpointsRequest(
                    after_step=cursor["after_step"]
                ),
                checkpoint_service_pb2.WatchCheckpointsResponse,
                advance,
                timeout=timeout,
                metadata=metadata,
                retry=retry,
            ):
                yield response.checkpoint

        return checkpoints()


class RolloutClient(_ServiceClient):
    """``rollnet.v1.RolloutService``: the trainer's demand and supply of rollouts."""

    _REQUEST = method_path("RolloutService", "RequestRollouts")
    _STREAM = method_path("RolloutService", "StreamRollouts")

    async def request_rollouts(
        self,
        request: rollout_service_pb2.RequestRolloutsRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> rollout_service_pb2.RequestRolloutsResponse:
        """Declare demand for rollouts; the coordinator turns it into tasks (trainer role)."""
        return await self._unary(
            self._REQUEST,
            request,
            rollout_service_pb2.RequestRolloutsResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )

    def stream(
        self,
        after_sequence: int = 0,
        *,
        min_checkpoint_step: int = 0,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> AsyncIterator[rollout_pb2.AcceptedRollout]:
        """Yield accepted rollouts with a sequence greater than ``after_sequence``, live.

        Reconnects after a retryable failure, resuming after the last sequence seen.
        """
        cursor = {"after_sequence": after_sequence}

        def advance(response: rollout_service_pb2.StreamRolloutsResponse) -> None:
            cursor["after_sequence"] = max(cursor["after_sequence"], response.rollout.sequence)

        async def rollouts() -> AsyncIterator[rollout_pb2.AcceptedRollout]:
            async for response in self._server_stream(
                self._STREAM,
                lambda: rollout_service_pb2.StreamRolloutsRequest(
                    after_sequence=cursor["after_sequence"],
                    min_checkpoint_step=min_checkpoint_step,
                ),
                rollout_service_pb2.StreamRolloutsResponse,
                advance,
                timeout=timeout,
                metadata=metadata,
                retry=retry,
            ):
                yield response.rollout

        return rollouts()


class LedgerClient(_ServiceClient):
    """``rollnet.v1.LedgerService``: read access to the contribution ledger."""

    _LIST = method_path("LedgerService", "ListEntries")
    _BALANCE = method_path("LedgerService", "GetBalance")
    _HEAD = method_path("LedgerService", "GetChainHead")

    async def list_entries(
        self,
        request: ledger_service_pb2.ListEntriesRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> ledger_service_pb2.ListEntriesResponse:
        """List ledger entries in sequence order."""
        return await self._unary(
            self._LIST,
            request,
            ledger_service_pb2.ListEntriesResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )

    async def get_balance(
        self,
        request: ledger_service_pb2.GetBalanceRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> ledger_service_pb2.GetBalanceResponse:
        """Return a node's totals."""
        return await self._unary(
            self._BALANCE,
            request,
            ledger_service_pb2.GetBalanceResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )

    async def get_chain_head(
        self,
        request: ledger_service_pb2.GetChainHeadRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> ledger_service_pb2.GetChainHeadResponse:
        """Return the newest signed chain head."""
        return await self._unary(
            self._HEAD,
            request,
            ledger_service_pb2.GetChainHeadResponse,
            timeout=timeout,
            metadata=metadata,
            retry=retry,
        )


class RollnetClient:
    """One signed channel and a client per service.

    ::

        async with RollnetClient.connect(config, identity) as client:
            await client.nodes.register_node(request)
    """

    def __init__(
        self, channel: grpc.aio.Channel, signer: RequestSigner, config: ConnectionConfig
    ) -> None:
        self.channel = channel
        self.signer = signer
        """Signs every call; set ``signer.clock_offset`` to follow the server's clock."""
        options: dict[str, Any] = {"timeout": config.timeout, "retry": config.retry}
        self.nodes = NodeClient(channel, **options)
        self.tasks = TaskClient(channel, **options)
        self.blobs = BlobClient(channel, **options)
        self.commitments = CommitmentClient(channel, **options)
        self.validation = ValidationClient(channel, **options)
        self.checkpoints = CheckpointClient(channel, **options)
        self.rollouts = RolloutClient(channel, **options)
        self.ledger = LedgerClient(channel, **options)

    @classmethod
    def connect(cls, config: ConnectionConfig, identity: Identity) -> RollnetClient:
        """Open a signed channel to ``config.target`` (connects lazily, on the first call)."""
        signer = RequestSigner(identity, config.network_id)
        return cls(open_channel(config, identity, signer=signer), signer, config)

    async def close(self, grace: float | None = None) -> None:
        """Close the channel (waiting up to ``grace`` seconds for calls in flight)."""
        await self.channel.close(grace)

    async def __aenter__(self) -> RollnetClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()
