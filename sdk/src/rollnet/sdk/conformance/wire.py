# gRPC deadlines are per call, so the call helpers take `timeout` on purpose.
# ruff: noqa: ASYNC109
"""Calls exactly as the suite means them: chosen bytes, chosen headers, nothing added.

The SDK's clients sign correctly and retry; a conformance suite must also send what an honest
client never would (a header missing, a body that does not match its digest, a signature for
another method) and see the refusal as it came off the wire. :class:`Wire` is a bare
``grpc.aio`` channel without interceptors or retries; :func:`signing_headers` builds the six
signing headers from the SDK's signing code, with any part of them overridden; :func:`refusal`
checks that an error is the documented refusal, details included.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from google.rpc import error_details_pb2

from rollnet.sdk.client import TlsConfig
from rollnet.sdk.conformance.suite import CaseFailure
from rollnet.sdk.errors import ERROR_DOMAIN, RollnetError, from_rpc_error
from rollnet.sdk.identity import Identity, b64url_encode
from rollnet.sdk.signing import (
    AUDIENCE_HEADER,
    BODY_HASH_HEADER,
    KEY_HEADER,
    NONCE_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    body_digest,
    signed_bytes,
)
from rollnet.sdk.version import software_version

M = TypeVar("M", bound=Message)
Headers = list[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Tamper:
    """What to change in a call's signing headers (``None``: the honest value).

    ``signed_*`` change what the signature covers without changing the header that claims it;
    the header fields change the header only (what the server reads), after signing.
    """

    audience: str | None = None
    """The audience both signed and sent."""
    timestamp_ms: int | None = None
    """The timestamp both signed and sent."""
    nonce: str | None = None
    """The nonce both signed and sent (32 lowercase hex digits when honest)."""
    signed_method: str | None = None
    """The method the signature covers (another method's signature)."""
    signed_body: bytes | None = None
    """The body the digest header and the signature cover (a tampered body)."""
    signer: Identity | None = None
    """Who signs (a forged signature: the header names the caller's key)."""


def signing_headers(
    identity: Identity,
    network_id: str,
    method: str,
    body: bytes,
    tamper: Tamper | None = None,
    *,
    clock_offset: float = 0.0,
) -> Headers:
    """The six signing headers of one call of ``method`` with request bytes ``body``."""
    t = tamper or Tamper()
    audience = network_id if t.audience is None else t.audience
    timestamp = str(
        int((time.time() + clock_offset) * 1000) if t.timestamp_ms is None else t.timestamp_ms
    )
    nonce = os.urandom(16).hex() if t.nonce is None else t.nonce
    digest = body_digest(body if t.signed_body is None else t.signed_body)
    signer = identity if t.signer is None else t.signer
    signature = signer.sign(
        signed_bytes(audience, t.signed_method or method, timestamp, nonce, digest)
    )
    return [
        (KEY_HEADER, b64url_encode(identity.public_key)),
        (AUDIENCE_HEADER, audience),
        (TIMESTAMP_HEADER, timestamp),
        (NONCE_HEADER, nonce),
        (BODY_HASH_HEADER, digest),
        (SIGNATURE_HEADER, b64url_encode(signature)),
    ]


def replace_header(headers: Headers, name: str, value: str | None) -> Headers:
    """``headers`` with ``name``'s value replaced (``None``: removed)."""
    out = [(key, val) for key, val in headers if key != name]
    if value is not None:
        out.append((name, value))
    return out


class Wire:
    """A bare channel to the target: no interceptors, no retries, generous message limits."""

    def __init__(
        self, target: str, *, tls: TlsConfig | None = None, max_message_bytes: int = 64 << 20
    ) -> None:
        options: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.enable_retries", 0),
            ("grpc.primary_user_agent", software_version("conformance")),
        ]
        self.target = target
        if tls is None:
            self.channel = grpc.aio.insecure_channel(target, options=options)
        else:
            if tls.server_name_override:
                options.append(("grpc.ssl_target_name_override", tls.server_name_override))
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(tls.root_certificates),
                private_key=_read(tls.client_key),
                certificate_chain=_read(tls.client_certificate),
            )
            self.channel = grpc.aio.secure_channel(target, credentials, options=options)

    async def close(self) -> None:
        """Close the channel."""
        await self.channel.close()

    async def unary(
        self, method: str, body: bytes, headers: Headers, response: type[M], *, timeout: float
    ) -> M:
        """One unary call; a refusal raises :class:`~rollnet.sdk.errors.RollnetError`."""
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, M] = self.channel.unary_unary(
            method, request_serializer=None, response_deserializer=response.FromString
        )
        try:
            result: M = await call(body, metadata=tuple(headers), timeout=timeout)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(error) from None
        return result

    async def raw_unary(
        self, method: str, body: bytes, headers: Headers, *, timeout: float
    ) -> bytes:
        """One unary call whose response is left as bytes."""
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = self.channel.unary_unary(
            method, request_serializer=None, response_deserializer=None
        )
        try:
            result: bytes = await call(body, metadata=tuple(headers), timeout=timeout)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(error) from None
        return result

    async def client_stream(
        self,
        method: str,
        messages: Sequence[bytes],
        headers: Headers,
        response: type[M],
        *,
        timeout: float,
    ) -> M:
        """A client-streaming call sending exactly ``messages``."""
        call: grpc.aio.StreamUnaryMultiCallable[bytes, M] = self.channel.stream_unary(
            method, request_serializer=None, response_deserializer=response.FromString
        )

        async def stream() -> AsyncIterator[bytes]:
            for message in messages:
                yield message

        try:
            result: M = await call(stream(), metadata=tuple(headers), timeout=timeout)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(error) from None
        return result

    def server_stream(
        self, method: str, body: bytes, headers: Headers, response: type[M], *, timeout: float
    ) -> Any:
        """A server-streaming call (iterate it; a refusal raises ``grpc.aio.AioRpcError``)."""
        call: grpc.aio.UnaryStreamMultiCallable[bytes, M] = self.channel.unary_stream(
            method, request_serializer=None, response_deserializer=response.FromString
        )
        return call(body, metadata=tuple(headers), timeout=timeout)


def _read(path: Any) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as file:
        return file.read()


def error_infos(error: RollnetError) -> list[error_details_pb2.ErrorInfo]:
    """Every ``google.rpc.ErrorInfo`` of the error's status details."""
    infos = []
    for detail in error.status.details if error.status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            infos.append(info)
    return infos


def describe(error: RollnetError) -> str:
    """``CODE/REASON: message`` (what the target answered, for failure messages)."""
    reason = f"/{error.reason}" if error.reason else " (no ErrorInfo)"
    return f"{error.code.name}{reason}: {error.message[:200]}"


_BAD_CODES = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)


def check_details(error: RollnetError, *, violations: bool = True) -> None:
    """The error-details rules every refusal follows (docs/protocol.md, *Errors*): a
    ``google.rpc.Status`` whose code is the call's, exactly one ``ErrorInfo`` of domain
    ``rollnet``, field violations with INVALID_FIELDS, a ``RetryInfo`` with every
    RESOURCE_EXHAUSTED that waiting cures and every UNAVAILABLE; never INTERNAL or UNKNOWN."""
    if error.code in _BAD_CODES:
        raise CaseFailure(f"answered {describe(error)}: a refusal is never INTERNAL or UNKNOWN")
    if error.status is None:
        raise CaseFailure(
            f"answered {error.code.name} without a google.rpc.Status in grpc-status-details-bin "
            "(or with one whose code is not the call's)"
        )
    infos = error_infos(error)
    if len(infos) != 1:
        raise CaseFailure(f"answered {describe(error)} with {len(infos)} ErrorInfo, not one")
    if infos[0].domain != ERROR_DOMAIN:
        raise CaseFailure(f"ErrorInfo.domain is {infos[0].domain!r}, not {ERROR_DOMAIN!r}")
    if violations and error.reason == "INVALID_FIELDS" and not error.field_violations:
        raise CaseFailure("INVALID_FIELDS without a BadRequest field violation")
    waits = {"RATE_LIMITED", "STORAGE_FULL", "NOT_SERVING"}
    if (error.reason in waits or error.code is grpc.StatusCode.UNAVAILABLE) and (
        error.retry_after is None
    ):
        raise CaseFailure(f"answered {describe(error)} without a RetryInfo")


def refusal(
    error: RollnetError,
    code: grpc.StatusCode,
    *reasons: str,
    field: str | None = None,
    violations: bool = True,
) -> RollnetError:
    """Check that ``error`` is ``code`` with one of ``reasons`` (and, with ``field``, a field
    violation naming it or a path under it) and carries well-formed details; returns it.
    ``violations=False`` lets INVALID_FIELDS come without field violations (a message that does
    not parse has no field to name)."""
    expected = f"{code.name}/{'|'.join(reasons)}"
    if error.code is not code or error.reason not in reasons:
        raise CaseFailure(f"expected {expected}, got {describe(error)}")
    check_details(error, violations=violations)
    if field is not None:
        paths = [violation.field for violation in error.field_violations]
        if not any(path == field or path.startswith((field + ".", field + "[")) for path in paths):
            raise CaseFailure(f"expected a field violation at {field!r}, got {paths}")
    return error
