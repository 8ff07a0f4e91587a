# gRPC deadlines are per call (and per attempt), so the RPC methods take `timeout` on purpose.
# ruff: noqa: ASYNC109
"""Typed async clients, one per service, and the connection they share.

Each RPC is one ``async def`` taking the request message plus keyword-only ``timeout`` (seconds
per attempt; ``None`` means the client's default for unary calls), ``metadata`` (extra pairs) and
``retry`` (a :class:`~rollnet.sdk.retry.RetryPolicy`; ``None`` means the client's default). It
returns the response message or raises a :class:`~rollnet.sdk.errors.RollnetError` subclass.

The unary methods are generated from the service descriptors (:mod:`rollnet.sdk._client_generated`,
written by ``make codegen``), long polls among them: a request with a ``wait`` gets a default
deadline that covers it. The methods written here add behaviour: uploads and downloads in chunks,
resumable streams.

Requests are serialized once, deterministically, and the signing interceptor hashes exactly the
bytes that are sent. A mutating request whose ``request_id`` is empty gets a fresh one (uuid4 hex)
that every retry of that call reuses; the caller's message is never modified.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import blake3
import grpc

from rollnet.sdk import _client_generated as generated
from rollnet.sdk._service_client import Metadata as Metadata  # public here
from rollnet.sdk._service_client import (
    ServiceClient,
    call_metadata,
    parsed,
    serialize_request,
)
from rollnet.sdk.identity import Identity
from rollnet.sdk.methods import method_path
from rollnet.sdk.retry import RetryPolicy
from rollnet.sdk.signing import RequestSigner, signing_interceptors
from rollnet.sdk.version import software_version
from rollnet.v1 import (
    blob_service_pb2,
    checkpoint_pb2,
    checkpoint_service_pb2,
    common_pb2,
    rollout_pb2,
    rollout_service_pb2,
)

DEFAULT_CHUNK_SIZE = 1 << 20
"""Bytes per upload chunk (well under gRPC's default 4 MiB message cap)."""


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
    user_agent: str = software_version("sdk")


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


class NodeClient(generated.NodeServiceMethods):
    """``rollnet.v1.NodeService``: admission and liveness."""


class TaskClient(generated.TaskServiceMethods):
    """``rollnet.v1.TaskService``: leases on rollout tasks (worker role)."""


class BlobClient(ServiceClient):
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
        digest: bytes | None = None,
    ) -> blob_service_pb2.UploadBlobResponse:
        """Upload one blob; returns its content address as stored.

        The BLAKE3 digest and size go in the header message, so they are computed first: an
        async iterable is read into memory before anything is sent. ``digest``: the blob's
        BLAKE3 when the caller has it already (a publisher hashed its shards as it read them),
        so it is not computed again here; the server checks it all the same (a wrong one is
        refused, ``BLOB_HASH_MISMATCH``). A retry resends everything.
        """
        if chunk_size < 1:
            raise ValueError("chunk_size must be positive")
        if digest is not None and len(digest) != 32:
            raise ValueError(f"digest must be a 32-byte BLAKE3 digest, not {len(digest)} bytes")
        if isinstance(data, AsyncIterable):
            buffer = bytearray()
            async for piece in data:
                buffer += piece
            content = memoryview(buffer)
        else:
            content = memoryview(data).cast("B")
        header = blob_service_pb2.UploadBlobRequest(
            header=blob_service_pb2.BlobHeader(
                blob=common_pb2.BlobRef(
                    blake3=blake3.blake3(content).digest() if digest is None else bytes(digest),
                    size=len(content),
                ),
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
            yield serialize_request(header)
            for start in range(0, len(content), chunk_size):
                chunk = bytes(content[start : start + chunk_size])
                yield serialize_request(blob_service_pb2.UploadBlobRequest(chunk=chunk))

        async def attempt() -> blob_service_pb2.UploadBlobResponse:
            response: blob_service_pb2.UploadBlobResponse | None = await call(
                messages(), timeout=timeout, metadata=call_metadata(metadata)
            )
            return parsed(response, self._UPLOAD, blob_service_pb2.UploadBlobResponse)

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


class CommitmentClient(generated.CommitmentServiceMethods):
    """``rollnet.v1.CommitmentService``: signed claims of finished work."""


class ValidationClient(generated.ValidationServiceMethods):
    """``rollnet.v1.ValidationService``: validation jobs and verdicts (validator role)."""


class CheckpointClient(generated.CheckpointServiceMethods):
    """``rollnet.v1.CheckpointService``: signed checkpoint manifests."""

    _WATCH = method_path("CheckpointService", "WatchCheckpoints")

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


class RolloutClient(generated.RolloutServiceMethods):
    """``rollnet.v1.RolloutService``: the trainer's demand and supply of rollouts."""

    _STREAM = method_path("RolloutService", "StreamRollouts")

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


class LedgerClient(generated.LedgerServiceMethods):
    """``rollnet.v1.LedgerService``: read access to the contribution ledger."""


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
