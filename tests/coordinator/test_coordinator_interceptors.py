"""ResolvedInterceptors: the interceptor chain runs once per method while serving, on every call
otherwise, and never keeps an answer for a method nobody serves."""

from __future__ import annotations

from typing import Any

import grpc

from rollnet.reference.coordinator.interceptors import (
    ReadinessGate,
    ResolvedInterceptors,
    ServingState,
)


class _Details:
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata: tuple[tuple[str, str], ...] = ()


class _Counting(grpc.aio.ServerInterceptor):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        self.calls.append(details.method)
        return await continuation(details)


async def _unary(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return request


SERVED = "/rollnet.v1.NodeService/Heartbeat"
HANDLERS: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
    SERVED: grpc.unary_unary_rpc_method_handler(_unary)
}


async def _lookup(details: Any) -> Any:
    return HANDLERS.get(details.method)


async def test_the_chain_runs_once_per_method_while_serving_and_every_call_otherwise() -> None:
    readiness = ServingState()
    outer, inner = _Counting(), _Counting()
    gate = ReadinessGate(readiness, frozenset({"/grpc.health."}))
    chain = ResolvedInterceptors([outer, gate, inner], readiness)

    # Starting: every call goes through the chain, and the gate swaps in a refusing handler.
    starting = [await chain.intercept_service(_lookup, _Details(SERVED)) for _ in range(2)]
    assert len(outer.calls) == 2
    assert all(handler is not HANDLERS[SERVED] for handler in starting)

    # Serving: resolved once (every interceptor asked once), then handed back as is.
    readiness.serving = True
    asked = len(inner.calls)
    served = [await chain.intercept_service(_lookup, _Details(SERVED)) for _ in range(5)]
    assert served == [HANDLERS[SERVED]] * 5
    assert outer.calls.count(SERVED) == 3
    assert len(inner.calls) == asked + 1

    # A method nobody serves is looked up every time and never kept.
    for _ in range(3):
        assert await chain.intercept_service(_lookup, _Details("/no.Such/Method")) is None
    assert outer.calls.count("/no.Such/Method") == 3

    # Draining: the kept answer is not used; the gate refuses again, call after call.
    readiness.serving = False
    draining = await chain.intercept_service(_lookup, _Details(SERVED))
    assert draining is not HANDLERS[SERVED]
    assert outer.calls.count(SERVED) == 4
