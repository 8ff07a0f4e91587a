"""A recording, fault-injecting gRPC proxy: the node under test talks to it as to a coordinator.

Every call is forwarded byte for byte, with the caller's metadata (the signature covers the
audience, method, time, nonce and body — not the address — so it stays valid), and recorded:
method, caller key, when, and the status it ended with. A :class:`Fault` answers a call in the
coordinator's place (a refusal with rich details, as a coordinator would send it) or changes a
response, so that a suite can drive a node through situations a healthy coordinator rarely
produces (a rate limit, a revoked lease) and watch what it does next.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from rollnet.sdk.conformance.suite import CaseFailure
from rollnet.sdk.errors import STATUS_DETAILS_KEY, ErrorReason, build_status, from_rpc_error
from rollnet.sdk.methods import _SERVICE_MODULES
from rollnet.sdk.signing import KEY_HEADER

# Methods the proxy forwards: every rollnet v1 RPC, with its streaming shape.
_KINDS: dict[str, tuple[bool, bool]] = {
    f"/{service.full_name}/{method.name}": (method.client_streaming, method.server_streaming)
    for module in _SERVICE_MODULES
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
}
_KINDS["/grpc.health.v1.Health/Check"] = (False, False)
_KINDS["/grpc.health.v1.Health/Watch"] = (False, True)


@dataclass(frozen=True, slots=True)
class Call:
    """One call that passed the proxy."""

    method: str
    key: str
    """The caller's ``x-rollnet-key`` header (empty when unsigned)."""
    started: float
    """``time.monotonic()`` when it arrived."""
    code: grpc.StatusCode
    reason: str = ""
    injected: bool = False
    """Answered by a :class:`Fault` rather than the coordinator."""
    body: bytes = b""
    """The request bytes (the first message of a stream)."""
    rewritten: bool = False
    """The coordinator's answer was changed by a :class:`Fault`."""

    @property
    def rpc(self) -> str:
        return self.method.rsplit("/", 1)[-1]


@dataclass(slots=True)
class Fault:
    """Answer the next ``count`` calls of ``method`` (from ``key``, when given) with a refusal
    instead of forwarding them; or, with ``rewrite``, forward and change the response bytes."""

    method: str
    code: grpc.StatusCode = grpc.StatusCode.OK
    reason: ErrorReason | None = None
    message: str = "injected by the conformance harness"
    retry_after: float | None = None
    key: str | None = None
    count: int = 1
    rewrite: Callable[[bytes, bytes], bytes] | None = None
    """``(request, response) -> response`` for a unary call that the coordinator answered."""
    applies: Callable[[bytes], bool] | None = None
    """Only calls whose request bytes satisfy it."""
    hits: int = 0


@dataclass
class Proxy:
    """Forwards to ``upstream``; listens on ``address`` once :meth:`start` returned."""

    upstream: str
    calls: list[Call] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    address: str = ""
    _server: Any = None
    _channel: Any = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self, listen: str = "127.0.0.1:0") -> None:
        options = [
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.max_receive_message_length", 64 << 20),
        ]
        self._channel = grpc.aio.insecure_channel(
            self.upstream, options=[*options, ("grpc.enable_retries", 0)]
        )
        self._server = grpc.aio.server(options=options)
        self._server.add_generic_rpc_handlers([_Handler(self)])
        port = self._server.add_insecure_port(listen)
        await self._server.start()
        self.address = f"{listen.rsplit(':', 1)[0]}:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0.5)
        if self._channel is not None:
            await self._channel.close()

    def record(self, call: Call) -> None:
        self.calls.append(call)
        self._changed.set()

    async def wait_for(
        self, predicate: Callable[[Call], bool], *, within: float, what: str, since: float = 0.0
    ) -> Call:
        """The first recorded call after ``since`` that satisfies ``predicate``, waiting up to
        ``within`` seconds for it; fails the case naming ``what`` when none came."""
        deadline = time.monotonic() + within
        while True:
            for call in self.calls:
                if call.started >= since and predicate(call):
                    return call
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CaseFailure(f"no {what} within {within:g} s")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 0.5))

    def fault_for(self, method: str, key: str, body: bytes) -> Fault | None:
        for fault in self.faults:
            if fault.method != method or fault.hits >= fault.count:
                continue
            if fault.key is not None and fault.key != key:
                continue
            if fault.applies is not None and not fault.applies(body):
                continue
            fault.hits += 1
            return fault
        return None


def _metadata(context: grpc.aio.ServicerContext[Any, Any]) -> list[tuple[str, Any]]:
    # Pseudo-headers and gRPC's own are set again by the outgoing call.
    return [
        (key, value)
        for key, value in context.invocation_metadata() or ()
        if not key.startswith((":", "grpc-")) and key not in ("user-agent", "te", "content-type")
    ]


def _key(metadata: list[tuple[str, Any]]) -> str:
    for name, value in metadata:
        if name == KEY_HEADER:
            return str(value)
    return ""


def _reason(error: grpc.aio.AioRpcError) -> str:
    return str(from_rpc_error(error).reason)


def _timeout(context: grpc.aio.ServicerContext[Any, Any]) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None else max(remaining, 0.001)


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    def service(self, details: Any) -> Any:
        method = details.method
        kind = _KINDS.get(method)
        if kind is None:
            return None
        client_streaming, server_streaming = kind
        if client_streaming and not server_streaming:
            return grpc.stream_unary_rpc_method_handler(self._stream_unary(method))
        if server_streaming and not client_streaming:
            return grpc.unary_stream_rpc_method_handler(self._unary_stream(method))
        if not client_streaming:
            return grpc.unary_unary_rpc_method_handler(self._unary_unary(method))
        return None

    async def _refuse(self, context: grpc.aio.ServicerContext[Any, Any], fault: Fault) -> None:
        status = build_status(
            fault.code,
            fault.reason or "",
            fault.message,
            retry_after=fault.retry_after,
        )
        await context.abort(
            fault.code,
            fault.message,
            trailing_metadata=((STATUS_DETAILS_KEY, status.SerializeToString()),),
        )

    async def _pass_error(
        self, context: grpc.aio.ServicerContext[Any, Any], error: grpc.aio.AioRpcError
    ) -> None:
        trailing = tuple(
            (key, value)
            for key, value in error.trailing_metadata() or ()
            if key == STATUS_DETAILS_KEY
        )
        await context.abort(error.code(), error.details() or "", trailing_metadata=trailing)

    def _unary_unary(self, method: str) -> Any:
        proxy = self.proxy

        async def behavior(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            metadata = _metadata(context)
            key, started = _key(metadata), time.monotonic()
            fault = proxy.fault_for(method, key, request)
            if fault is not None and fault.rewrite is None:
                proxy.record(
                    Call(method, key, started, fault.code, str(fault.reason or ""), True, request)
                )
                await self._refuse(context, fault)
            call = proxy._channel.unary_unary(method, None, None)
            try:
                response: bytes = await call(request, metadata=metadata, timeout=_timeout(context))
            except grpc.aio.AioRpcError as error:
                proxy.record(Call(method, key, started, error.code(), _reason(error), body=request))
                await self._pass_error(context, error)
                raise  # abort raised already; for the type checker
            rewritten = fault is not None and fault.rewrite is not None
            if fault is not None and fault.rewrite is not None:
                response = fault.rewrite(request, response)
            proxy.record(
                Call(method, key, started, grpc.StatusCode.OK, body=request, rewritten=rewritten)
            )
            return response

        return behavior

    def _unary_stream(self, method: str) -> Any:
        proxy = self.proxy

        async def behavior(
            request: bytes, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[bytes]:
            metadata = _metadata(context)
            key, started = _key(metadata), time.monotonic()
            fault = proxy.fault_for(method, key, request)
            if fault is not None:
                proxy.record(
                    Call(method, key, started, fault.code, str(fault.reason or ""), True, request)
                )
                await self._refuse(context, fault)
            call = proxy._channel.unary_stream(method, None, None)(
                request, metadata=metadata, timeout=_timeout(context)
            )
            try:
                async for response in call:
                    yield response
            except grpc.aio.AioRpcError as error:
                proxy.record(Call(method, key, started, error.code(), _reason(error), body=request))
                await self._pass_error(context, error)
            proxy.record(Call(method, key, started, grpc.StatusCode.OK, body=request))

        return behavior

    def _stream_unary(self, method: str) -> Any:
        proxy = self.proxy

        async def behavior(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            metadata = _metadata(context)
            key, started = _key(metadata), time.monotonic()
            first: list[bytes] = []

            async def forward() -> AsyncIterator[bytes]:
                async for message in requests:
                    if not first:
                        first.append(message)
                    yield message

            call = proxy._channel.stream_unary(method, None, None)
            try:
                response: bytes = await call(
                    forward(), metadata=metadata, timeout=_timeout(context)
                )
            except grpc.aio.AioRpcError as error:
                body = first[0] if first else b""
                proxy.record(Call(method, key, started, error.code(), _reason(error), body=body))
                await self._pass_error(context, error)
                raise
            proxy.record(
                Call(method, key, started, grpc.StatusCode.OK, body=first[0] if first else b"")
            )
            return response

        return behavior
