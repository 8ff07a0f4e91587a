"""A relay serving a corrupted shard is reported to the coordinator so the operator sees it:
the node's next heartbeat carries the report, the coordinator records who reported which relay
and shard and when (dashboard, metrics, log), and nodes cannot flood it."""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from broadcast_testing import model_dir, publish_to_origin, registered_client

from rollnet.reference.coordinator.dashboard_view import SwarmView
from rollnet.reference.coordinator.relay_reports import REPORTS_PER_MINUTE, RelayReports
from rollnet.reference.coordinator.server import Coordinator, start_coordinator
from rollnet.reference.relay import RelayConfig, RelayServer, start_relay
from rollnet.reference.testing import coordinator_config
from rollnet.sdk import (
    Backoff,
    ErrorReason,
    Identity,
    NodeConfig,
    NodeReport,
    NodeSession,
    RollnetError,
)
from rollnet.sdk.broadcast import RelayShards
from rollnet.sdk.checkpoints import CheckpointStore, verify_checkpoint
from rollnet.sdk.testing import NETWORK_ID
from rollnet.v1 import common_pb2, node_service_pb2

SHARD = 64 * 1024


@pytest.fixture
async def coordinator(tmp_path: Path, sqlite_url: str) -> AsyncIterator[Coordinator]:
    running = await start_coordinator(coordinator_config(tmp_path / "coordinator", sqlite_url))
    yield running
    await running.stop(grace=0.5)


@pytest.fixture
async def relays() -> AsyncIterator[list[RelayServer]]:
    started: list[RelayServer] = []
    yield started
    for relay in started:
        await relay.close()


async def started_relay(started: list[RelayServer], root: Path, *upstreams: str) -> RelayServer:
    server = await start_relay(RelayConfig(data_dir=root, upstreams=upstreams))
    started.append(server)
    return server


def reported(coordinator: Coordinator, relay: str) -> float:
    value = coordinator.ctx.metrics.registry.get_sample_value(
        "rollnet_relay_reports_total", {"relay": relay}
    )
    return 0.0 if value is None else value


def dropped(coordinator: Coordinator, reason: str) -> float:
    value = coordinator.ctx.metrics.registry.get_sample_value(
        "rollnet_relay_reports_dropped_total", {"reason": reason}
    )
    return 0.0 if value is None else value


async def test_a_corrupted_shard_reaches_the_operator_with_the_next_heartbeat(
    tmp_path: Path, coordinator: Coordinator, relays: list[RelayServer]
) -> None:
    trainer = Identity.generate()
    source = model_dir(tmp_path / "model", os.urandom(4 * SHARD))
    checkpoint = await publish_to_origin(tmp_path / "origin", source, 7, trainer, shard_size=SHARD)
    origin = await started_relay(relays, tmp_path / "origin")
    bad = await started_relay(relays, tmp_path / "bad", origin.url)
    good = await started_relay(relays, tmp_path / "good", origin.url)
    manifest = verify_checkpoint(checkpoint, network_id=NETWORK_ID)
    victim = next(f for f in manifest.files if f.path == "model.safetensors").shards[2]
    (tmp_path / "bad" / "blobs").mkdir(parents=True, exist_ok=True)
    (tmp_path / "bad" / "blobs" / victim.blake3.hex()).write_bytes(bytes(victim.size))

    shards = RelayShards([bad.url, good.url], rng=random.Random(0))
    shards.health[good.url].failures = 1e6  # the bad relay is asked first
    store = CheckpointStore(tmp_path / "client", network_id=NETWORK_ID, relays=shards)
    worker = Identity.generate()
    session = NodeSession(
        NodeConfig(
            target=coordinator.address,
            role=common_pb2.ROLE_WORKER,
            network_id=NETWORK_ID,
            call_timeout=5.0,
            backoff=Backoff(initial=0.1, maximum=0.4, jitter=0.0),
        ),
        worker,
        report=lambda: NodeReport(relay_reports=store.take_relay_reports(8)),
    )
    before = datetime.now(UTC)
    try:
        assert await session.start()
        await store.ensure(checkpoint, shards)
        await session.heartbeat()
        assert store.take_relay_reports(8) == []  # taken once, by that heartbeat
        await session.heartbeat()
    finally:
        await session.deregister()
        await session.close()
        await shards.aclose()

    assert reported(coordinator, bad.url) == 1
    assert reported(coordinator, good.url) == 0
    (record,) = coordinator.ctx.relay_reports.relays.values()
    assert (record.url, record.reports, record.reporters) == (bad.url, 1, {worker.node_id})
    (single,) = coordinator.ctx.relay_reports.recent
    assert (single.node_id, single.relay_url, single.shard_blake3, single.checkpoint_step) == (
        worker.node_id,
        bad.url,
        victim.blake3,
        7,
    )
    assert single.detected_at is not None
    assert before <= single.detected_at <= single.received_at

    shown = (await SwarmView(coordinator.ctx).snapshot())["relay_reports"]
    assert shown["relays_reported"] == 1
    assert shown["relays"][0] | {"first_at": None, "last_at": None} == {
        "url": bad.url,
        "reports": 1,
        "reporters": 1,
        "first_at": None,
        "last_at": None,
        "last_reporter": worker.node_id,
        "last_shard": victim.blake3.hex(),
        "last_step": 7,
    }
    assert shown["recent"][0]["node_id"] == worker.node_id


def report(url: str, index: int) -> node_service_pb2.RelayReport:
    return node_service_pb2.RelayReport(
        relay_url=url, shard_blake3=index.to_bytes(32, "big"), checkpoint_step=3
    )


async def test_reports_are_bounded_deduplicated_and_rate_limited(
    coordinator: Coordinator,
) -> None:
    relay = "http://relay.example:7090"
    one, two = Identity.generate(), Identity.generate()
    first, second = (
        await registered_client(coordinator.address, one),
        await registered_client(coordinator.address, two),
    )
    try:
        # More than 8 in one heartbeat, or something that is not an http(s) URL: refused,
        # naming the field.
        with pytest.raises(RollnetError) as refused:
            await first.nodes.heartbeat(
                node_service_pb2.HeartbeatRequest(
                    relay_reports=[report(relay, i) for i in range(9)]
                )
            )
        assert refused.value.reason == ErrorReason.INVALID_FIELDS
        assert [v.field for v in refused.value.field_violations] == ["relay_reports"]
        for wrong in ("file:///etc/passwd", "http://a b", "x" * 600):
            with pytest.raises(RollnetError) as refused:
                await first.nodes.heartbeat(
                    node_service_pb2.HeartbeatRequest(relay_reports=[report(wrong, 0)])
                )
            assert [v.field for v in refused.value.field_violations] == [
                "relay_reports[0].relay_url"
            ]
        with pytest.raises(RollnetError) as refused:
            await first.nodes.heartbeat(
                node_service_pb2.HeartbeatRequest(
                    relay_reports=[node_service_pb2.RelayReport(relay_url=relay)]
                )
            )
        assert [v.field for v in refused.value.field_violations] == [
            "relay_reports[0].shard_blake3"
        ]

        # One node: its first 8 distinct reports are recorded, the same one again is not
        # counted twice, and past 8 a minute the rest are dropped.
        await first.nodes.heartbeat(
            node_service_pb2.HeartbeatRequest(relay_reports=[report(relay, i) for i in range(8)])
        )
        await first.nodes.heartbeat(
            node_service_pb2.HeartbeatRequest(relay_reports=[report(relay, 0)])
        )
        await first.nodes.heartbeat(
            node_service_pb2.HeartbeatRequest(
                relay_reports=[report(relay, i) for i in range(100, 108)]
            )
        )
        assert reported(coordinator, relay) == REPORTS_PER_MINUTE == 8
        assert dropped(coordinator, "repeated") == 1
        assert dropped(coordinator, "rate_limited") == 8
        # Another node reporting the same relay counts as a second reporter.
        await second.nodes.heartbeat(
            node_service_pb2.HeartbeatRequest(relay_reports=[report(relay, 0)])
        )
        record = coordinator.ctx.relay_reports.relays[relay]
        assert (record.reports, record.reporters) == (9, {one.node_id, two.node_id})
    finally:
        await first.close()
        await second.close()


def test_the_bucket_refills_and_the_relays_tracked_are_capped() -> None:
    from prometheus_client import CollectorRegistry

    from rollnet.reference.coordinator import relay_reports

    registry = CollectorRegistry()
    record = RelayReports(registry)
    now = datetime.now(UTC)
    node = "a" * 32
    batch = [report("http://r", i) for i in range(10)]
    assert record.record(node, batch, now, monotonic=0.0) == 8
    assert record.record(node, batch[8:], now, monotonic=7.0) == 0  # under one token back
    assert record.record(node, batch[8:], now, monotonic=15.1) == 2  # two tokens in 15 s
    cap = relay_reports.TRACKED_RELAYS
    for index in range(cap + 5):
        record.record(f"{index:032x}", [report(f"http://relay{index}", 0)], now, monotonic=0.0)
    assert len(record.relays) == cap
    assert registry.get_sample_value("rollnet_relay_reports_total", {"relay": "(other)"}) == 6
