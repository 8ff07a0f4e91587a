"""A plain HTTP cache (Debian's nginx) in front of a relay origin serves the tree as well:
blobs are immutable and content-addressed, so any cache works, and clients verify them all.
The configuration is the one docs/broadcast.md gives operators."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from broadcast_testing import model_dir, publish_to_origin

from rollnet.reference.relay import RelayConfig, RelayServer, start_relay
from rollnet.sdk.broadcast import RelayShards
from rollnet.sdk.checkpoints import CheckpointStore
from rollnet.sdk.identity import Identity
from rollnet.sdk.testing import NETWORK_ID, wait_until
from rollnet.v1 import checkpoint_pb2

NGINX = Path(os.environ.get("ROLLNET_NGINX", "/usr/sbin/nginx"))

# docs/broadcast.md, "A plain HTTP cache in front of an origin" (ports and paths filled in).
CONFIG = """
daemon off;
master_process off;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    proxy_cache_path {root}/cache levels=1:2 keys_zone=rollnet_blobs:10m
                     max_size=10g inactive=7d use_temp_path=off;
    server {{
        listen 127.0.0.1:{port};
        location /v1/blobs/ {{
            proxy_pass {origin};
            proxy_cache rollnet_blobs;
            proxy_cache_key $uri;
            proxy_cache_valid 200 7d;
            proxy_cache_lock on;
            proxy_cache_lock_timeout 10m;
            proxy_force_ranges on;
            proxy_buffering on;
            add_header X-Cache-Status $upstream_cache_status always;
        }}
    }}
}}
"""


def need_nginx() -> Path:
    """nginx, or a skip outside CI (in CI, ``make dev`` installed it: a failure)."""
    if NGINX.is_file():
        return NGINX
    if os.environ.get("CI"):
        pytest.fail(f"{NGINX} is missing: 'make dev' installs Debian's nginx-light")
    pytest.skip(f"{NGINX} is missing (make http-cache installs Debian's nginx-light)")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
async def origin(tmp_path: Path) -> AsyncIterator[RelayServer]:
    server = await start_relay(RelayConfig(data_dir=tmp_path / "origin"))
    yield server
    await server.close()


async def test_clients_through_nginx_verify_and_the_origin_serves_once(
    tmp_path: Path, origin: RelayServer
) -> None:
    nginx = need_nginx()
    trainer = Identity.generate()
    source = model_dir(tmp_path / "model", os.urandom(1024 * 1024))
    # The origin relay serves the directory the trainer writes (written after it started).
    checkpoint = await publish_to_origin(
        tmp_path / "origin", source, 1, trainer, shard_size=256 * 1024
    )
    root = tmp_path / "nginx"
    root.mkdir()
    port = _free_port()
    (root / "nginx.conf").write_text(CONFIG.format(root=root, port=port, origin=origin.url))
    process = subprocess.Popen(  # noqa: ASYNC220 - started once, not waited on here
        [str(nginx), "-p", str(root), "-c", str(root / "nginx.conf")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        await wait_until(lambda: _listening(port) or process.poll() is not None)
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        url = f"http://127.0.0.1:{port}"
        for index in range(3):
            store = CheckpointStore(tmp_path / f"client{index}", network_id=NETWORK_ID)
            async with RelayShards([url]) as shards:
                directory = await store.ensure(checkpoint, shards)
            assert (directory / "model.safetensors").read_bytes() == (
                source / "model.safetensors"
            ).read_bytes()
        manifest = checkpoint_pb2.CheckpointManifest.FromString(checkpoint.manifest)
        total = sum(f.content.size for f in manifest.files)
        served = origin.metrics.registry.get_sample_value("rollnet_relay_served_bytes_total")
        assert served == total  # three clients, one trip to the origin per blob

        # A resumed transfer: nginx answers a Range from its cache.
        blob = max((tmp_path / "origin" / "blobs").iterdir(), key=lambda p: p.stat().st_size)
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{url}/v1/blobs/{blob.name}", headers={"Range": "bytes=100-"}) as response,
        ):
            assert response.status == 206
            assert await response.read() == blob.read_bytes()[100:]
            assert response.headers["X-Cache-Status"] == "HIT"
    finally:
        process.terminate()
        await asyncio.to_thread(process.wait, 10)
        shutil.rmtree(root, ignore_errors=True)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0
