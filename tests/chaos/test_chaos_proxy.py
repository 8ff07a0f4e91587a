"""The chaos harness's TCP proxy forwards, delays, resets and partitions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from rollnet.reference.chaos.proxy import FaultProxy


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data)
        await writer.drain()
    writer.close()


@pytest.fixture
async def proxy() -> AsyncIterator[FaultProxy]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    fault_proxy = FaultProxy(f"127.0.0.1:{port}")
    await fault_proxy.start()
    yield fault_proxy
    await fault_proxy.close()
    server.close()
    await server.wait_closed()


async def _round_trip(address: str, payload: bytes) -> bytes:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(payload)
    await writer.drain()
    answer = await asyncio.wait_for(reader.readexactly(len(payload)), timeout=10)
    writer.close()
    return answer


async def test_forwards_both_ways(proxy: FaultProxy) -> None:
    assert await _round_trip(proxy.address, b"hello" * 1000) == b"hello" * 1000


async def test_delay_holds_each_chunk(proxy: FaultProxy) -> None:
    proxy.delay(0.2, duration=30)
    began = time.monotonic()
    assert await _round_trip(proxy.address, b"x") == b"x"
    assert time.monotonic() - began >= 0.4  # held each way


async def test_reset_aborts_open_connections(proxy: FaultProxy) -> None:
    host, port = proxy.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"ping")
    assert await reader.readexactly(4) == b"ping"
    assert proxy.reset() >= 1
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(reader.readexactly(1), timeout=10)
    writer.close()


async def test_a_partition_forwards_nothing_until_healed(proxy: FaultProxy) -> None:
    proxy.partition()
    pending = asyncio.create_task(_round_trip(proxy.address, b"lost"))
    done, _ = await asyncio.wait({pending}, timeout=0.5)
    assert not done, "nothing crosses a partition"
    proxy.heal()
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await pending  # the connection the partition held is reset
    assert await _round_trip(proxy.address, b"again") == b"again"


async def test_an_upstream_that_refuses_closes_the_client(proxy: FaultProxy) -> None:
    proxy.upstream = "127.0.0.1:1"
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await _round_trip(proxy.address, b"nobody")
