"""Server interceptors of the coordinator, one concern each.

``RpcObserver`` (outermost) times every call and emits one structured log line and one metrics
sample per RPC. ``CallerLimiter`` runs inside the signature verifier: it records the verified node
and request id for that log line and enforces the per-key token bucket. ``FieldBoundsCheck``, inside
it, refuses a request any field of which is out of bounds before a handler sees it.
``ResolvedInterceptors`` runs the chain once per method rather than once per call.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import structlog

from rollnet.reference.coordinator.bounds import RequestBounds
from rollnet.reference.coordinator.metrics import CoordinatorMetrics
from rollnet.sdk.errors import REASON_CODES, ErrorReason, FieldViolation, abort
from rollnet.sdk.verifier import WrapperCache, current_caller, current_request_id

log = structlog.get_logger("rollnet.coordinator.rpc")
# The stdlib logger behind it (servers route structlog through stdlib logging): its level says
# whether the per-RPC line is wanted before any work is spent on building it.
_level_gate = logging.getLogger("rollnet.coordinator.rpc")

_CALL_FIELDS: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("rollnet_call")

Behavior = Callable[[Any, Any], Any]


def _rewrap(handler: Any, wrap: Callable[[Behavior, bool, bool], Behavior]) -> Any:
    """A copy of ``handler`` whose behaviour is ``wrap(behaviour, request_streaming,
    response_streaming)``; serializers are kept."""
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            wrap(handler.unary_unary, False, False),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            wrap(handler.unary_stream, False, True),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            wrap(handler.stream_unary, True, False),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return handler


def _code_of(context: grpc.aio.ServicerContext[Any, Any], error: BaseException | None) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    return "OK" if error is None else "UNKNOWN"


class RpcObserver(grpc.aio.ServerInterceptor):
    """One log line (method, peer, node, request id, code, duration) and metrics per RPC."""

    def __init__(self, metrics: CoordinatorMetrics) -> None:
        self.metrics = metrics
        self._wrappers = WrapperCache(self._wrap)
        # Metric children by label values (looking them up costs a lock and a hash per call).
        self._counters: dict[tuple[str, str], Any] = {}
        self._timers: dict[str, Any] = {}

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        return self._wrappers.get(handler, details.method)

    def _wrap(self, handler: Any, method: str) -> Any:

        def wrap(inner: Behavior, _req_stream: bool, resp_stream: bool) -> Behavior:
            if resp_stream and inspect.isasyncgenfunction(inner):

                async def streaming(
                    request: Any, context: grpc.aio.ServicerContext[Any, Any]
                ) -> AsyncIterator[Any]:
                    fields: dict[str, str] = {}
                    token = _CALL_FIELDS.set(fields)
                    started = time.perf_counter()
                    error: BaseException | None = None
                    try:
                        async for item in inner(request, context):
                            yield item
                    except BaseException as exc:
                        error = exc
                        raise
                    finally:
                        _CALL_FIELDS.reset(token)
                        self._emit(method, context, fields, started, error)

                return streaming

            async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                fields: dict[str, str] = {}
                token = _CALL_FIELDS.set(fields)
                started = time.perf_counter()
                error: BaseException | None = None
                try:
                    return await inner(request, context)
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    _CALL_FIELDS.reset(token)
                    self._emit(method, context, fields, started, error)

            return unary

        return _rewrap(handler, wrap)

    def _emit(
        self,
        method: str,
        context: grpc.aio.ServicerContext[Any, Any],
        fields: dict[str, str],
        started: float,
        error: BaseException | None,
    ) -> None:
        elapsed = time.perf_counter() - started
        code = _code_of(context, error)
        counter = self._counters.get((method, code))
        if counter is None:
            counter = self._counters[method, code] = self.metrics.rpcs.labels(method, code)
        counter.inc()
        timer = self._timers.get(method)
        if timer is None:
            timer = self._timers[method] = self.metrics.rpc_seconds.labels(method)
        timer.observe(elapsed)
        if not _level_gate.isEnabledFor(logging.INFO):
            return  # below the configured level: build no record at all
        log.info(
            "rpc",
            method=method,
            peer=context.peer(),
            node=fields.get("node", ""),
            request_id=fields.get("request_id", ""),
            code=code,
            duration_ms=round(elapsed * 1000, 3),
        )


@dataclass
class ServingState:
    """Whether the coordinator serves (database ready, not draining); health follows it too."""

    serving: bool = False


class ResolvedInterceptors(grpc.aio.ServerInterceptor):
    """The coordinator's interceptors as one, each method's chain resolved once while serving.

    grpc.aio asks every interceptor for the method's handler on every call: a coroutine per
    interceptor, plus gRPC's own look-up at the end. Ours return the same handler for a method
    on every call (they wrap through :class:`~rollnet.sdk.verifier.WrapperCache` and read each
    call's details from its context), except the readiness gate, which refuses while the
    coordinator is not serving. So while serving, the chain's answer is kept per method and
    handed back directly; while starting or draining every call runs the chain (the gate
    refuses it). Unknown methods are not kept: their names are the caller's to choose.
    """

    def __init__(
        self, interceptors: Sequence[grpc.aio.ServerInterceptor], readiness: ServingState
    ) -> None:
        self._interceptors = tuple(interceptors)
        self._readiness = readiness
        self._resolved: dict[str, Any] = {}

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        serving = self._readiness.serving
        if serving:
            handler = self._resolved.get(details.method)
            if handler is not None:
                return handler
        handler = await self._through(0, continuation, details)
        if serving and handler is not None and self._readiness.serving:
            self._resolved[details.method] = handler
        return handler

    async def _through(self, index: int, continuation: Any, details: Any) -> Any:
        if index == len(self._interceptors):
            return await continuation(details)

        def onward(inner_details: Any) -> Awaitable[Any]:
            return self._through(index + 1, continuation, inner_details)

        return await self._interceptors[index].intercept_service(onward, details)


class ReadinessGate(grpc.aio.ServerInterceptor):
    """Outside the verifier: while the coordinator is starting (database not migrated or not
    reachable) or draining, refuse every call but health and reflection with UNAVAILABLE /
    NOT_SERVING and a RetryInfo, rather than failing later inside with an opaque error."""

    def __init__(
        self, readiness: ServingState, exempt_prefixes: frozenset[str], retry_after: float = 1.0
    ) -> None:
        self.readiness = readiness
        self.exempt_prefixes = exempt_prefixes
        self.retry_after = retry_after

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if (
            handler is None
            or self.readiness.serving
            or any(details.method.startswith(p) for p in self.exempt_prefixes)
        ):
            return handler
        retry_after = self.retry_after

        def wrap(inner: Behavior, _req_stream: bool, resp_stream: bool) -> Behavior:
            if resp_stream and inspect.isasyncgenfunction(inner):

                async def streaming(
                    request: Any, context: grpc.aio.ServicerContext[Any, Any]
                ) -> AsyncIterator[Any]:
                    await _refuse_not_serving(context, retry_after)
                    yield  # pragma: no cover - abort raised

                return streaming

            async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                await _refuse_not_serving(context, retry_after)

            return unary

        return _rewrap(handler, wrap)


async def _refuse_not_serving(
    context: grpc.aio.ServicerContext[Any, Any], retry_after: float
) -> None:
    await abort(
        context,
        REASON_CODES[ErrorReason.NOT_SERVING],
        ErrorReason.NOT_SERVING,
        "the coordinator is not serving (starting up or draining); retry later",
        retry_after=retry_after,
    )


@dataclass
class _Bucket:
    tokens: float
    updated: float


@dataclass
class TokenBuckets:
    """Per-key token buckets: ``rate`` tokens a second, at most ``burst`` saved up."""

    rate: float
    burst: int
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[bytes, _Bucket] = field(default_factory=dict)

    def take(self, key: bytes) -> float | None:
        """Spend one token of ``key``: None when allowed, else seconds until one is available."""
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) > 100_000:
                self._forget_full(now)
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.updated) * self.rate)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return (1.0 - bucket.tokens) / self.rate

    def _forget_full(self, now: float) -> None:
        # Buckets that would be full again carry no information.
        for key in [
            k
            for k, b in self._buckets.items()
            if b.tokens + (now - b.updated) * self.rate >= self.burst
        ]:
            del self._buckets[key]


class CallerLimiter(grpc.aio.ServerInterceptor):
    """Inside the verifier: annotate the call's log line and enforce the per-key rate limit."""

    def __init__(self, buckets: TokenBuckets, exempt_prefixes: frozenset[str]) -> None:
        self.buckets = buckets
        self.exempt_prefixes = exempt_prefixes
        self._wrappers = WrapperCache(self._wrap)

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or any(details.method.startswith(p) for p in self.exempt_prefixes):
            return handler
        return self._wrappers.get(handler, details.method)

    def _wrap(self, handler: Any, _method: str) -> Any:

        def admit(_request: Any, _context: grpc.aio.ServicerContext[Any, Any]) -> float | None:
            caller = current_caller()
            fields = _CALL_FIELDS.get(None)
            if fields is not None:
                fields["node"] = caller.node_id
                fields["request_id"] = current_request_id()
            return self.buckets.take(caller.public_key)

        return _rewrap(handler, _guarded(admit, _refuse_rate))


Problem = TypeVar("Problem")


def _guarded(
    check: Callable[[Any, Any], Problem | None],
    refuse: Callable[[Any, Problem], Awaitable[None]],
) -> Callable[[Behavior, bool, bool], Behavior]:
    """A ``wrap`` for :func:`_rewrap` that runs ``check(request, context)`` before the
    behaviour and, when it finds a problem, ``refuse(context, problem)`` (which aborts) instead.
    A client stream's ``request`` is its iterator."""

    def wrap(inner: Behavior, _req_stream: bool, resp_stream: bool) -> Behavior:
        if resp_stream and inspect.isasyncgenfunction(inner):

            async def streaming(
                request: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                problem = check(request, context)
                if problem is not None:
                    await refuse(context, problem)
                async for item in inner(request, context):
                    yield item

            return streaming

        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            problem = check(request, context)
            if problem is not None:
                await refuse(context, problem)
            return await inner(request, context)

        return unary

    return wrap


async def _refuse_rate(context: grpc.aio.ServicerContext[Any, Any], wait: float) -> None:
    await abort(
        context,
        REASON_CODES[ErrorReason.RATE_LIMITED],
        ErrorReason.RATE_LIMITED,
        f"per-key rate limit exceeded; retry in {wait:.3f} s",
        retry_after=wait,
    )


class FieldBoundsCheck(grpc.aio.ServerInterceptor):
    """Innermost: refuse a request with a field out of bounds (:mod:`.bounds`) with
    INVALID_ARGUMENT / INVALID_FIELDS and a ``FieldViolation`` per field, before any handler
    (or SQL) sees it. Every message of a client stream is checked as it is read."""

    def __init__(self, bounds: RequestBounds) -> None:
        self.bounds = bounds
        self._wrappers = WrapperCache(self._wrap)

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or self.bounds.checker(details.method) is None:
            return handler
        return self._wrappers.get(handler, details.method)

    def _wrap(self, handler: Any, method: str) -> Any:
        violations = self.bounds.checker(method)
        assert violations is not None

        def check(
            request: Any, _context: grpc.aio.ServicerContext[Any, Any]
        ) -> list[FieldViolation] | None:
            return violations(request) or None

        single = _guarded(check, _refuse_fields)

        def wrap(inner: Behavior, req_stream: bool, resp_stream: bool) -> Behavior:
            if not req_stream:
                return single(inner, req_stream, resp_stream)

            async def each(
                requests: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                async for request in requests:
                    found = violations(request)
                    if found:
                        await _refuse_fields(context, found)
                    yield request

            async def stream_request(
                requests: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> Any:
                return await inner(each(requests, context), context)

            return stream_request

        return _rewrap(handler, wrap)


async def _refuse_fields(
    context: grpc.aio.ServicerContext[Any, Any], violations: Sequence[FieldViolation]
) -> None:
    summary = "; ".join(f"{v.field}: {v.description}" for v in violations[:4])
    more = len(violations) - 4
    await abort(
        context,
        REASON_CODES[ErrorReason.INVALID_FIELDS],
        ErrorReason.INVALID_FIELDS,
        f"{summary}{f'; and {more} more' if more > 0 else ''}",
        field_violations=violations,
    )
