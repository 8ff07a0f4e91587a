"""A TCP proxy between the swarm's nodes and a coordinator that injects network faults.

Every node reaches its coordinator through a :class:`FaultProxy` (asyncio, in the chaos
harness's process), which forwards bytes both ways and, on demand:

- **delay**: holds every chunk ``delay`` seconds before forwarding it, for a while;
- **reset**: aborts every open connection at once (an RST, not a FIN: ``SO_LINGER`` 0), as a
  crashed middlebox or a NAT that forgot its mapping does;
- **partition**: forwards nothing, either way, for a while: open connections hang, new ones are
  accepted and hang too (a black hole, the worst case for a client's deadlines), and when the
  partition heals they are all reset, as the peers' TCP stacks would eventually have done.

The proxy stays up while the coordinator behind it restarts: a connection whose upstream
refuses is closed, and the client reconnects through the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time

__all__ = ["FaultProxy"]

_CHUNK = 64 * 1024


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with an RST: no FIN handshake, unsent bytes dropped."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """Forward ``listen`` (port 0: any) to ``upstream`` (``host:port``), with faults on demand."""

    def __init__(self, upstream: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.upstream = upstream
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._delay = 0.0
        self._delay_until = 0.0
        self._partitioned = asyncio.Event()
        self._healed = asyncio.Event()
        self._healed.set()
        self.connections = 0

    @property
    def address(self) -> str:
        """``host:port`` the proxy listens on."""
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        port = self._server.sockets[0].getsockname()[1]
        return f"{self._host}:{port}"

    async def start(self) -> None:
        """Listen."""
        self._server = await asyncio.start_server(self._serve, self._host, self._port)

    async def close(self) -> None:
        """Stop listening and abort every connection."""
        if self._server is not None:
            self._server.close()
        self.reset()
        self._healed.set()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    def delay(self, seconds: float, duration: float) -> None:
        """Hold every chunk ``seconds`` before forwarding it, for the next ``duration`` s."""
        self._delay = seconds
        self._delay_until = time.monotonic() + duration

    def reset(self) -> int:
        """Abort every open connection; returns how many."""
        writers = list(self._writers)
        for writer in writers:
            _abort(writer)
        self._writers.clear()
        return len(writers)

    def partition(self) -> None:
        """Forward nothing until :meth:`heal`."""
        self._healed.clear()

    def heal(self) -> None:
        """End a partition: the connections it held are reset, new ones forwarded again."""
        self.reset()
        self._healed.set()

    @property
    def partitioned(self) -> bool:
        """Whether a partition is in force."""
        return not self._healed.is_set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.connections += 1
        upstream_writer: asyncio.StreamWriter | None = None
        try:
            await self._healed.wait()
            host, port = self.upstream.rsplit(":", 1)
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
            except OSError:
                _abort(writer)
                return
            self._writers.add(upstream_writer)
            await asyncio.gather(
                self._pump(reader, upstream_writer), self._pump(upstream_reader, writer)
            )
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for end in (writer, upstream_writer):
                if end is not None:
                    self._writers.discard(end)
                    end.transport.abort()
            self._tasks.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                chunk = await reader.read(_CHUNK)
                if not chunk:
                    break
                if not self._healed.is_set():
                    await self._healed.wait()
                    break  # the partition's connections are reset when it heals
                if time.monotonic() < self._delay_until:
                    await asyncio.sleep(self._delay)
                writer.write(chunk)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()
