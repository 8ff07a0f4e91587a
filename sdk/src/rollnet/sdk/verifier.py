"""Request signing, server side: a ``grpc.aio`` server interceptor that verifies every call.

Plug it into any ``grpc.aio`` server::

    verifier = RequestVerifier(VerifierConfig(audience="my-net", key_resolver=resolve_key,
                                              method_policy=default_method_policy()))
    server = grpc.aio.server(interceptors=[verifier])

It rebuilds each method handler so the request deserializer sees the raw bytes received, checks the
signing headers against them, and only then parses the message with the original deserializer
and runs the handler. Handlers read the verified caller with :func:`current_caller`.

Given ``max_message_bytes``, it first refuses a message over that size with RESOURCE_EXHAUSTED /
``MESSAGE_TOO_LARGE`` (an ``ErrorInfo`` naming the cap), every message of a client stream as it
arrives. gRPC's own limit (``grpc.max_receive_message_length``) answers RESOURCE_EXHAUSTED with
no details before any handler runs, so set it above this cap (twice it, say): only messages
beyond gRPC's limit then go without the rich error.
"""

from __future__ import annotations

import binascii
import contextvars
import functools
import inspect
import ipaddress
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from rollnet.sdk.errors import REASON_CODES, ErrorReason, abort
from rollnet.sdk.identity import (
    PUBLIC_KEY_SIZE,
    SIGNATURE_SIZE,
    b64url_decode,
    b64url_encode,
    node_id_from_public_key,
    verify_signature,
)
from rollnet.sdk.methods import EXEMPT_PREFIXES, REGISTER_NODE
from rollnet.sdk.nonce_cache import NonceCache, NonceCacheFull
from rollnet.sdk.signing import (
    AUDIENCE_HEADER,
    BODY_HASH_HEADER,
    KEY_HEADER,
    NONCE_HEADER,
    SIGNATURE_HEADER,
    SIGNING_HEADERS,
    TIMESTAMP_HEADER,
    body_digest,
    is_valid_audience,
    signed_bytes,
)
from rollnet.v1 import common_pb2

_log = logging.getLogger(__name__)

_TIMESTAMP_RE = re.compile(r"0|[1-9][0-9]{0,15}")
_NONCE_RE = re.compile(r"[0-9a-f]{32}")
_DIGEST_RE = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class KnownKey:
    """What the server knows about a public key: the answer of a :data:`KeyResolver`."""

    node_id: str
    role: int
    """A ``rollnet.v1.Role`` value."""
    banned: bool = False
    revoked: str = ""
    """Why the key may no longer act in its role (e.g. taken off the server's allow-list for
    it); non-empty refuses every call but registration with ``ROLE_NOT_PERMITTED``."""


KeyResolver = Callable[[bytes], Awaitable[KnownKey | None]]
"""Looks up a raw public key; ``None`` when the key is not registered."""

NonceRecorder = Callable[[bytes, str, int], Awaitable[bool]]
"""Records a verified call's nonce where every replica and every restart of the server sees it
(a shared database): ``(public key, nonce, signed timestamp in Unix ms) -> False`` when it was
recorded before, i.e. the call is a replay. It must be remembered until the signature's window
has closed (the signed timestamp plus the skew window)."""


@dataclass(frozen=True, slots=True)
class SignedNonce:
    """The nonce of the call being handled, for a handler that records it itself
    (:attr:`VerifierConfig.deferred_nonce_methods`)."""

    public_key: bytes
    nonce: str
    timestamp_ms: int
    """The signed timestamp (``x-rollnet-timestamp``), Unix milliseconds."""
    expires_at: float
    """Unix seconds after which the call's signature is refused as stale anyway (its signed
    timestamp plus the skew window): how long the nonce must be remembered."""


@dataclass(frozen=True, slots=True)
class VerifiedCaller:
    """The verified identity behind the current call."""

    node_id: str
    role: int
    """A ``rollnet.v1.Role`` value; ``ROLE_UNSPECIFIED`` for an unregistered key (RegisterNode)."""
    public_key: bytes
    registered: bool


_CALLER: contextvars.ContextVar[VerifiedCaller] = contextvars.ContextVar("rollnet_caller")
_SIGNED_NONCE: contextvars.ContextVar[SignedNonce] = contextvars.ContextVar("rollnet_nonce")
_REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("rollnet_request_id")


def current_caller() -> VerifiedCaller:
    """The verified caller of the call being handled.

    Raises ``LookupError`` outside a call admitted by a :class:`RequestVerifier` (for example in a
    health check handler, which is exempt from signing).
    """
    try:
        return _CALLER.get()
    except LookupError:
        raise LookupError(
            "no verified caller: not inside a call admitted by RequestVerifier"
        ) from None


def current_nonce() -> SignedNonce:
    """The signing nonce of the call being handled (``LookupError`` outside a verified call)."""
    return _SIGNED_NONCE.get()


def current_request_id() -> str:
    """The correlation id of the call being handled ("" outside one).

    The request message's ``request_id`` when it has a non-empty one (so retries of one logical
    call share it), otherwise the call's signing nonce.
    """
    return _REQUEST_ID.get("")


class VerificationError(Exception):
    """A call failed verification; ``reason`` and ``code`` are what the client receives."""

    def __init__(
        self,
        reason: ErrorReason,
        message: str,
        metadata: Mapping[str, str] | None = None,
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.code = REASON_CODES[reason]
        self.message = message
        #: ``ErrorInfo`` metadata of the refusal (which bound refused it, say).
        self.metadata = dict(metadata or {})
        #: Seconds the caller should wait before retrying (``None``: no hint of its own).
        self.retry_after = retry_after


#: Seconds a nonce stays in memory past ``2 * skew`` after it was recorded: the window's both
#: ends are accepted, and the signed timestamp is compared in whole milliseconds.
NONCE_TTL_MARGIN = 1.0


def _default_exempt() -> frozenset[str]:
    return EXEMPT_PREFIXES


def _default_registration() -> frozenset[str]:
    return frozenset({REGISTER_NODE})


@dataclass
class VerifierConfig:
    """Settings of a :class:`RequestVerifier`."""

    audience: str
    """This server's network id; calls signed for another audience are refused."""
    key_resolver: KeyResolver
    """Looks up a caller's key (in the ledger, typically)."""
    method_policy: Mapping[str, frozenset[int]]
    """Full method path → the ``rollnet.v1.Role`` values that may call it; others are refused."""
    skew: float = 60.0
    """Largest accepted distance, in seconds, between the signed timestamp and the server clock
    (in either direction)."""
    nonce_capacity: int = 500_000
    """Live nonces of registered keys beyond their reserve, all keys together (a few hundred
    bytes each; at the default window this allows about 4,000 calls per second)."""
    nonce_capacity_per_key: int = 12_000
    """Most live nonces of one registered key (at the default window, about 100 calls per
    second)."""
    nonce_reserved_per_key: int = 32
    """Live nonces every registered key may hold whatever other keys hold: the calls of an
    ordinary node (a heartbeat every 10 s, its pulls and submissions) within the window."""
    nonce_max_keys: int = 20_000
    """Most registered keys holding live nonces at once (keys that called within the window)."""
    nonce_max_unregistered_keys: int = 10_000
    """Most unregistered keys holding live nonces at once: keys registering within the window.
    Beyond it new fresh keys are refused ``RATE_LIMITED``; registered keys are not affected."""
    nonce_unregistered_per_key: int = 8
    """Most live nonces of one unregistered key (its RegisterNode attempts within the window)."""
    nonce_trusted_roles: frozenset[int] = frozenset()
    """Roles (``rollnet.v1.Role`` values) whose keys the server trusts (an allow-list decides who
    may take them): their nonces are bounded by ``nonce_capacity_per_key`` alone, never by the
    shared pool or ``nonce_max_keys``, which other registered keys can fill."""
    nonce_unregistered_per_address: int | None = 256
    """Most unregistered keys holding live nonces from one network address (the peer's IPv4
    address, or its IPv6 /64 network): a flood from one address cannot fill the pool of
    ``nonce_max_unregistered_keys`` alone (``None``: no per-address share)."""
    registration_methods: frozenset[str] = field(default_factory=_default_registration)
    """Methods an unknown key may call (its caller then has role ``ROLE_UNSPECIFIED``)."""
    exempt_prefixes: frozenset[str] = field(default_factory=_default_exempt)
    """Method path prefixes served without any signature (health, reflection)."""
    clock: Callable[[], float] = time.time
    """Unix time in seconds (tests inject a fixed one)."""
    nonce_clock: Callable[[], float] = time.monotonic
    """Monotonic seconds, which the replay cache's entries expire by (tests inject one)."""
    max_message_bytes: int | None = None
    """Largest request message accepted (``None``: no cap beyond gRPC's own); a larger one is
    refused with RESOURCE_EXHAUSTED / ``MESSAGE_TOO_LARGE`` before its signature is checked."""
    nonce_recorder: NonceRecorder | None = None
    """Where nonces are recorded beyond this process (``None``: in its memory only, so a call
    captured before a restart, or sent to another replica, would be accepted once more). A
    recorded nonce refuses its replay with ``NONCE_REPLAYED``; a recorder that fails refuses
    the call with UNAVAILABLE / ``NOT_SERVING``."""
    deferred_nonce_methods: frozenset[str] = frozenset()
    """Methods whose handlers hand the nonce (:func:`current_nonce`) to the recorder
    themselves, in the transaction of their own effect (a heartbeat's batch, say), rather than
    have the verifier record it first."""


class WrapperCache:
    """One wrapper per method, for ``grpc.aio`` interceptors that wrap method handlers.

    A wrapper that reads each call's details from its context (not from the handler call
    details) serves every call of its method, as long as the handler inside stays the same
    object; building one per call costs more than the rest of the interceptor's work.
    """

    def __init__(self, wrap: Callable[[Any, str], Any]) -> None:
        self._wrap = wrap
        self._by_method: dict[str, tuple[Any, Any]] = {}

    def get(self, handler: Any, method: str) -> Any:
        """The wrapper of ``handler`` for ``method``, built on first use."""
        cached = self._by_method.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler, method)
        self._by_method[method] = (handler, wrapped)
        return wrapped


class RequestVerifier(grpc.aio.ServerInterceptor):
    """Verifies the signature of every call of a ``grpc.aio`` server (see module docs).

    Refusals are UNAUTHENTICATED or PERMISSION_DENIED (RESOURCE_EXHAUSTED ``RATE_LIMITED`` when
    the nonce cache is full) with a rollnet ``ErrorInfo`` reason.
    Handlers of client-streaming methods must read requests from the request iterator (not
    ``context.read()``): the first message is the signed body.
    """

    def __init__(self, config: VerifierConfig) -> None:
        if not is_valid_audience(config.audience):
            raise ValueError(f"invalid network id {config.audience!r}")
        self.config = config
        self.nonces = NonceCache(
            # Both ends of the window are accepted (|skew| == window), the wall clock is read in
            # whole milliseconds and may slew against the monotonic one: a margin past 2 * skew.
            ttl=2 * config.skew + NONCE_TTL_MARGIN,
            capacity=config.nonce_capacity,
            per_key_capacity=config.nonce_capacity_per_key,
            reserved_per_key=config.nonce_reserved_per_key,
            max_keys=config.nonce_max_keys,
            max_unregistered_keys=config.nonce_max_unregistered_keys,
            unregistered_per_key=config.nonce_unregistered_per_key,
            unregistered_per_address=config.nonce_unregistered_per_address,
            clock=config.nonce_clock,
        )
        self._wrappers = WrapperCache(self._wrap)

    async def verify(
        self, method: str, metadata: Any, body: bytes, peer: str | None = None
    ) -> VerifiedCaller:
        """Check one call's signing headers against the bytes of its (first) request message.

        ``metadata`` is the call's invocation metadata (key/value pairs); ``peer`` the caller's
        address as gRPC names it (``ipv4:203.0.113.7:51234``), which an unregistered key's
        nonce is counted against. Returns the caller, or raises :class:`VerificationError`;
        records the nonce once the signature verifies.
        """
        config = self.config
        headers = _signing_headers(metadata)
        key, signature, nonce = _decode_headers(headers)
        audience = headers[AUDIENCE_HEADER]
        timestamp = headers[TIMESTAMP_HEADER]
        digest = headers[BODY_HASH_HEADER]
        if audience != config.audience:
            raise VerificationError(
                ErrorReason.AUDIENCE_MISMATCH,
                f"call signed for network {audience!r}, this is {config.audience!r}",
            )
        skew_ms = int(timestamp) - int(config.clock() * 1000)
        if abs(skew_ms) > config.skew * 1000:
            raise VerificationError(
                ErrorReason.TIMESTAMP_SKEW,
                f"signed timestamp is {skew_ms / 1000:+.3f} s from server time "
                f"(window ±{config.skew:g} s); fix the clock",
            )
        if body_digest(body) != digest:
            raise VerificationError(
                ErrorReason.BODY_HASH_MISMATCH, "request bytes do not hash to the signed digest"
            )
        if not verify_signature(
            key, signature, signed_bytes(audience, method, timestamp, nonce, digest)
        ):
            raise VerificationError(
                ErrorReason.SIGNATURE_INVALID, f"signature does not verify for {method}"
            )
        known = await config.key_resolver(key)
        if known is None and method not in config.registration_methods:
            raise VerificationError(
                ErrorReason.UNKNOWN_KEY, "key is not registered; call RegisterNode first"
            )
        try:
            # Partitioned per key: fresh keys (registering) have a pool of their own, so a
            # flood of them can neither evict nor crowd out registered keys' nonces.
            fresh = self.nonces.record(
                key,
                nonce,
                registered=known is not None,
                trusted=known is not None
                and known.role in config.nonce_trusted_roles
                and not known.banned
                and not known.revoked,
                address=_peer_address(peer),
            )
        except NonceCacheFull as full:
            raise VerificationError(
                ErrorReason.RATE_LIMITED,
                full.message,
                metadata={"nonce_limit": full.limit},
                retry_after=full.retry_after,
            ) from None
        if not fresh:
            raise VerificationError(ErrorReason.NONCE_REPLAYED, "nonce already used by this key")
        signed = SignedNonce(key, nonce, int(timestamp), int(timestamp) / 1000 + config.skew)
        if config.nonce_recorder is not None and method not in config.deferred_nonce_methods:
            try:
                fresh = await config.nonce_recorder(key, nonce, signed.timestamp_ms)
            except Exception as error:
                _log.warning("nonce_not_recorded", extra={"method": method, "error": repr(error)})
                raise VerificationError(
                    ErrorReason.NOT_SERVING, "the replay cache cannot be written; retry later"
                ) from None
            if not fresh:
                raise VerificationError(
                    ErrorReason.NONCE_REPLAYED, "nonce already used by this key"
                )
        _SIGNED_NONCE.set(signed)
        if known is not None and known.banned:
            raise VerificationError(ErrorReason.NODE_BANNED, "key is banned")
        if known is not None and known.revoked and method not in config.registration_methods:
            raise VerificationError(ErrorReason.ROLE_NOT_PERMITTED, known.revoked)
        allowed = config.method_policy.get(method)
        if allowed is None:
            raise VerificationError(ErrorReason.ROLE_NOT_ALLOWED, f"{method} is not callable")
        if known is None:
            return VerifiedCaller(
                node_id_from_public_key(key), common_pb2.ROLE_UNSPECIFIED, key, False
            )
        if known.role not in allowed:
            raise VerificationError(
                ErrorReason.ROLE_NOT_ALLOWED,
                f"role {_role_name(known.role)} may not call {method}",
            )
        return VerifiedCaller(known.node_id, known.role, key, True)

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        """Wrap the method handler so it verifies the call before running (grpc.aio API)."""
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or any(method.startswith(p) for p in self.config.exempt_prefixes):
            return handler
        return self._wrappers.get(handler, method)

    def _wrap(self, handler: Any, method: str) -> Any:
        # The wrapper reads each call's metadata from its context: one serves every call.
        if handler.request_streaming:
            return self._wrap_stream_request(handler, method)
        return self._wrap_unary_request(handler, method)

    async def _admit(
        self, method: str, metadata: Any, body: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> VerifiedCaller:
        cap = self.config.max_message_bytes
        if cap is not None and len(body) > cap:
            await _refuse_size(context, len(body), cap)
        try:
            caller = await self.verify(method, metadata, body, context.peer())
        except VerificationError as exc:
            _log.info(
                "call_refused",
                extra={"method": method, "reason": str(exc.reason), "peer": context.peer()},
            )
            retry_after = (
                # At least a second; a key at its own bound waits for its oldest nonce to expire.
                max(1.0, exc.retry_after or 0.0)
                if exc.reason in (ErrorReason.RATE_LIMITED, ErrorReason.NOT_SERVING)
                else None
            )
            await abort(
                context,
                exc.code,
                exc.reason,
                exc.message,
                retry_after=retry_after,
                metadata=exc.metadata or None,
            )
        _CALLER.set(caller)
        _REQUEST_ID.set(_header(metadata, NONCE_HEADER))
        return caller

    def _wrap_unary_request(self, handler: Any, method: str) -> Any:
        deserialize = handler.request_deserializer or _identity

        async def parse(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await self._admit(method, context.invocation_metadata(), raw, context)
            request = await _parse(deserialize, raw, context)
            request_id = getattr(request, "request_id", "")
            if isinstance(request_id, str) and request_id:
                _REQUEST_ID.set(request_id)
            return request

        if not handler.response_streaming:
            inner = handler.unary_unary

            async def unary_unary(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                return await _maybe_await(inner(await parse(raw, context), context))

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, response_serializer=handler.response_serializer
            )

        inner = handler.unary_stream
        if inspect.isasyncgenfunction(inner):

            async def unary_stream_gen(
                raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                async for response in inner(await parse(raw, context), context):
                    yield response

            behavior: Any = unary_stream_gen
        else:

            async def unary_stream_writes(
                raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
            ) -> Any:
                return await _maybe_await(inner(await parse(raw, context), context))

            behavior = unary_stream_writes
        return grpc.unary_stream_rpc_method_handler(
            behavior, response_serializer=handler.response_serializer
        )

    def _wrap_stream_request(self, handler: Any, method: str) -> Any:
        deserialize = handler.request_deserializer or _identity

        async def requests(
            raw_requests: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            iterator = aiter(raw_requests)
            try:
                first: bytes | None = await anext(iterator)
            except StopAsyncIteration:
                first = None
            await self._admit(method, context.invocation_metadata(), first or b"", context)

            async def parsed() -> AsyncIterator[Any]:
                if first is not None:
                    yield await _parse(deserialize, first, context)
                cap = self.config.max_message_bytes
                async for raw in iterator:
                    if cap is not None and len(raw) > cap:
                        await _refuse_size(context, len(raw), cap)
                    yield await _parse(deserialize, raw, context)

            return parsed()

        if not handler.response_streaming:
            inner = handler.stream_unary

            async def stream_unary(
                raw_requests: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> Any:
                return await _maybe_await(inner(await requests(raw_requests, context), context))

            return grpc.stream_unary_rpc_method_handler(
                stream_unary, response_serializer=handler.response_serializer
            )

        inner = handler.stream_stream
        if inspect.isasyncgenfunction(inner):

            async def stream_stream_gen(
                raw_requests: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                async for response in inner(await requests(raw_requests, context), context):
                    yield response

            behavior: Any = stream_stream_gen
        else:

            async def stream_stream_writes(
                raw_requests: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> Any:
                return await _maybe_await(inner(await requests(raw_requests, context), context))

            behavior = stream_stream_writes
        return grpc.stream_stream_rpc_method_handler(
            behavior, response_serializer=handler.response_serializer
        )


async def _refuse_size(context: grpc.aio.ServicerContext[Any, Any], size: int, cap: int) -> None:
    await abort(
        context,
        REASON_CODES[ErrorReason.MESSAGE_TOO_LARGE],
        ErrorReason.MESSAGE_TOO_LARGE,
        f"message of {size:,} bytes exceeds the cap of {cap:,} bytes",
        metadata={"max_message_bytes": str(cap), "message_bytes": str(size)},
    )


def _identity(raw: bytes) -> bytes:
    return raw


async def _maybe_await(result: Any) -> Any:
    if inspect.isawaitable(result):
        return await result
    return result


async def _parse(
    deserialize: Callable[[bytes], Any], raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
) -> Any:
    try:
        return deserialize(raw)
    except Exception:  # protobuf raises DecodeError; any parser failure means bad input
        await abort(
            context,
            grpc.StatusCode.INVALID_ARGUMENT,
            ErrorReason.INVALID_FIELDS,
            "request message does not parse",
        )


def _peer_address(peer: str | None) -> str | None:
    """The network address of a gRPC peer string, without its port (``None`` when unknown)."""
    return network_of(peer) if peer else None


def network_of(peer: str) -> str:
    """The network a caller's address counts as, for per-address limits: ``ipv4:<address>``, or
    ``ipv6:<network>/64`` (one subscriber is routed a /64 at least, so a limit per full IPv6
    address would allow 2**64 of them); an IPv4-mapped IPv6 address counts as its IPv4 address.

    ``peer``: a gRPC peer (``ipv4:203.0.113.7:51234``, ``ipv6:[2001:db8::1]:443``, its
    ``%5B``-encoded form), one without its port, or a bare address; anything else (a Unix
    socket) is returned as it is, less a gRPC peer's port.
    """
    # Remembered: a connection's calls share its peer string (a short one: an address and port).
    return _network_of(peer) if len(peer) <= 64 else _network_of.__wrapped__(peer)


@functools.lru_cache(maxsize=8192)
def _network_of(peer: str) -> str:
    host = peer[5:] if peer.startswith(("ipv4:", "ipv6:")) else peer
    host = host.replace("%5B", "[").replace("%5D", "]").replace("%5b", "[").replace("%5d", "]")
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:  # an IPv4 address and its port
        host = host.rsplit(":", 1)[0]
    host = host.split("%", 1)[0]  # a zone index (fe80::1%eth0) is no part of the address
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return peer.rsplit(":", 1)[0] if peer.startswith(("ipv4:", "ipv6:")) else peer
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if isinstance(address, ipaddress.IPv4Address):
        return f"ipv4:{address}"
    return f"ipv6:{ipaddress.IPv6Network((address, 64), strict=False)}"


def _header(metadata: Any, name: str) -> str:
    for key, value in metadata or ():
        if key == name:
            return str(value)
    return ""


def _signing_headers(metadata: Any) -> dict[str, str]:
    found: dict[str, str] = {}
    for key, value in metadata or ():
        if key not in SIGNING_HEADERS:
            continue
        if key in found:
            raise VerificationError(ErrorReason.SIGNATURE_MALFORMED, f"header {key} repeated")
        if not isinstance(value, str):
            raise VerificationError(ErrorReason.SIGNATURE_MALFORMED, f"header {key} is binary")
        found[key] = value
    missing = [name for name in SIGNING_HEADERS if not found.get(name)]
    if missing:
        raise VerificationError(
            ErrorReason.SIGNATURE_MISSING, f"missing or empty header(s): {', '.join(missing)}"
        )
    return found


_KEY_TEXT_LENGTH = len(b64url_encode(bytes(PUBLIC_KEY_SIZE)))


def _decode_key(text: str) -> bytes:
    """A key header's bytes: remembered for a key of the right length (a node signs every call
    with the same key), decoded afresh otherwise (so a caller cannot fill the cache with long
    strings)."""
    if len(text) == _KEY_TEXT_LENGTH:
        return _decode_known_key(text)
    return b64url_decode(text)


@functools.lru_cache(maxsize=8192)
def _decode_known_key(text: str) -> bytes:
    return b64url_decode(text)


def _decode_headers(headers: Mapping[str, str]) -> tuple[bytes, bytes, str]:
    """Validate every header's syntax; return (public key, signature, nonce)."""

    def malformed(name: str, expected: str) -> VerificationError:
        return VerificationError(ErrorReason.SIGNATURE_MALFORMED, f"header {name}: {expected}")

    try:
        key = _decode_key(headers[KEY_HEADER])
    except (ValueError, binascii.Error):
        raise malformed(KEY_HEADER, "expected unpadded base64url") from None
    if len(key) != PUBLIC_KEY_SIZE:
        raise malformed(KEY_HEADER, f"expected a {PUBLIC_KEY_SIZE}-byte Ed25519 public key")
    try:
        signature = b64url_decode(headers[SIGNATURE_HEADER])
    except (ValueError, binascii.Error):
        raise malformed(SIGNATURE_HEADER, "expected unpadded base64url") from None
    if len(signature) != SIGNATURE_SIZE:
        raise malformed(SIGNATURE_HEADER, f"expected a {SIGNATURE_SIZE}-byte Ed25519 signature")
    if not _TIMESTAMP_RE.fullmatch(headers[TIMESTAMP_HEADER]):
        raise malformed(TIMESTAMP_HEADER, "expected unix milliseconds in decimal")
    nonce = headers[NONCE_HEADER]
    if not _NONCE_RE.fullmatch(nonce):
        raise malformed(NONCE_HEADER, "expected 32 lowercase hex digits")
    if not _DIGEST_RE.fullmatch(headers[BODY_HASH_HEADER]):
        raise malformed(BODY_HASH_HEADER, "expected 64 lowercase hex digits")
    if not is_valid_audience(headers[AUDIENCE_HEADER]):
        raise malformed(AUDIENCE_HEADER, "expected printable ASCII without spaces")
    return key, signature, nonce


def _role_name(role: int) -> str:
    try:
        return str(common_pb2.Role.Name(role))  # type: ignore[arg-type]
    except ValueError:
        return str(role)
