"""Replays are refused across a restart and across replicas: a signed call captured byte for byte
(headers and body) is refused NONCE_REPLAYED after the coordinator restarted, or when sent to
another replica sharing the database; expired nonces are pruned."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from coordinator_testing import register
from google.protobuf import duration_pb2
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from rollnet.ledger.models import RequestNonce
from rollnet.reference.coordinator.config import CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.server import Coordinator, start_coordinator, sweep_once
from rollnet.sdk import ErrorReason, Identity, RequestSigner, RollnetError, from_rpc_error
from rollnet.sdk.methods import method_path
from rollnet.sdk.testing import NETWORK_ID, connect
from rollnet.v1 import common_pb2, node_pb2, node_service_pb2, task_service_pb2

#: Calls whose replay matters: a heartbeat (deferred to the heartbeat batch), a read, and a
#: DeregisterNode without request_id (a replay deregistered its victim again).
CAPTURED = (
    (method_path("NodeService", "Heartbeat"), node_service_pb2.HeartbeatRequest()),
    (method_path("NodeService", "GetNode"), node_service_pb2.GetNodeRequest()),
    # Deferred to the pull's batch transaction: a replay leases nothing.
    (
        method_path("TaskService", "PullTask"),
        task_service_pb2.PullTaskRequest(wait=duration_pb2.Duration(nanos=1_000_000)),
    ),
    (method_path("NodeService", "DeregisterNode"), node_service_pb2.DeregisterNodeRequest()),
)


class Captured:
    """A signed call's exact bytes and headers, sendable again and again."""

    def __init__(self, identity: Identity, method: str, body: bytes) -> None:
        self.method = method
        self.body = body
        self.metadata = RequestSigner(identity, NETWORK_ID).sign(method, body).as_metadata()

    async def send(self, address: str) -> RollnetError | None:
        """Send it to ``address``: the refusal, or None when it was served."""
        async with grpc.aio.insecure_channel(address) as channel:
            call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(self.method)
            try:
                await call(self.body, metadata=self.metadata, timeout=10)
            except grpc.aio.AioRpcError as error:
                return from_rpc_error(error)
        return None


async def _capture_and_send(address: str, worker: Identity) -> list[Captured]:
    captured = [
        Captured(worker, method, request.SerializeToString()) for method, request in CAPTURED
    ]
    for call in captured:
        assert await call.send(address) is None, call.method
        refused = await call.send(address)  # this process remembers it in memory too
        assert refused is not None
        assert refused.reason == ErrorReason.NONCE_REPLAYED
    return captured


def _assert_replays_refused(outcomes: list[RollnetError | None]) -> None:
    for outcome, (method, _) in zip(outcomes, CAPTURED, strict=True):
        assert outcome is not None, f"{method} replayed and served"
        assert outcome.code == grpc.StatusCode.UNAUTHENTICATED, (method, outcome)
        assert outcome.reason == ErrorReason.NONCE_REPLAYED, (method, outcome)


async def test_a_call_captured_before_a_restart_is_refused_after_it(
    coordinator_config: CoordinatorConfig,
) -> None:
    worker = Identity.generate()
    coordinator = await start_coordinator(coordinator_config)
    client = connect(coordinator.address, worker)
    try:
        await register(client, worker, common_pb2.ROLE_WORKER)
        captured = await _capture_and_send(coordinator.address, worker)
        again = await register(client, worker, common_pb2.ROLE_WORKER)  # back after leaving
        assert again.node.state == node_pb2.Node.STATE_PENDING
    finally:
        await client.close()
        await coordinator.stop(grace=0.1)

    restarted = await start_coordinator(coordinator_config)
    client = connect(restarted.address, worker)
    try:
        _assert_replays_refused([await call.send(restarted.address) for call in captured])
        # The replayed DeregisterNode did not take the node out again.
        node = await client.nodes.get_node(node_service_pb2.GetNodeRequest())
        assert node.node.state == node_pb2.Node.STATE_PENDING, node.node
    finally:
        await client.close()
        await restarted.stop(grace=0.1)


@pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_call_is_refused_when_replayed_to_another_replica(
    coordinator_config: CoordinatorConfig, tmp_path: Path
) -> None:
    replicas = [
        await start_coordinator(with_overrides(coordinator_config, data_dir=tmp_path / name))
        for name in ("replica-a", "replica-b")
    ]
    worker = Identity.generate()
    client = connect(replicas[0].address, worker)
    try:
        await register(client, worker, common_pb2.ROLE_WORKER)
        captured = await _capture_and_send(replicas[0].address, worker)
        _assert_replays_refused([await call.send(replicas[1].address) for call in captured])
    finally:
        await client.close()
        for replica in replicas:
            await replica.stop(grace=0.1)


async def _count_nonces(coordinator: Coordinator) -> int:
    def count(session: Session) -> int:
        return int(session.scalar(select(func.count()).select_from(RequestNonce)) or 0)

    return await coordinator.ctx.run_read(count)


async def test_expired_nonces_are_pruned(coordinator: Coordinator) -> None:
    """The table holds one signing window of calls: the sweep deletes nonces a skew window
    after their signatures expired, and keeps the rest."""
    worker = Identity.generate()
    client = connect(coordinator.address, worker)
    try:
        await register(client, worker, common_pb2.ROLE_WORKER)
        await client.nodes.heartbeat(node_service_pb2.HeartbeatRequest())
        recorded = await _count_nonces(coordinator)
        assert recorded >= 2  # the registration's and the heartbeat's
        await sweep_once(coordinator.ctx)
        assert await _count_nonces(coordinator) == recorded  # all of them still live
        skew = coordinator.ctx.config.signature_skew
        now = coordinator.ctx.clock()
        coordinator.ctx.clock = lambda: now + 2 * skew + timedelta(seconds=1)
        await sweep_once(coordinator.ctx)
        assert await _count_nonces(coordinator) == 0
    finally:
        await client.close()
