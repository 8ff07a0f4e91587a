"""Request signing, client side: the signed byte string and the signing interceptors.

Every call carries six ASCII metadata headers (see ``docs/protocol.md``, "Request signing")::

    x-rollnet-key          base64url (no padding) of the raw 32-byte Ed25519 public key
    x-rollnet-audience     the network id the call is meant for
    x-rollnet-timestamp    unix time in milliseconds, decimal
    x-rollnet-nonce        16 random bytes, lowercase hex
    x-rollnet-body-blake3  lowercase hex BLAKE3-256 of the request message bytes on the wire
    x-rollnet-signature    base64url (no padding) of the Ed25519 signature of signed_bytes(...)

For client-streaming calls the body is the first message of the stream.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import blake3
import grpc

from rollnet.sdk.domains import SIGNING_DOMAIN
from rollnet.sdk.identity import Identity, b64url_encode

KEY_HEADER = "x-rollnet-key"
AUDIENCE_HEADER = "x-rollnet-audience"
TIMESTAMP_HEADER = "x-rollnet-timestamp"
NONCE_HEADER = "x-rollnet-nonce"
BODY_HASH_HEADER = "x-rollnet-body-blake3"
SIGNATURE_HEADER = "x-rollnet-signature"

SIGNING_HEADERS: tuple[str, ...] = (
    KEY_HEADER,
    AUDIENCE_HEADER,
    TIMESTAMP_HEADER,
    NONCE_HEADER,
    BODY_HASH_HEADER,
    SIGNATURE_HEADER,
)
"""All headers a signed call carries, each exactly once."""

# Printable ASCII without spaces: the audience travels in a header and in a newline-separated
# string, so it must not contain whitespace or control characters.
_AUDIENCE_RE = re.compile(r"[\x21-\x7e]+")


def is_valid_audience(audience: str) -> bool:
    """Whether ``audience`` can be a network id (non-empty printable ASCII, no spaces)."""
    return _AUDIENCE_RE.fullmatch(audience) is not None


def body_digest(body: bytes) -> str:
    """Lowercase hex BLAKE3-256 of ``body``, the value of ``x-rollnet-body-blake3``."""
    digest: str = blake3.blake3(body).hexdigest()
    return digest


def signed_bytes(audience: str, method: str, timestamp: str, nonce: str, body_blake3: str) -> bytes:
    """The exact bytes an Ed25519 request signature covers.

    ``b"rollnet-request-v1\\n" + audience + b"\\n" + method + b"\\n" + timestamp + b"\\n" + nonce
    + b"\\n" + body_blake3``, every field UTF-8 encoded exactly as it appears in its header
    (``method`` is the full gRPC method path, e.g. ``/rollnet.v1.NodeService/RegisterNode``).
    """
    return b"\n".join(
        (
            SIGNING_DOMAIN,
            audience.encode(),
            method.encode(),
            timestamp.encode(),
            nonce.encode(),
            body_blake3.encode(),
        )
    )


@dataclass(frozen=True, slots=True)
class SignedHeaders:
    """The signing headers of one call, as strings."""

    key: str
    audience: str
    timestamp: str
    nonce: str
    body_blake3: str
    signature: str

    def as_metadata(self) -> tuple[tuple[str, str], ...]:
        """The headers as gRPC metadata pairs."""
        return (
            (KEY_HEADER, self.key),
            (AUDIENCE_HEADER, self.audience),
            (TIMESTAMP_HEADER, self.timestamp),
            (NONCE_HEADER, self.nonce),
            (BODY_HASH_HEADER, self.body_blake3),
            (SIGNATURE_HEADER, self.signature),
        )


class RequestSigner:
    """Signs calls for one identity and one network.

    ``clock`` returns unix seconds; ``clock_offset`` (seconds, settable) is added to it, so a node
    can follow the coordinator's clock (``RegisterNodeResponse.server_time``) when its own drifts.
    """

    def __init__(
        self,
        identity: Identity,
        audience: str,
        *,
        clock: Callable[[], float] = time.time,
        clock_offset: float = 0.0,
    ) -> None:
        if not is_valid_audience(audience):
            raise ValueError(f"invalid network id {audience!r}: need printable ASCII, no spaces")
        self.identity = identity
        self.audience = audience
        self.clock = clock
        self.clock_offset = clock_offset
        self._key = b64url_encode(identity.public_key)

    def sign(self, method: str, body: bytes, *, nonce: bytes | None = None) -> SignedHeaders:
        """The headers for a call of ``method`` whose (first) request message is ``body``.

        A fresh random nonce is drawn unless ``nonce`` (16 bytes) is given.
        """
        timestamp = str(int((self.clock() + self.clock_offset) * 1000))
        nonce_hex = (os.urandom(16) if nonce is None else nonce).hex()
        digest = body_digest(body)
        signature = self.identity.sign(
            signed_bytes(self.audience, method, timestamp, nonce_hex, digest)
        )
        return SignedHeaders(
            key=self._key,
            audience=self.audience,
            timestamp=timestamp,
            nonce=nonce_hex,
            body_blake3=digest,
            signature=b64url_encode(signature),
        )


def _wire_bytes(request: Any) -> bytes:
    # Typed clients hand the interceptor pre-serialized bytes (deterministic serialization, sent
    # as is). Generated stubs hand it a message and serialize it with SerializeToString(), so the
    # same call here yields the same bytes for the same message object.
    if isinstance(request, bytes | bytearray | memoryview):
        return bytes(request)
    data: bytes = request.SerializeToString()
    return data


def _method_name(details: grpc.aio.ClientCallDetails) -> str:
    method = details.method
    return method.decode() if isinstance(method, bytes) else str(method)


def _with_headers(
    details: grpc.aio.ClientCallDetails, headers: SignedHeaders
) -> grpc.aio.ClientCallDetails:
    # Any signing headers already present (a retry of captured metadata) are replaced, never
    # duplicated: the server refuses a header that appears twice.
    metadata = grpc.aio.Metadata()
    for key, value in details.metadata or ():
        if key not in SIGNING_HEADERS:
            metadata.add(key, value)
    for key, value in headers.as_metadata():
        metadata.add(key, value)
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


async def _split_first(requests: Any) -> tuple[list[Any], AsyncIterator[Any] | Iterable[Any]]:
    """Take the first message of a request stream; return it (0 or 1 items) and the rest."""
    if isinstance(requests, AsyncIterable):
        iterator = aiter(requests)
        try:
            return [await anext(iterator)], iterator
        except StopAsyncIteration:
            return [], iterator
    sync_iterator = iter(requests)
    for first in sync_iterator:
        return [first], sync_iterator
    return [], sync_iterator


async def _chain(head: list[Any], rest: AsyncIterator[Any] | Iterable[Any]) -> AsyncIterator[Any]:
    for item in head:
        yield item
    if isinstance(rest, AsyncIterator):
        async for item in rest:
            yield item
    else:
        for item in rest:
            yield item


class _UnaryUnarySigner(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, signer: RequestSigner) -> None:
        self._signer = signer

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        headers = self._signer.sign(_method_name(client_call_details), _wire_bytes(request))
        return await continuation(_with_headers(client_call_details, headers), request)


class _UnaryStreamSigner(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, signer: RequestSigner) -> None:
        self._signer = signer

    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        headers = self._signer.sign(_method_name(client_call_details), _wire_bytes(request))
        return await continuation(_with_headers(client_call_details, headers), request)


class _StreamUnarySigner(grpc.aio.StreamUnaryClientInterceptor):
    def __init__(self, signer: RequestSigner) -> None:
        self._signer = signer

    async def intercept_stream_unary(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        head, rest = await _split_first(request_iterator)
        body = _wire_bytes(head[0]) if head else b""
        headers = self._signer.sign(_method_name(client_call_details), body)
        return await continuation(_with_headers(client_call_details, headers), _chain(head, rest))


class _StreamStreamSigner(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, signer: RequestSigner) -> None:
        self._signer = signer

    async def intercept_stream_stream(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        head, rest = await _split_first(request_iterator)
        body = _wire_bytes(head[0]) if head else b""
        headers = self._signer.sign(_method_name(client_call_details), body)
        return await continuation(_with_headers(client_call_details, headers), _chain(head, rest))


def signing_interceptors(signer: RequestSigner) -> Sequence[grpc.aio.ClientInterceptor]:
    """Client interceptors that sign every call made on a ``grpc.aio`` channel.

    grpc.aio sorts interceptors by kind, so there is one per call kind; pass all of them:
    ``grpc.aio.insecure_channel(target, interceptors=signing_interceptors(signer))``. Works with
    the generated stubs and with :mod:`rollnet.sdk.client` (which sends pre-serialized bytes).
    """
    return (
        _UnaryUnarySigner(signer),
        _UnaryStreamSigner(signer),
        _StreamUnarySigner(signer),
        _StreamStreamSigner(signer),
    )
