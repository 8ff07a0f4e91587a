"""Server interceptor: a database connection lost in the middle of a call is UNAVAILABLE.

PostgreSQL ends connections on its own terms — an operator's ``pg_terminate_backend``, a
failover, a restart, a pooler's timeout — and the call whose statement was running on one fails
with an ``OperationalError`` (the pool's pre-ping only catches connections that died while idle).
Its transaction died with the connection and the pool replaces it, so the same call made again
succeeds (mutations carry request ids: a retry lands once). Unhandled, gRPC answered such a call
UNKNOWN, which clients do not retry: the reference trainer stopped for good when its rollout
stream was cut that way (found by ``bench/chaos.py``, docs/reliability.md). This interceptor
answers UNAVAILABLE / NOT_SERVING with a RetryInfo instead, and logs the error.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from rollnet.reference.coordinator.interceptors import Behavior, _rewrap
from rollnet.sdk.errors import REASON_CODES, ErrorReason, abort

__all__ = ["DatabaseErrors", "is_connection_lost"]

log = structlog.get_logger("rollnet.coordinator")


def is_connection_lost(error: BaseException) -> bool:
    """Whether ``error`` is the database connection failing (not a statement being refused)."""
    if isinstance(error, OperationalError | InterfaceError):
        return True
    return isinstance(error, DBAPIError) and bool(error.connection_invalidated)


class DatabaseErrors(grpc.aio.ServerInterceptor):
    """Answer a call that lost its database connection UNAVAILABLE / NOT_SERVING, retryable."""

    def __init__(self, retry_after: float = 1.0) -> None:
        self.retry_after = retry_after

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        retry_after = self.retry_after

        async def refuse(context: grpc.aio.ServicerContext[Any, Any], error: BaseException) -> None:
            log.warning("database_connection_lost", method=method, error=str(error).split("\n")[0])
            await abort(
                context,
                REASON_CODES[ErrorReason.NOT_SERVING],
                ErrorReason.NOT_SERVING,
                "the coordinator lost its database connection; retry",
                retry_after=retry_after,
            )

        def wrap(inner: Behavior, _req_stream: bool, resp_stream: bool) -> Behavior:
            if resp_stream and inspect.isasyncgenfunction(inner):

                async def streaming(
                    request: Any, context: grpc.aio.ServicerContext[Any, Any]
                ) -> AsyncIterator[Any]:
                    try:
                        async for item in inner(request, context):
                            yield item
                    except DBAPIError as error:
                        if not is_connection_lost(error):
                            raise
                        await refuse(context, error)

                return streaming

            async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                try:
                    return await inner(request, context)
                except DBAPIError as error:
                    if not is_connection_lost(error):
                        raise
                    await refuse(context, error)

            return unary

        return _rewrap(handler, wrap)
