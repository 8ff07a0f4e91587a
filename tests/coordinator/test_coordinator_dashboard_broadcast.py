"""The dashboard's broadcast figure: nodes are counted against the step that was latest when
their steps were read, not against one published since (which no node could hold yet)."""

from __future__ import annotations

import pytest
from coordinator_testing import publish_checkpoint, register

from rollnet.reference.coordinator import dashboard_view
from rollnet.reference.coordinator.dashboard_view import SwarmView
from rollnet.reference.coordinator.server import Coordinator
from rollnet.reference.demo_view import summary_fields
from rollnet.sdk import Identity
from rollnet.sdk.testing import connect
from rollnet.v1 import common_pb2, node_service_pb2


async def test_nodes_are_counted_against_the_step_read_with_them(
    coordinator: Coordinator, trainer_identity: Identity, monkeypatch: pytest.MonkeyPatch
) -> None:
    workers = [Identity.generate() for _ in range(3)]
    clients = [connect(coordinator.address, worker) for worker in workers]
    trainer = connect(coordinator.address, trainer_identity)
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        for client, worker in zip(clients, workers, strict=True):
            await register(client, worker, common_pb2.ROLE_WORKER)
        await publish_checkpoint(trainer, trainer_identity, step=1)
        await publish_checkpoint(trainer, trainer_identity, step=2)
        for client, step in zip(clients, (2, 2, 1), strict=True):
            await client.nodes.heartbeat(node_service_pb2.HeartbeatRequest(checkpoint_step=step))

        monkeypatch.setattr(dashboard_view, "REFRESH_SECONDS", 0.0)
        monkeypatch.setattr(dashboard_view, "SLOW_REFRESH_SECONDS", 3600.0)
        view = SwarmView(coordinator.ctx)
        first = (await view.snapshot())["checkpoints"]
        assert (first["latest"], first["counted_at"]) == (2, 2)
        assert (first["at_latest"], first["within_one_step"], first["live_nodes"]) == (2, 3, 3)

        # Step 3 is published (and the nodes fetch it) after the nodes' steps were read: until
        # they are read again the figure stays about step 2, instead of reading 0 of 3 on 3.
        await publish_checkpoint(trainer, trainer_identity, step=3)
        for client in clients:
            await client.nodes.heartbeat(node_service_pb2.HeartbeatRequest(checkpoint_step=3))
        second = (await view.snapshot())["checkpoints"]
        assert (second["latest"], second["counted_at"]) == (3, 2)
        assert (second["at_latest"], second["within_one_step"]) == (2, 3)
        assert summary_fields({"checkpoints": second})["broadcast"] == (
            "2 of 3 nodes on checkpoint 2 (3 within one step)"
        )

        monkeypatch.setattr(dashboard_view, "SLOW_REFRESH_SECONDS", 0.0)
        third = (await view.snapshot())["checkpoints"]
        assert (third["latest"], third["counted_at"], third["at_latest"]) == (3, 3, 3)
    finally:
        for client in (*clients, trainer):
            await client.close()
