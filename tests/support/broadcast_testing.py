"""Helpers of the broadcast tests: origins with signed checkpoints, a gated upstream that holds
a blob half-sent until the test lets it go, and waiting on conditions."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import blake3
from aiohttp import web
from coordinator_testing import register

from rollnet.reference.checkpoint_publishing import (
    DeltaBase,
    build_manifest,
    signed_checkpoint,
    write_origin_blob,
)
from rollnet.sdk import RollnetClient
from rollnet.sdk.identity import Identity
from rollnet.sdk.testing import NETWORK_ID, connect
from rollnet.v1 import checkpoint_pb2, common_pb2


async def publish_to_origin(
    origin: Path,
    model_dir: Path,
    step: int,
    trainer: Identity,
    *,
    shard_size: int = 64 * 1024,
    delta_base: DeltaBase | None = None,
) -> checkpoint_pb2.Checkpoint:
    """Write ``model_dir``'s blobs to ``origin`` and return its signed checkpoint."""

    async def sink(data: bytes, digest: bytes) -> bool:
        write_origin_blob(origin, data, digest)
        return False

    manifest, _ = await build_manifest(
        model_dir, step, NETWORK_ID, sink, shard_size=shard_size, delta_base=delta_base
    )
    return signed_checkpoint(trainer, manifest)


def model_dir(path: Path, weights: bytes) -> Path:
    """A minimal checkpoint directory (config, tokenizer, weights of the given bytes)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"model_type": "qwen2"}')
    (path / "tokenizer.json").write_text('{"version": "1.0"}')
    # A safetensors file holding one U8 tensor: the bytes as they are.
    import json
    import struct

    header = json.dumps(
        {"w": {"dtype": "U8", "shape": [len(weights)], "data_offsets": [0, len(weights)]}}
    ).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + weights)
    return path


@dataclass
class GatedUpstream:
    """An origin serving blobs from memory; blobs in ``gated`` are sent up to half and then
    held until :attr:`gate` is set. Every request is recorded as ``(digest, Range header)``."""

    blobs: dict[str, bytes] = field(default_factory=dict)
    gated: set[str] = field(default_factory=set)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    finished: set[str] = field(default_factory=set)
    """Digests whose last byte was sent."""
    url: str = ""
    _runner: web.AppRunner | None = None

    def add(self, data: bytes, *, gated: bool = False) -> str:
        digest = blake3.blake3(data).hexdigest()
        self.blobs[digest] = data
        if gated:
            self.gated.add(digest)
        return digest

    async def start(self) -> GatedUpstream:
        app = web.Application()
        app.router.add_get("/v1/blobs/{digest}", self._serve)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return self

    async def close(self) -> None:
        self.gate.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        digest = request.match_info["digest"]
        header = request.headers.get("Range")
        self.requests.append((digest, header))
        data = self.blobs.get(digest)
        if data is None:
            return web.Response(status=404)
        start = int(header.removeprefix("bytes=").split("-")[0]) if header else 0
        response = web.StreamResponse(status=206 if header else 200)
        response.content_length = len(data) - start
        if header:
            response.headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        await response.prepare(request)
        half = len(data) // 2
        if digest in self.gated and start < half:
            await response.write(data[start:half])
            await self.gate.wait()
            start = half
        await response.write(data[start:])
        await response.write_eof()
        self.finished.add(digest)
        return response


async def registered_client(
    address: str, identity: Identity, role: int = common_pb2.ROLE_WORKER
) -> RollnetClient:
    """A non-retrying client for the coordinator at ``address``, ``identity`` registered in
    ``role``."""
    client = connect(address, identity)
    await register(client, identity, role)
    return client
