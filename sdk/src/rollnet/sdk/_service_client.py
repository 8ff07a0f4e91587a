# gRPC deadlines are per call (and per attempt), so the RPC methods take `timeout` on purpose.
# ruff: noqa: ASYNC109
"""What every typed client shares: per-attempt deadlines, signed retries, error conversion.

Private: :mod:`rollnet.sdk.client` (hand-written methods) and :mod:`rollnet.sdk._client_generated`
(the generated unary ones) build on :class:`ServiceClient`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf import duration_pb2

from rollnet.sdk.errors import error_type, from_rpc_error
from rollnet.sdk.retry import RetryPolicy, is_retryable

Metadata = Sequence[tuple[str, str]]
"""Extra call metadata: (key, value) pairs, keys lowercase ASCII."""

M = TypeVar("M")

# A long poll (a request with a `wait`) may hold its call that long; the call gets this much time
# on top before it is called dead.
_LONG_POLL_MARGIN = 10.0
# The longest wait a request may carry (docs/protocol.md, "Bounds on every field"); a longer one
# is the server's to refuse, and must not overflow the deadline computed here first.
_MAX_WAIT = 86_400.0


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


def serialize_request(request: Any) -> bytes:
    data: bytes = request.SerializeToString(deterministic=True)
    return data


class ServiceClient:
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

    def _long_poll_timeout(self, wait: duration_pb2.Duration) -> float | None:
        """The default deadline of a long poll holding its call up to ``wait``."""
        if self._timeout is None:
            return None
        seconds = min(max(wait.seconds + wait.nanos / 1e9, 0.0), _MAX_WAIT)
        return max(self._timeout, seconds + _LONG_POLL_MARGIN)

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
        payload = serialize_request(_with_request_id(request))
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, M] = self._channel.unary_unary(
            method,
            request_serializer=None,
            response_deserializer=response_type.FromString,  # type: ignore[attr-defined]
        )
        deadline = timeout if timeout is not None else (default_timeout or self._timeout)

        async def attempt() -> M:
            response: M | None = await call(
                payload, timeout=deadline, metadata=call_metadata(metadata)
            )
            return parsed(response, method, response_type)

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
                serialize_request(make_request()), timeout=timeout, metadata=call_metadata(metadata)
            )
            try:
                async for response in call:
                    progressed = True
                    message = parsed(response, method, response_type)
                    on_message(message)
                    yield message
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


def call_metadata(metadata: Metadata | None) -> tuple[tuple[str, str], ...] | None:
    return tuple(metadata) if metadata else None


__all__ = ["Metadata", "ServiceClient", "call_metadata", "serialize_request"]


def parsed(response: M | None, method: str, response_type: type[M]) -> M:
    """``response``, unless it is ``None``: what grpc.aio hands back when the answer's bytes do
    not parse (it logs the error and goes on). A malformed answer is then an INTERNAL refusal
    the caller handles like any other, never an ``AttributeError`` on ``None``."""
    if response is None:
        code = grpc.StatusCode.INTERNAL
        name: str = response_type.DESCRIPTOR.full_name  # type: ignore[attr-defined]
        raise error_type(code)(code, f"{method}: the coordinator's answer is not a {name}")
    return response
