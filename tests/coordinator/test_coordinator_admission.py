"""Registration: invite-only pools, hardware plausibility, per-IP caps, idempotent re-registration,
role conflicts and banned keys — each refusal with its documented code and reason."""

from __future__ import annotations

import grpc
import pytest
from coordinator_testing import register

from rollnet.reference.coordinator.config import CoordinatorConfig, PoolConfig, with_overrides
from rollnet.reference.coordinator.server import Coordinator, start_coordinator
from rollnet.sdk import ErrorReason, Identity, RollnetError
from rollnet.sdk.testing import NETWORK_ID, connect
from rollnet.v1 import common_pb2, node_pb2, node_service_pb2


async def test_registration_rules(
    coordinator_config: CoordinatorConfig,
    validator_identity: Identity,
    operator_identity: Identity,
) -> None:
    config = with_overrides(
        coordinator_config,
        pools={"": PoolConfig(), "private": PoolConfig(invite_tokens=frozenset({"sesame"}))},
    )
    coordinator = await start_coordinator(config)
    worker = Identity.generate()
    client = connect(coordinator.address, worker)
    operator = connect(coordinator.address, operator_identity)
    try:
        # Invite-only pool: no token, a wrong token and an unknown pool are refused alike.
        for pool, token in (("private", ""), ("private", "guess"), ("elsewhere", "sesame")):
            with pytest.raises(RollnetError) as refused:
                await register(
                    client, worker, common_pb2.ROLE_WORKER, pool=pool, invite_token=token
                )
            assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
            assert refused.value.reason == ErrorReason.INVITE_TOKEN_INVALID

        # Absurd hardware is refused as implausible, naming what is wrong.
        for hardware in (
            node_pb2.HardwareReport(cpu_cores=1_000_000, memory_bytes=1 << 30),
            node_pb2.HardwareReport(
                cpu_cores=8,
                accelerators=[node_pb2.Accelerator(name="H100", memory_bytes=80 << 30, count=500)],
            ),
        ):
            with pytest.raises(RollnetError) as refused:
                await register(client, worker, common_pb2.ROLE_WORKER, hardware=hardware)
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.reason == ErrorReason.HARDWARE_CLAIM_IMPLAUSIBLE

        # The right token admits; registering again is idempotent (same node, same record).
        first = await register(
            client, worker, common_pb2.ROLE_WORKER, pool="private", invite_token="sesame"
        )
        assert first.node.node_id == worker.node_id
        assert first.node.pool == "private"
        assert first.node.state == node_pb2.Node.STATE_PENDING
        assert first.network_id == NETWORK_ID
        assert first.coordinator_public_key == coordinator.ctx.identity.public_key
        await client.nodes.heartbeat(node_service_pb2.HeartbeatRequest())
        again = await register(
            client, worker, common_pb2.ROLE_WORKER, pool="private", invite_token="sesame"
        )
        assert again.node.node_id == first.node.node_id
        assert again.node.registered_at == first.node.registered_at
        assert again.node.state == node_pb2.Node.STATE_ACTIVE  # re-registering keeps the state
        await register(operator, operator_identity, common_pb2.ROLE_OPERATOR)
        listed = await operator.nodes.list_nodes(
            node_service_pb2.ListNodesRequest(role=common_pb2.ROLE_WORKER)
        )
        assert [n.node_id for n in listed.nodes] == [worker.node_id]

        # Privileged roles need the allow-list; a key registered with one role cannot take
        # another even when it is allow-listed for it.
        with pytest.raises(RollnetError) as refused:
            await register(client, worker, common_pb2.ROLE_VALIDATOR)
        assert refused.value.reason == ErrorReason.ROLE_NOT_PERMITTED
        validator = connect(coordinator.address, validator_identity)
        try:
            await register(validator, validator_identity, common_pb2.ROLE_WORKER)
            with pytest.raises(RollnetError) as refused:
                await register(validator, validator_identity, common_pb2.ROLE_VALIDATOR)
            assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert refused.value.reason == ErrorReason.ROLE_CONFLICT
        finally:
            await validator.close()

        # A banned key is refused everywhere, registration included.
        await operator.nodes.ban_node(
            node_service_pb2.BanNodeRequest(node_id=worker.node_id, reason="sybil")
        )
        for call in (
            register(client, worker, common_pb2.ROLE_WORKER, pool="private", invite_token="sesame"),
            client.nodes.heartbeat(node_service_pb2.HeartbeatRequest()),
        ):
            with pytest.raises(RollnetError) as refused:
                await call
            assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
            assert refused.value.reason == ErrorReason.NODE_BANNED
    finally:
        await client.close()
        await operator.close()
        await coordinator.stop(grace=0.1)


async def test_registrations_are_capped_per_ip(coordinator_config: CoordinatorConfig) -> None:
    coordinator = await start_coordinator(
        with_overrides(coordinator_config, registrations_per_ip_per_minute=3)
    )
    clients = []
    try:
        for attempt in range(4):
            identity = Identity.generate()
            client = connect(coordinator.address, identity)
            clients.append(client)
            if attempt < 3:
                await register(client, identity, common_pb2.ROLE_WORKER)
                continue
            with pytest.raises(RollnetError) as refused:
                await register(client, identity, common_pb2.ROLE_WORKER)
            assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert refused.value.reason == ErrorReason.RATE_LIMITED
            assert refused.value.retry_after is not None
            assert 0 < refused.value.retry_after <= 60
    finally:
        for client in clients:
            await client.close()
        await coordinator.stop(grace=0.1)


async def test_unsupported_version_names_the_supported_range(coordinator: Coordinator) -> None:
    worker = Identity.generate()
    client = connect(coordinator.address, worker)
    try:
        with pytest.raises(RollnetError) as refused:
            await register(
                client,
                worker,
                common_pb2.ROLE_WORKER,
                protocol_version=common_pb2.ProtocolVersion(major=3, minor=1),
            )
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.reason == ErrorReason.PROTOCOL_VERSION_UNSUPPORTED
        assert "1.x" in refused.value.message
        assert refused.value.metadata == {"supported_major": "1", "supported_minor": "0"}
        # Bad input is INVALID_ARGUMENT with one violation per field, never INTERNAL.
        with pytest.raises(RollnetError) as refused:
            await client.nodes.register_node(
                node_service_pb2.RegisterNodeRequest(
                    public_key=worker.public_key, software_version="x" * 65
                )
            )
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert {v.field for v in refused.value.field_violations} >= {
            "role",
            "protocol_version",
            "software_version",
        }
    finally:
        await client.close()


async def test_register_node_honours_request_id(coordinator: Coordinator) -> None:
    """A retry with the request id of an answered RegisterNode gets the same answer (its
    server_time read afresh) and changes nothing; the same id with another body is
    REQUEST_ID_REUSED, and what that body asked for (a new software version) is not applied."""
    worker = Identity.generate()
    client = connect(coordinator.address, worker)
    try:
        first = await register(
            client, worker, common_pb2.ROLE_WORKER, request_id="reg-1", software_version="w/1"
        )
        await client.nodes.heartbeat(node_service_pb2.HeartbeatRequest())  # ACTIVE now
        again = await register(
            client, worker, common_pb2.ROLE_WORKER, request_id="reg-1", software_version="w/1"
        )
        assert again.node == first.node  # the stored answer: PENDING, as first registered
        assert again.network_id == first.network_id
        assert again.server_time.ToDatetime() >= first.server_time.ToDatetime()
        with pytest.raises(RollnetError) as refused:
            await register(
                client, worker, common_pb2.ROLE_WORKER, request_id="reg-1", software_version="w/2"
            )
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.reason == ErrorReason.REQUEST_ID_REUSED
        node = await client.nodes.get_node(node_service_pb2.GetNodeRequest())
        assert node.node.software_version == "w/1"
        assert node.node.state == node_pb2.Node.STATE_ACTIVE
        # A fresh id registers again (idempotent by key and role) and applies the new body.
        fresh = await register(
            client, worker, common_pb2.ROLE_WORKER, request_id="reg-2", software_version="w/2"
        )
        assert fresh.node.software_version == "w/2"
    finally:
        await client.close()
