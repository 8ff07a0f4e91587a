"""What operators and load balancers see: health driven by readiness and draining, reflection,
Prometheus metrics, and TLS on the listening port."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from coordinator_testing import register, sqlite_only
from google.protobuf.duration_pb2 import Duration
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tls_testing import self_signed

from rollnet.ledger import create_engine, upgrade_to_head
from rollnet.reference.coordinator.config import ConfigError, CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.server import Coordinator, start_coordinator
from rollnet.sdk import ErrorReason, Identity, RollnetError, TlsConfig
from rollnet.sdk.testing import connect, wait_until
from rollnet.v1 import common_pb2, task_service_pb2

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# Reflection, metrics and TLS do not depend on the database: SQLite is enough for them
# (sqlite_only).


async def _health(address: str, service: str = "") -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        status: int = response.status
        return status


async def _is_serving(address: str) -> bool:
    return bool(await _health(address) == SERVING)


async def test_health_follows_readiness_and_draining(
    coordinator_config: CoordinatorConfig, db_url: str
) -> None:
    # A database that is not migrated yet: the port is open but the coordinator is not ready.
    coordinator = await start_coordinator(coordinator_config, migrate=False)
    worker = Identity.generate()
    client = connect(coordinator.address, worker)
    try:
        assert await _health(coordinator.address) == NOT_SERVING
        assert await _health(coordinator.address, "rollnet.v1.TaskService") == NOT_SERVING
        # Until then every other call is refused as retryable, never with an opaque error.
        with pytest.raises(RollnetError) as refused:
            await register(client, worker, common_pb2.ROLE_WORKER)
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
        assert refused.value.reason == ErrorReason.NOT_SERVING
        assert refused.value.retry_after is not None
        # Once the schema reaches head the coordinator says SERVING on its own.
        engine = create_engine(db_url)
        await asyncio.to_thread(upgrade_to_head, engine)
        engine.dispose()
        await wait_until(
            lambda: _is_serving(coordinator.address), within=10, what="the coordinator SERVING"
        )
        assert await _health(coordinator.address, "rollnet.v1.NodeService") == SERVING
        await register(client, worker, common_pb2.ROLE_WORKER)

        # Draining: a watcher sees NOT_SERVING before the server goes away.
        async with grpc.aio.insecure_channel(coordinator.address) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
            assert (await anext(aiter(watch))).status == SERVING
            stopping = asyncio.create_task(coordinator.stop(grace=0.5))
            assert (await anext(aiter(watch))).status == NOT_SERVING
            await stopping
    finally:
        await client.close()
        await coordinator.stop(grace=0.1)


@sqlite_only
async def test_reflection_lists_every_rollnet_service(coordinator: Coordinator) -> None:
    async with grpc.aio.insecure_channel(coordinator.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)

        async def ask(request: reflection_pb2.ServerReflectionRequest) -> object:
            call = stub.ServerReflectionInfo(iter([request]), timeout=5)
            return await anext(aiter(call))

        listed = await ask(reflection_pb2.ServerReflectionRequest(list_services=""))
        names = {s.name for s in listed.list_services_response.service}  # type: ignore[attr-defined]
        for service in (
            "NodeService",
            "TaskService",
            "BlobService",
            "CommitmentService",
            "ValidationService",
            "CheckpointService",
            "RolloutService",
            "LedgerService",
        ):
            assert f"rollnet.v1.{service}" in names
        assert "grpc.health.v1.Health" in names
        # What grpcurl does next: fetch the file that defines a service.
        described = await ask(
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="rollnet.v1.TaskService")
        )
        files = described.file_descriptor_response.file_descriptor_proto  # type: ignore[attr-defined]
        assert any(b"PullTask" in f for f in files)


@sqlite_only
async def test_metrics_endpoint_counts_rpcs(coordinator_config: CoordinatorConfig) -> None:
    coordinator = await start_coordinator(
        with_overrides(coordinator_config, metrics_listen="127.0.0.1:0")
    )
    url = f"http://127.0.0.1:{coordinator.metrics_port}/metrics"

    def scrape() -> str:
        with urllib.request.urlopen(url, timeout=5) as response:
            body: bytes = response.read()
        return body.decode()

    worker = Identity.generate()
    client = connect(coordinator.address, worker)
    try:
        await register(client, worker, common_pb2.ROLE_WORKER)
        # One pull that finds no work: one lease transaction, carrying it.
        await client.tasks.pull_task(task_service_pb2.PullTaskRequest(wait=Duration()))
        assert coordinator.metrics_port
        text = await asyncio.to_thread(scrape)
        samples = [line for line in text.splitlines() if line.startswith("rollnet_rpcs_total{")]
        assert any(
            "RegisterNode" in line and 'code="OK"' in line and line.endswith(" 1.0")
            for line in samples
        ), samples
        assert "rollnet_rpc_duration_seconds_bucket" in text
        # Load figures, read at scrape time: the registration's write went through the group
        # commit (at least one commit carrying at least one call), and the loop lag is measured.
        figures = {
            name: float(value)
            for name, _, value in (line.partition(" ") for line in text.splitlines())
            if name
            in (
                "rollnet_db_commits",
                "rollnet_db_write_calls",
                "rollnet_event_loop_lag_seconds",
                "rollnet_pull_batches",
                "rollnet_pulls_batched",
                "rollnet_blob_cache_bytes",
                "rollnet_blob_cache_limit_bytes",
            )
        }
        # The blob cache's fill and bound (what a soak's memory levels off at), read as stored.
        assert figures["rollnet_blob_cache_bytes"] == coordinator.ctx.blobs.cached_bytes
        assert figures["rollnet_blob_cache_limit_bytes"] == 64 << 20
        assert figures["rollnet_pull_batches"] == figures["rollnet_pulls_batched"] == 1
        assert figures["rollnet_db_commits"] >= 1
        assert figures["rollnet_db_write_calls"] >= figures["rollnet_db_commits"]
        assert 0 <= figures["rollnet_event_loop_lag_seconds"] < 60
        # The replay cache: the worker registered (then a fresh key) and pulled (registered).
        assert 'rollnet_replay_cache_keys{pool="registered"} 1.0' in text
        assert 'rollnet_replay_cache_keys{pool="registering"} 0.0' in text
        assert "rollnet_replay_cache_nonces 2.0" in text
    finally:
        await client.close()
        await coordinator.stop(grace=0.1)
    # Stopping the coordinator frees the metrics port too.
    with pytest.raises(urllib.error.URLError, match="refused"):
        await asyncio.to_thread(scrape)


@sqlite_only
async def test_tls_listener(coordinator_config: CoordinatorConfig, tmp_path: Path) -> None:
    key_pem, cert_pem = self_signed("coordinator.rollnet.test")
    (tmp_path / "tls.key").write_bytes(key_pem)
    (tmp_path / "tls.crt").write_bytes(cert_pem)
    coordinator = await start_coordinator(
        with_overrides(
            coordinator_config, tls_cert=tmp_path / "tls.crt", tls_key=tmp_path / "tls.key"
        )
    )
    worker = Identity.generate()
    secure = connect(
        coordinator.address,
        worker,
        tls=TlsConfig(
            root_certificates=tmp_path / "tls.crt",
            server_name_override="coordinator.rollnet.test",
        ),
    )
    plaintext = connect(coordinator.address, worker, timeout=3.0)
    try:
        registered = await register(secure, worker, common_pb2.ROLE_WORKER)
        assert registered.node.node_id == worker.node_id
        with pytest.raises(RollnetError) as refused:
            await register(plaintext, worker, common_pb2.ROLE_WORKER)
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        await secure.close()
        await plaintext.close()
        await coordinator.stop(grace=0.1)


@sqlite_only
async def test_a_port_in_use_is_refused_not_shared(
    coordinator_config: CoordinatorConfig, tmp_path: Path
) -> None:
    """gRPC's default SO_REUSEPORT would let a second coordinator share the first one's port
    and answer part of its calls; it must refuse to start instead, saying why."""
    first = await start_coordinator(coordinator_config)
    try:
        taken = with_overrides(
            coordinator_config,
            listen=f"127.0.0.1:{first.port}",
            data_dir=tmp_path / "second",
            database_url=f"sqlite:///{tmp_path / 'second.db'}",
        )
        in_use = f"listen 127.0.0.1:{first.port}: cannot listen there: the port is in use"
        with pytest.raises(ConfigError, match=in_use):
            await start_coordinator(taken)
        # Refused before the database or the data directory was touched.
        assert not (tmp_path / "second.db").exists()
        assert not (tmp_path / "second").exists()
    finally:
        await first.stop(grace=0.5)
