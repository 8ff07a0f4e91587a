"""Helpers for testing code built on the SDK against a real coordinator.

rollnet's own tests use these, and so can third parties writing a worker, validator or
trainer: connect a signed client that reports every refusal instead of retrying it, and wait on a
condition with a deadline instead of sleeping for a fixed time.

    from rollnet.sdk import Identity
    from rollnet.sdk.testing import NETWORK_ID, connect, wait_until

    client = connect("127.0.0.1:50051", Identity.generate())
    await wait_until(lambda: worker.completed > 0, within=30.0, what="a completed task")

Starting a reference coordinator in-process (and the seconds-scale configuration tests want) is
the reference servers' business: see ``rollnet.reference.testing``.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

from rollnet.sdk.client import ConnectionConfig, RollnetClient, TlsConfig
from rollnet.sdk.identity import Identity
from rollnet.sdk.retry import RetryPolicy

__all__ = ["NETWORK_ID", "connect", "free_port", "wait_until", "wait_until_blocking"]

#: The network id rollnet's tests run their coordinators and nodes on.
NETWORK_ID = "rollnet-test"

T = TypeVar("T")


def connect(
    address: str,
    identity: Identity,
    *,
    network_id: str = NETWORK_ID,
    tls: TlsConfig | None = None,
    retry: RetryPolicy | None = None,
    timeout: float = 15.0,
) -> RollnetClient:
    """A client signing as ``identity``; by default it does not retry, so a test sees every
    refusal the coordinator sends."""
    return RollnetClient.connect(
        ConnectionConfig(
            target=address,
            network_id=network_id,
            tls=tls,
            timeout=timeout,
            retry=retry or RetryPolicy.no_retry(),
        ),
        identity,
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a server that must come back on
    the same address; anything else should bind port 0)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@overload
async def wait_until(
    check: Callable[[], Awaitable[T | None]],
    *,
    within: float = ...,
    what: str = ...,
    poll: float = ...,
) -> T: ...


@overload
async def wait_until(
    check: Callable[[], T | None],
    *,
    within: float = ...,
    what: str = ...,
    poll: float = ...,
) -> T: ...


async def wait_until(
    check: Callable[[], Any],
    *,
    within: float = 20.0,
    what: str = "the condition",
    poll: float = 0.05,
) -> Any:
    """Call ``check`` (a function or a coroutine function) every ``poll`` seconds until it
    returns something truthy (not None, False, 0 or empty), and return that; fail naming ``what``
    after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        outcome = check()
        value = await outcome if inspect.isawaitable(outcome) else outcome
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        await asyncio.sleep(poll)


def wait_until_blocking(
    check: Callable[[], T | None],
    *,
    within: float = 20.0,
    what: str = "the condition",
    poll: float = 0.02,
) -> T:
    """:func:`wait_until` for code without an event loop (threads, child processes): blocks."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        time.sleep(poll)
