"""Heartbeat commands reach the runtime: an ejected worker drains and stops; a worker whose
registration was removed behind its back registers again and keeps working."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from worker_testing import (
    EchoGenerator,
    coordinator_config_for,
    request_tasks,
    start_trainer,
    worker_config,
)

from rollnet.reference.coordinator.server import start_coordinator
from rollnet.sdk.errors import RollnetError
from rollnet.sdk.identity import Identity
from rollnet.sdk.node import PROTOCOL_VERSION
from rollnet.sdk.testing import connect, wait_until
from rollnet.sdk.worker import Worker, WorkerFatalError
from rollnet.v1 import common_pb2, node_pb2, node_service_pb2

State = node_pb2.Node.State


async def _state(client: object, node_id: str) -> int:
    reply = await client.nodes.get_node(  # type: ignore[attr-defined]
        node_service_pb2.GetNodeRequest(node_id=node_id)
    )
    return int(reply.node.state)


@pytest.mark.timeout(180)
async def test_ejected_worker_is_told_to_drain_and_stops(
    tmp_path: Path,
    sqlite_url: str,
    trainer_identity: Identity,
    tiny_model: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rollnet.worker")
    operator_identity = Identity.generate()
    config = coordinator_config_for(
        tmp_path, sqlite_url, trainer_identity, operators=frozenset({operator_identity.node_id})
    )
    coordinator = await start_coordinator(config)
    trainer = await start_trainer(coordinator.address, trainer_identity, tiny_model)
    operator = connect(coordinator.address, operator_identity)
    identity = Identity.generate()
    generator = EchoGenerator(hold_first=True)
    # One task at a time: while it holds the lease the worker does not pull, so the heartbeat's
    # DrainCommand is the only way it can learn that it was ejected.
    worker = Worker(
        worker_config(coordinator.address, tmp_path / "w", max_concurrent_tasks=1),
        identity,
        generator,
    )
    running = asyncio.create_task(worker.run())
    try:
        await operator.nodes.register_node(
            node_service_pb2.RegisterNodeRequest(
                public_key=operator_identity.public_key,
                role=common_pb2.ROLE_OPERATOR,
                protocol_version=PROTOCOL_VERSION,
            )
        )
        await request_tasks(trainer, 1)
        await wait_until(lambda: len(generator.leases) == 1, within=40, what="a lease")
        await operator.nodes.eject_node(
            node_service_pb2.EjectNodeRequest(node_id=identity.node_id, reason="maintenance test")
        )
        # The next heartbeat carries DrainCommand: the held generation is cancelled and the
        # worker stops on its own, without request_stop(). Its deregistration is refused (the
        # node is ejected), which ends run() with the ejection as the reason.
        with pytest.raises(WorkerFatalError, match="NODE_EJECTED"):
            await asyncio.wait_for(running, 60)
        assert any("drain_commanded" in r.getMessage() for r in caplog.records)
        assert generator.leases[0].cancelled
        assert worker.stopping
        assert await _state(operator, identity.node_id) == State.STATE_EJECTED
    finally:
        if not running.done():
            running.cancel()
        await operator.close()
        await trainer.close()
        await coordinator.stop(grace=0.5)


@pytest.mark.timeout(180)
async def test_deregistered_worker_is_told_to_register_again(
    tmp_path: Path, sqlite_url: str, trainer_identity: Identity, tiny_model: Path
) -> None:
    config = coordinator_config_for(tmp_path, sqlite_url, trainer_identity)
    coordinator = await start_coordinator(config)
    trainer = await start_trainer(coordinator.address, trainer_identity, tiny_model)
    identity = Identity.generate()
    worker = Worker(worker_config(coordinator.address, tmp_path / "w"), identity, EchoGenerator())
    running = asyncio.create_task(worker.run())
    rogue = connect(coordinator.address, identity)

    async def active() -> bool:
        try:
            return await _state(rogue, identity.node_id) == State.STATE_ACTIVE
        except RollnetError:  # not registered yet
            return False

    try:
        await wait_until(active, within=30, what="the worker to be ACTIVE")
        # The registration disappears behind the worker's back.
        await rogue.nodes.deregister_node(node_service_pb2.DeregisterNodeRequest(reason="test"))
        assert await _state(rogue, identity.node_id) == State.STATE_DEREGISTERED
        await wait_until(active, within=30, what="ReregisterCommand to bring it back")
        # And it still does work.
        await request_tasks(trainer, 1)
        await wait_until(lambda: worker.receipts_kept == 1, within=40, what="a receipt")
        worker.request_stop()
        await asyncio.wait_for(running, 30)
    finally:
        if not running.done():
            running.cancel()
        await rogue.close()
        await trainer.close()
        await coordinator.stop(grace=0.5)
