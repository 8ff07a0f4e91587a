"""``NodeSession`` against a real coordinator: registration, the granted heartbeat interval, the
drain and re-register commands, a coordinator that forgot the node, refusals for good, back-off
while the coordinator is unreachable, a clean stop, and the trainer role."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select

from rollnet.ledger.enums import NodeRole, NodeState
from rollnet.ledger.models import Node
from rollnet.reference import testing as reference_testing
from rollnet.reference.checkpoint_publishing import publish_model_dir
from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.reference.coordinator.registry import NodeRegistry
from rollnet.reference.coordinator.server import Coordinator, start_coordinator
from rollnet.sdk import (
    Backoff,
    ErrorReason,
    Identity,
    NodeConfig,
    NodeFatalError,
    NodeReport,
    NodeSession,
)
from rollnet.sdk.testing import NETWORK_ID, free_port, wait_until
from rollnet.v1 import common_pb2, node_pb2, node_service_pb2, rollout_service_pb2

FAST = Backoff(initial=0.1, maximum=0.4, jitter=0.0)


def coordinator_config(tmp_path: Path, database_url: str, **changes: Any) -> CoordinatorConfig:
    """Sub-second heartbeats, so commands arrive within a test."""
    settings: dict[str, Any] = {
        "heartbeat_interval": timedelta(seconds=0.3),
        "heartbeat_interval_min": timedelta(seconds=0.2),
        "heartbeat_interval_max": timedelta(seconds=2),
        "sweep_interval": timedelta(seconds=0.2),
        "suspect_after_missed": 10.0,
        "offline_after_missed": 20.0,
        **changes,
    }
    return reference_testing.coordinator_config(tmp_path / "coordinator", database_url, **settings)


def node_config(address: str, role: common_pb2.Role.ValueType, **changes: Any) -> NodeConfig:
    settings: dict[str, Any] = {
        "target": address,
        "role": role,
        "network_id": NETWORK_ID,
        "call_timeout": 5.0,
        "backoff": FAST,
        "deregister_timeout": 3.0,
    }
    settings.update(changes)
    return NodeConfig(**settings)


def stored_node(database_url: str, node_id: str) -> tuple[NodeRole, NodeState] | None:
    """The coordinator's record of a node: its role and state (None when unknown)."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(select(Node.role, Node.state).where(Node.id == node_id)).first()
    finally:
        engine.dispose()
    return None if row is None else (row[0], row[1])


async def operator_session(coordinator: Coordinator, operator: Identity) -> NodeSession:
    session = NodeSession(node_config(coordinator.address, common_pb2.ROLE_OPERATOR), operator)
    assert await session.start()
    return session


@pytest.mark.timeout(120)
async def test_registers_follows_the_granted_interval_and_stops_cleanly(
    tmp_path: Path, db_url: str
) -> None:
    coordinator = await start_coordinator(coordinator_config(tmp_path, db_url))
    identity = Identity.generate()
    # The node asks for 1 s; the coordinator's default (granted at registration) is 0.3 s.
    session = NodeSession(
        node_config(coordinator.address, common_pb2.ROLE_WORKER, requested_heartbeat_interval=1.0),
        identity,
        report=lambda: NodeReport(metrics={"probe": 1.0}),
    )
    try:
        assert await session.start()
        assert session.heartbeat_interval == pytest.approx(0.3)
        assert session.coordinator_public_key == coordinator.ctx.identity.public_key
        assert stored_node(db_url, identity.node_id) == (NodeRole.WORKER, NodeState.PENDING)
        # The first heartbeat makes the node ACTIVE, and its reply grants the interval asked for.
        await wait_until(lambda: session.heartbeats_ok >= 1, within=20, what="a heartbeat")
        assert stored_node(db_url, identity.node_id) == (NodeRole.WORKER, NodeState.ACTIVE)
        assert session.heartbeat_interval == pytest.approx(1.0)
        await wait_until(lambda: session.heartbeats_ok >= 3, within=20, what="more heartbeats")
        assert not session.stopping
        assert session.fatal is None
        session.request_stop()
        assert await session.deregister()
        assert stored_node(db_url, identity.node_id) == (NodeRole.WORKER, NodeState.DEREGISTERED)
        # No heartbeat after the deregistration (it would bring a "register again" command).
        assert not session.heartbeating
    finally:
        await session.close()
        await coordinator.stop(grace=0.5)
    with pytest.raises(RuntimeError, match="not started"):
        _ = session.client


@pytest.mark.timeout(120)
async def test_drain_command_stops_the_session(
    tmp_path: Path, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rollnet.validator")
    operator, validator = Identity.generate(), Identity.generate()
    config = coordinator_config(
        tmp_path,
        sqlite_url,
        operators=frozenset({operator.node_id}),
        validators=frozenset({validator.node_id}),
    )
    coordinator = await start_coordinator(config)
    admin = await operator_session(coordinator, operator)
    session = NodeSession(node_config(coordinator.address, common_pb2.ROLE_VALIDATOR), validator)
    try:
        assert await session.start()
        await admin.client.nodes.eject_node(
            node_service_pb2.EjectNodeRequest(node_id=validator.node_id, reason="drain test")
        )
        # The next heartbeat carries a DrainCommand: the session stops by itself.
        await wait_until(lambda: session.stopping, within=20, what="the drain command")
        assert any("drain_commanded" in r.getMessage() for r in caplog.records)
        assert session.fatal is None
        # An ejected node may not deregister: that refusal is for good.
        assert not await session.deregister()
        assert session.fatal is not None
        assert session.fatal.reason == ErrorReason.NODE_EJECTED
    finally:
        await session.close()
        await admin.close()
        await coordinator.stop(grace=0.5)


@pytest.mark.timeout(120)
async def test_registers_again_when_told_to(tmp_path: Path, sqlite_url: str) -> None:
    coordinator = await start_coordinator(coordinator_config(tmp_path, sqlite_url))
    identity = Identity.generate()
    session = NodeSession(node_config(coordinator.address, common_pb2.ROLE_WORKER), identity)
    try:
        assert await session.start()
        await wait_until(lambda: session.heartbeats_ok >= 1, within=20, what="a heartbeat")
        # The registration disappears behind the session's back (the same key deregisters).
        await session.client.nodes.deregister_node(
            node_service_pb2.DeregisterNodeRequest(reason="behind its back")
        )
        assert stored_node(sqlite_url, identity.node_id) == (
            NodeRole.WORKER,
            NodeState.DEREGISTERED,
        )
        # A heartbeat answers with a ReregisterCommand; the session registers again.
        await wait_until(
            lambda: (
                stored_node(sqlite_url, identity.node_id) == (NodeRole.WORKER, NodeState.ACTIVE)
            ),
            within=20,
            what="the node to register again and beat",
        )
        assert not session.stopping
    finally:
        await session.close()
        await coordinator.stop(grace=0.5)


@pytest.mark.timeout(180)
async def test_a_coordinator_that_forgot_the_node_gets_it_back(
    tmp_path: Path, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rollnet.trainer")
    trainer = Identity.generate()
    address = f"127.0.0.1:{free_port()}"
    # Heartbeats far apart: the forgetting is found by the session's call below, not a beat.
    first = coordinator_config(
        tmp_path / "first",
        sqlite_url,
        listen=address,
        trainers=frozenset({trainer.node_id}),
        heartbeat_interval=timedelta(seconds=60),
        heartbeat_interval_max=timedelta(seconds=120),
    )
    coordinator = await start_coordinator(first)
    session = NodeSession(node_config(address, common_pb2.ROLE_TRAINER), trainer)
    try:
        assert await session.start()
        await coordinator.stop(grace=0.5)
        # Another coordinator on the same address, with an empty database: it never heard of
        # the node, so its calls are refused UNKNOWN_KEY until the node registers again.
        fresh_url = f"sqlite+pysqlite:///{tmp_path / 'fresh.db'}"
        coordinator = await start_coordinator(
            replace(first, database_url=fresh_url, data_dir=tmp_path / "second")
        )
        assert stored_node(fresh_url, trainer.node_id) is None
        # A call through the session (retried while the address is down) registers the node
        # again when it is refused UNKNOWN_KEY, and is then answered.
        response = await session.call(
            "get_node",
            lambda: session.client.nodes.get_node(
                node_service_pb2.GetNodeRequest(node_id=trainer.node_id)
            ),
        )
        assert response.node.node_id == trainer.node_id
        assert any("coordinator_forgot_node" in r.getMessage() for r in caplog.records)
        assert session.coordinator_public_key == coordinator.ctx.identity.public_key
        assert stored_node(fresh_url, trainer.node_id) == (NodeRole.TRAINER, NodeState.PENDING)
        await session.heartbeat()
        assert stored_node(fresh_url, trainer.node_id) == (NodeRole.TRAINER, NodeState.ACTIVE)
    finally:
        await session.close()
        await coordinator.stop(grace=0.5)


@pytest.mark.timeout(120)
async def test_refusals_for_good_stop_the_session(tmp_path: Path, sqlite_url: str) -> None:
    operator, allowed = Identity.generate(), Identity.generate()
    config = coordinator_config(
        tmp_path,
        sqlite_url,
        operators=frozenset({operator.node_id}),
        validators=frozenset({allowed.node_id}),
    )
    coordinator = await start_coordinator(config)
    admin = await operator_session(coordinator, operator)
    try:
        # Off the allow-list: refused at registration, for good.
        stranger = NodeSession(
            node_config(coordinator.address, common_pb2.ROLE_VALIDATOR), Identity.generate()
        )
        assert not await stranger.start()
        assert stranger.stopping
        assert stranger.fatal is not None
        assert stranger.fatal.reason == ErrorReason.ROLE_NOT_PERMITTED
        await stranger.close()
        # Another network: the coordinator's answer names its own, which is not ours.
        elsewhere = NodeSession(
            node_config(coordinator.address, common_pb2.ROLE_WORKER, network_id="elsewhere"),
            Identity.generate(),
        )
        assert not await elsewhere.start()
        assert elsewhere.fatal is not None
        assert elsewhere.fatal.reason == ErrorReason.AUDIENCE_MISMATCH
        await elsewhere.close()
        # A call the node's role may never make: retrying it would only spin.
        worker = NodeSession(
            node_config(coordinator.address, common_pb2.ROLE_WORKER), Identity.generate()
        )
        assert await worker.start()
        with pytest.raises(NodeFatalError, match="ROLE_NOT_ALLOWED"):
            await worker.call(
                "list_nodes",
                lambda: worker.client.nodes.list_nodes(node_service_pb2.ListNodesRequest()),
            )
        assert worker.stopping
        assert worker.fatal is not None
        assert worker.fatal.reason == ErrorReason.ROLE_NOT_ALLOWED
        await worker.close()
        # Banned while running: the next heartbeat is refused NODE_BANNED and the session stops.
        session = NodeSession(node_config(coordinator.address, common_pb2.ROLE_VALIDATOR), allowed)
        assert await session.start()
        await admin.client.nodes.ban_node(
            node_service_pb2.BanNodeRequest(node_id=allowed.node_id, reason="ban test")
        )
        await wait_until(lambda: session.fatal is not None, within=20, what="the ban to land")
        assert session.stopping
        assert session.fatal is not None
        assert session.fatal.reason == ErrorReason.NODE_BANNED
        # A stopped, refused session does not try to deregister.
        assert not await session.deregister()
        await session.close()
    finally:
        await admin.close()
        await coordinator.stop(grace=0.5)


@pytest.mark.timeout(120)
async def test_every_role_learns_the_networks_dtype_and_stops_without_it(
    tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    validator, trainer = Identity.generate(), Identity.generate()
    config = coordinator_config(
        tmp_path,
        sqlite_url,
        compute_dtype="bfloat16",
        validators=frozenset({validator.node_id}),
        trainers=frozenset({trainer.node_id}),
    )
    coordinator = await start_coordinator(config)
    try:
        for role, identity in (
            (common_pb2.ROLE_WORKER, Identity.generate()),
            (common_pb2.ROLE_VALIDATOR, validator),
            (common_pb2.ROLE_TRAINER, trainer),
        ):
            # Listing the network's dtype, or none: admitted, and told which it is.
            for dtypes in (["float32", "bfloat16"], []):
                admitted = NodeSession(
                    node_config(
                        coordinator.address, role, capabilities=node_pb2.Capabilities(dtypes=dtypes)
                    ),
                    identity,
                )
                assert await admitted.start(), admitted.fatal
                assert admitted.compute_dtype == "bfloat16"
                assert await admitted.deregister()
                await admitted.close()
            # Listing only others: the coordinator refuses the registration, for good.
            refused = NodeSession(
                node_config(
                    coordinator.address,
                    role,
                    capabilities=node_pb2.Capabilities(dtypes=["float32"]),
                ),
                identity,
            )
            assert not await refused.start()
            assert refused.stopping
            assert refused.fatal is not None
            assert refused.fatal.reason == ErrorReason.COMPUTE_DTYPE_UNSUPPORTED
            await refused.close()

        # A coordinator from before the dtype check admits such a node and still announces its
        # dtype: the session refuses it itself, with the reason a coordinator gives.
        monkeypatch.setattr(NodeRegistry, "_check_dtypes", lambda self, caps: None)
        unchecked = NodeSession(
            node_config(
                coordinator.address,
                common_pb2.ROLE_VALIDATOR,
                capabilities=node_pb2.Capabilities(dtypes=["float32"]),
            ),
            validator,
        )
        assert not await unchecked.start()
        assert unchecked.stopping
        assert unchecked.fatal is not None
        assert unchecked.fatal.reason == ErrorReason.COMPUTE_DTYPE_UNSUPPORTED
        assert "bfloat16" in str(unchecked.fatal)
        assert not unchecked.heartbeating
        await unchecked.close()
    finally:
        await coordinator.stop(grace=0.5)


@pytest.mark.timeout(120)
async def test_backs_off_while_the_coordinator_is_unreachable(
    tmp_path: Path, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rollnet.worker")
    address = f"127.0.0.1:{free_port()}"
    session = NodeSession(node_config(address, common_pb2.ROLE_WORKER), Identity.generate())

    def delays() -> list[float]:
        return [
            float(r.delay)  # type: ignore[attr-defined]
            for r in caplog.records
            if r.getMessage().startswith("call_failed_retrying call=register")
        ]

    starting = asyncio.create_task(session.start())
    coordinator = None
    try:
        await wait_until(lambda: len(delays()) >= 5, within=30, what="five retries")
        assert not starting.done()
        # Without jitter the waits double from `initial` up to `maximum`, then stay there.
        assert delays()[:5] == [0.1, 0.2, 0.4, 0.4, 0.4]
        coordinator = await start_coordinator(
            coordinator_config(tmp_path, sqlite_url, listen=address)
        )
        assert await asyncio.wait_for(starting, 30)
        assert session.fatal is None
        # A stop ends a registration that is still being retried.
        unreachable = NodeSession(
            node_config(f"127.0.0.1:{free_port()}", common_pb2.ROLE_WORKER), Identity.generate()
        )
        trying = asyncio.create_task(unreachable.start())
        await wait_until(lambda: len(delays()) >= 7, within=30, what="retries of the second")
        unreachable.request_stop()
        assert await asyncio.wait_for(trying, 5) is False
        assert unreachable.fatal is None
        await unreachable.close()
    finally:
        if not starting.done():
            starting.cancel()
        await session.close()
        if coordinator is not None:
            await coordinator.stop(grace=0.5)


@pytest.mark.timeout(180)
async def test_a_trainer_lives_its_session(tmp_path: Path, db_url: str, tiny_model: Path) -> None:
    trainer = Identity.generate()
    config = coordinator_config(tmp_path, db_url, trainers=frozenset({trainer.node_id}))
    coordinator = await start_coordinator(config)
    try:
        async with NodeSession(
            node_config(coordinator.address, common_pb2.ROLE_TRAINER), trainer
        ) as session:
            assert stored_node(db_url, trainer.node_id) == (NodeRole.TRAINER, NodeState.PENDING)
            await session.call(
                "publish",
                lambda: publish_model_dir(
                    session.client, trainer, tiny_model, 1, NETWORK_ID, shard_size=1 << 20
                ),
            )
            response = await session.call(
                "request_rollouts",
                lambda: session.client.rollouts.request_rollouts(
                    rollout_service_pb2.RequestRolloutsRequest(
                        rollout_step=1,
                        environment="arithmetic",
                        prompt_count=2,
                        samples_per_prompt=2,
                        sampling=common_pb2.SamplingParams(temperature=1.0, max_new_tokens=4),
                        prompts_per_task=1,
                    )
                ),
            )
            assert len(response.task_ids) == 2
            await wait_until(lambda: session.heartbeats_ok >= 1, within=20, what="a heartbeat")
            assert stored_node(db_url, trainer.node_id) == (NodeRole.TRAINER, NodeState.ACTIVE)
        # Leaving the block deregistered it.
        assert stored_node(db_url, trainer.node_id) == (NodeRole.TRAINER, NodeState.DEREGISTERED)
        # A trainer key off the allow-list is refused for good on entry.
        with pytest.raises(NodeFatalError, match="ROLE_NOT_PERMITTED"):
            async with NodeSession(
                node_config(coordinator.address, common_pb2.ROLE_TRAINER), Identity.generate()
            ):
                raise AssertionError("entered without a registration")
    finally:
        await coordinator.stop(grace=0.5)
