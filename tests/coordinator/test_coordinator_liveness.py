"""Liveness: ACTIVE → SUSPECT → OFFLINE as heartbeats stop, OFFLINE requeues leases, heartbeats
revive SUSPECT and OFFLINE nodes but never ejected, banned or deregistered ones; intervals are
clamped and replies carry lease extensions and checkpoint commands."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import timedelta

import grpc
import pytest
from coordinator_testing import publish_checkpoint, pull, register, request_tasks
from google.protobuf import duration_pb2

from rollnet.reference.coordinator.config import CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.heartbeats import LAG_LIMIT, LoopLag
from rollnet.reference.coordinator.server import Coordinator, start_coordinator
from rollnet.sdk import ErrorReason, Identity, RollnetClient, RollnetError
from rollnet.sdk.testing import connect, wait_until
from rollnet.v1 import common_pb2, node_pb2, node_service_pb2

State = node_pb2.Node


@pytest.fixture
async def fast(coordinator_config: CoordinatorConfig) -> AsyncIterator[Coordinator]:
    """A coordinator whose nodes turn SUSPECT after 0.4 s of silence and OFFLINE after 2 s."""
    config = with_overrides(
        coordinator_config,
        heartbeat_interval=timedelta(seconds=0.2),
        heartbeat_interval_min=timedelta(seconds=0.05),
        heartbeat_interval_max=timedelta(seconds=5),
        suspect_after_missed=2.0,
        offline_after_missed=10.0,
        sweep_interval=timedelta(seconds=0.05),
        lease_duration=timedelta(seconds=60),
    )
    running = await start_coordinator(config)
    try:
        yield running
    finally:
        await running.stop(grace=0.1)


async def _state(client: RollnetClient, node_id: str = "") -> int:
    node = await client.nodes.get_node(node_service_pb2.GetNodeRequest(node_id=node_id))
    state: int = node.node.state
    return state


async def _reach(client: RollnetClient, state: int) -> None:
    async def reached() -> bool:
        return await _state(client) == state

    await wait_until(reached, within=15, what=f"state {State.State.Name(state)}")  # type: ignore[arg-type]


def _seconds(value: duration_pb2.Duration) -> float:
    return float(value.ToTimedelta().total_seconds())


async def test_silence_suspect_offline_requeue_and_revival(
    fast: Coordinator, trainer_identity: Identity
) -> None:
    worker, other = Identity.generate(), Identity.generate()
    trainer = connect(fast.address, trainer_identity)
    client = connect(fast.address, worker)
    second = connect(fast.address, other)
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        await register(client, worker, common_pb2.ROLE_WORKER)
        await register(second, other, common_pb2.ROLE_WORKER)
        await publish_checkpoint(trainer, trainer_identity, step=1)
        [task_id] = await request_tasks(trainer, 1)
        assert await _state(client) == State.STATE_PENDING

        beat = await client.nodes.heartbeat(node_service_pb2.HeartbeatRequest())
        assert beat.state == State.STATE_ACTIVE
        # The node has no checkpoint yet: the reply says to fetch step 1.
        assert [c.update_checkpoint.step for c in beat.commands] == [1]
        assert _seconds(beat.heartbeat_interval) == pytest.approx(0.2)

        leased = await pull(client)
        assert leased.task.task_id == task_id
        lease = leased.lease
        beat = await client.nodes.heartbeat(
            node_service_pb2.HeartbeatRequest(held_lease_ids=[lease.lease_id], checkpoint_step=1)
        )
        assert not beat.commands  # up to date
        [status] = beat.leases
        assert status.valid
        assert status.deadline.ToDatetime() > lease.deadline.ToDatetime()  # extended

        # Silence → SUSPECT; a heartbeat revives a suspect node at once.
        await _reach(client, State.STATE_SUSPECT)
        beat = await client.nodes.heartbeat(node_service_pb2.HeartbeatRequest(checkpoint_step=1))
        assert beat.state == State.STATE_ACTIVE

        # Longer silence → SUSPECT → OFFLINE, and the OFFLINE node's lease is revoked.
        await _reach(client, State.STATE_SUSPECT)
        await _reach(client, State.STATE_OFFLINE)
        requeued = await pull(second)
        assert requeued.task.task_id == task_id
        assert requeued.task.attempt == 2
        assert requeued.lease.fencing_token == 2

        # The offline node comes back: ACTIVE again, but its old lease is gone for good.
        beat = await client.nodes.heartbeat(
            node_service_pb2.HeartbeatRequest(held_lease_ids=[lease.lease_id], checkpoint_step=1)
        )
        assert beat.state == State.STATE_ACTIVE
        assert [s.valid for s in beat.leases] == [False]

        # Requested intervals are clamped to [min, max].
        for requested, granted in ((0.001, 0.05), (3600.0, 5.0), (1.5, 1.5)):
            beat = await client.nodes.heartbeat(
                node_service_pb2.HeartbeatRequest(
                    requested_interval=duration_pb2.Duration(
                        seconds=int(requested), nanos=int(requested % 1 * 1e9)
                    ),
                    checkpoint_step=1,
                )
            )
            assert _seconds(beat.heartbeat_interval) == pytest.approx(granted)

        # A newer checkpoint shows up as a command in the next reply.
        await publish_checkpoint(trainer, trainer_identity, step=2)
        beat = await client.nodes.heartbeat(node_service_pb2.HeartbeatRequest(checkpoint_step=1))
        assert [c.update_checkpoint.step for c in beat.commands] == [2]
    finally:
        for c in (trainer, client, second):
            await c.close()


async def test_heartbeat_never_revives_removed_nodes(
    fast: Coordinator, operator_identity: Identity
) -> None:
    ejected, banned, left = Identity.generate(), Identity.generate(), Identity.generate()
    operator = connect(fast.address, operator_identity)
    clients = {
        identity.node_id: connect(fast.address, identity) for identity in (ejected, banned, left)
    }
    try:
        await register(operator, operator_identity, common_pb2.ROLE_OPERATOR)
        for identity in (ejected, banned, left):
            client = clients[identity.node_id]
            await register(client, identity, common_pb2.ROLE_WORKER)
            await client.nodes.heartbeat(node_service_pb2.HeartbeatRequest())
        await operator.nodes.eject_node(
            node_service_pb2.EjectNodeRequest(node_id=ejected.node_id, reason="cheating")
        )
        await operator.nodes.ban_node(
            node_service_pb2.BanNodeRequest(node_id=banned.node_id, reason="sybil")
        )
        await clients[left.node_id].nodes.deregister_node(
            node_service_pb2.DeregisterNodeRequest(reason="maintenance")
        )
        for _ in range(2):  # a second round: the first heartbeat changed nothing
            # The banned key is refused outright.
            with pytest.raises(RollnetError) as refused:
                await clients[banned.node_id].nodes.heartbeat(node_service_pb2.HeartbeatRequest())
            assert (refused.value.code, refused.value.reason) == (
                grpc.StatusCode.PERMISSION_DENIED,
                ErrorReason.NODE_BANNED,
            )
            assert await _state(operator, banned.node_id) == State.STATE_BANNED
            # The ejected node is told to drain, the deregistered one to register again.
            reply = await clients[ejected.node_id].nodes.heartbeat(
                node_service_pb2.HeartbeatRequest(held_lease_ids=["some-lease"])
            )
            assert reply.state == State.STATE_EJECTED
            assert [c.WhichOneof("command") for c in reply.commands] == ["drain"]
            assert "cheating" in reply.commands[0].drain.reason
            assert [(s.lease_id, s.valid) for s in reply.leases] == [("some-lease", False)]
            assert await _state(operator, ejected.node_id) == State.STATE_EJECTED
            reply = await clients[left.node_id].nodes.heartbeat(node_service_pb2.HeartbeatRequest())
            assert reply.state == State.STATE_DEREGISTERED
            assert [c.WhichOneof("command") for c in reply.commands] == ["reregister"]
            assert await _state(operator, left.node_id) == State.STATE_DEREGISTERED
        node = await operator.nodes.get_node(
            node_service_pb2.GetNodeRequest(node_id=ejected.node_id)
        )
        assert node.node.state_reason == "cheating"
        # An ejected node may not take work either.
        with pytest.raises(RollnetError) as refused:
            await pull(clients[ejected.node_id], wait=0)
        assert refused.value.reason == ErrorReason.NODE_EJECTED
    finally:
        await operator.close()
        for client in clients.values():
            await client.close()


async def test_silence_is_judged_against_the_interval_granted_to_each_node(
    fast: Coordinator,
) -> None:
    """A node granted a 5 s interval stays ACTIVE through 1.5 s of silence; a node on the 0.2 s
    default turns SUSPECT after 0.4 s of it."""
    slow, quick = Identity.generate(), Identity.generate()
    slow_client, quick_client = connect(fast.address, slow), connect(fast.address, quick)
    try:
        for identity, client in ((slow, slow_client), (quick, quick_client)):
            await register(client, identity, common_pb2.ROLE_WORKER)
        reply = await slow_client.nodes.heartbeat(
            node_service_pb2.HeartbeatRequest(requested_interval=duration_pb2.Duration(seconds=5))
        )
        assert _seconds(reply.heartbeat_interval) == 5.0
        await quick_client.nodes.heartbeat(node_service_pb2.HeartbeatRequest())
        await _reach(quick_client, State.STATE_SUSPECT)

        async def a_while() -> bool:  # 1.5 s: well past the default node's 0.4 s threshold
            return (await _state(slow_client)) == State.STATE_ACTIVE and (
                fast.ctx.clock() - started
            ).total_seconds() > 1.5

        started = fast.ctx.clock()
        await wait_until(a_while, within=15, what="1.5 s of silence with the slow node ACTIVE")
        assert await _state(slow_client) == State.STATE_ACTIVE
    finally:
        await slow_client.close()
        await quick_client.close()


async def test_a_coordinator_that_is_behind_grants_longer_intervals(fast: Coordinator) -> None:
    """The back-off hint: while the event loop lags, heartbeats are granted twice the interval,
    and the node is then judged by the interval it was granted (no false SUSPECT)."""
    identity = Identity.generate()
    client = connect(fast.address, identity)
    try:
        await register(client, identity, common_pb2.ROLE_WORKER)
        reply = await client.nodes.heartbeat(node_service_pb2.HeartbeatRequest())
        assert _seconds(reply.heartbeat_interval) == pytest.approx(0.2)
        lag = fast.registry.heartbeats.lag
        for _ in range(lag.samples.maxlen or 1):
            lag.record(10 * LAG_LIMIT)  # as if far behind
        reply = await client.nodes.heartbeat(node_service_pb2.HeartbeatRequest())
        assert _seconds(reply.heartbeat_interval) == pytest.approx(0.4)
        started = fast.ctx.clock()

        async def a_while() -> bool:  # 0.6 s: past 2 x 0.2 s, within 2 x the granted 0.4 s
            return (fast.ctx.clock() - started).total_seconds() > 0.6

        await wait_until(a_while, within=15, what="0.6 s of silence")
        assert await _state(client) == State.STATE_ACTIVE
        await _reach(client, State.STATE_SUSPECT)  # and silence past 0.8 s does count
    finally:
        await client.close()


async def test_loop_lag_records_a_blocked_loop() -> None:
    lag = LoopLag()
    lag.start()
    try:

        async def probing() -> bool:
            return len(lag.samples) > 0

        await wait_until(probing, within=5, what="a first probe")
        time.sleep(0.3)  # noqa: ASYNC251 - blocking the loop is the point

        async def recorded() -> bool:
            return max(lag.samples) >= 0.2

        await wait_until(recorded, within=5, what="the stall recorded")
    finally:
        await lag.stop()


def test_loop_lag_counts_a_saturated_loop_not_one_stall() -> None:
    lag = LoopLag(window=3)
    lag.record(0.3)
    assert lag.seconds == 0.3
    assert not lag.lagging  # one probe is no window: a stall at start-up does not count
    for late in (0.0, 0.0):
        lag.record(late)
    assert lag.seconds == 0.0
    assert not lag.lagging  # one late probe in three: a stall
    lag.record(0.3)
    lag.record(0.3)
    assert lag.seconds == 0.3  # two in three: the loop lags
    assert lag.lagging
