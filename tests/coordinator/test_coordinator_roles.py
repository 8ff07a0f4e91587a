"""The roles table of docs/protocol.md (*Services*) is what the coordinator enforces: every role
calls every RPC, and exactly the roles the table leaves out are refused ROLE_NOT_ALLOWED; a role
limited to its own objects ("(own)") is refused another node's."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from coordinator_testing import publish_checkpoint, pull_and_commit, register, request_tasks
from google.protobuf import duration_pb2, message_factory
from google.protobuf.message import Message

from rollnet.reference.coordinator.config import CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.reference.relay.prefetch import refuses_unknown_role, register_relay
from rollnet.sdk import (
    ConnectionConfig,
    ErrorReason,
    Identity,
    RetryPolicy,
    RollnetError,
    from_rpc_error,
    open_channel,
)
from rollnet.sdk.methods import ALL_METHODS, ROLE_TABLE, Access, roles_text
from rollnet.sdk.testing import NETWORK_ID, connect
from rollnet.v1 import (
    checkpoint_service_pb2,
    commitment_service_pb2,
    common_pb2,
    node_service_pb2,
    task_service_pb2,
)

PROTOCOL_MD = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
ROLES = {
    "worker": common_pb2.ROLE_WORKER,
    "validator": common_pb2.ROLE_VALIDATOR,
    "trainer": common_pb2.ROLE_TRAINER,
    "operator": common_pb2.ROLE_OPERATOR,
    "relay": common_pb2.ROLE_RELAY,
}


def documented_roles() -> dict[str, dict[int, Access]]:
    """The *Roles* column of docs/protocol.md's Services table, by full method path."""
    text = PROTOCOL_MD.read_text()
    table = text[text.index("| Service | RPC | Roles |") :].split("\n\n", 1)[0]
    found: dict[str, dict[int, Access]] = {}
    service = ""
    for line in table.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        service = cells[0] or service
        access: dict[int, Access] = {}
        for item in cells[2].removesuffix(" (and any new key)").split(", "):
            if item == "all":
                access.update(dict.fromkeys(ROLES.values(), Access.ALL))
                continue
            match = re.fullmatch(r"(\w+)( \(own\))?", item)
            assert match is not None, f"unreadable roles cell {cells[2]!r}"
            access[ROLES[match[1]]] = Access.OWN if match[2] else Access.ALL
        for rpc in cells[1].split(", "):
            found[f"/rollnet.v1.{service}/{rpc}"] = access
    return found


def test_the_docs_roles_table_is_the_enforced_table() -> None:
    documented = documented_roles()
    assert set(documented) == ALL_METHODS
    assert documented == {method: dict(access) for method, access in ROLE_TABLE.items()}
    text = PROTOCOL_MD.read_text()
    for method in ALL_METHODS:
        assert f"| {roles_text(method)} |" in text, method


def _request_for(method: str) -> tuple[Any, Message, bool, bool]:
    """(generated method descriptor, a minimal request, request streaming, response
    streaming): an empty message, with every long-poll's wait at 1 ms."""
    from google.protobuf import descriptor_pool

    service_name, rpc = method.strip("/").split("/")
    service = descriptor_pool.Default().FindServiceByName(service_name)
    descriptor = service.methods_by_name[rpc]
    request = message_factory.GetMessageClass(descriptor.input_type)()
    if "wait" in descriptor.input_type.fields_by_name:
        request.wait.CopyFrom(duration_pb2.Duration(nanos=1_000_000))  # type: ignore[attr-defined]
    return descriptor, request, descriptor.client_streaming, descriptor.server_streaming


async def _call(channel: grpc.aio.Channel, method: str) -> RollnetError | None:
    """Call ``method`` with a minimal request; the error it ends with (None: none, or still
    streaming after a moment, which is past every check of the caller's role)."""
    descriptor, request, stream_in, stream_out = _request_for(method)
    response_type = message_factory.GetMessageClass(descriptor.output_type)
    serialize, parse = type(request).SerializeToString, response_type.FromString
    try:
        if stream_in:
            call: Any = channel.stream_unary(method, serialize, parse)

            async def one() -> Any:
                yield request

            await call(one(), timeout=5)
        elif stream_out:
            stream: grpc.aio.UnaryStreamCall[Message, Message]
            stream = channel.unary_stream(method, serialize, parse)(request, timeout=0.5)
            async for _ in stream:
                pass
        else:
            await channel.unary_unary(method, serialize, parse)(request, timeout=5)
    except grpc.aio.AioRpcError as error:
        if stream_out and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return None  # a stream that was admitted and waits for something to send
        return from_rpc_error(error)
    return None


async def _outcome(call: Awaitable[object]) -> RollnetError | None:
    try:
        await call
    except RollnetError as error:
        return error
    return None


@pytest.mark.timeout(90)
@pytest.mark.slow
async def test_every_role_calls_every_rpc_as_the_docs_table_says(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    validator_identity: Identity,
    operator_identity: Identity,
) -> None:
    config = with_overrides(coordinator_config, pull_wait_max=timedelta(milliseconds=50))
    coordinator = await start_coordinator(config)
    identities = {
        common_pb2.ROLE_WORKER: Identity.generate(),
        common_pb2.ROLE_VALIDATOR: validator_identity,
        common_pb2.ROLE_TRAINER: trainer_identity,
        common_pb2.ROLE_OPERATOR: operator_identity,
        common_pb2.ROLE_RELAY: Identity.generate(),
    }
    other_worker = Identity.generate()
    clients = {role: connect(coordinator.address, key) for role, key in identities.items()}
    other = connect(coordinator.address, other_worker)
    channels = {
        role: open_channel(
            ConnectionConfig(
                target=coordinator.address, network_id=NETWORK_ID, retry=RetryPolicy.no_retry()
            ),
            key,
        )
        for role, key in identities.items()
    }
    documented = documented_roles()
    try:
        for role, client in clients.items():
            await register(client, identities[role], role)
        await register(other, other_worker, common_pb2.ROLE_WORKER)

        # "(own)": another node's commitment and another node.
        trainer = clients[common_pb2.ROLE_TRAINER]
        await publish_checkpoint(trainer, trainer_identity, 1)
        await request_tasks(trainer, 1)
        theirs = (await pull_and_commit(other, other_worker)).commitment.commitment_id
        get_commitment = "/rollnet.v1.CommitmentService/GetCommitment"
        get_node = "/rollnet.v1.NodeService/GetNode"
        for role, client in clients.items():
            for method, call in (
                (
                    get_commitment,
                    client.commitments.get_commitment(
                        commitment_service_pb2.GetCommitmentRequest(commitment_id=theirs)
                    ),
                ),
                (
                    get_node,
                    client.nodes.get_node(
                        node_service_pb2.GetNodeRequest(node_id=other_worker.node_id)
                    ),
                ),
            ):
                outcome = await _outcome(call)
                if documented[method].get(role) is Access.ALL:
                    assert outcome is None, (method, role, outcome)
                else:
                    assert outcome is not None, (method, role)
                    assert outcome.code == grpc.StatusCode.PERMISSION_DENIED
                    assert outcome.reason == ErrorReason.ROLE_NOT_ALLOWED
        # Its own commitment, a worker reads; an id that does not exist is not found for all.
        mine = await other.commitments.get_commitment(
            commitment_service_pb2.GetCommitmentRequest(commitment_id=theirs)
        )
        assert mine.commitment.node_id == other_worker.node_id
        for client in (other, clients[common_pb2.ROLE_OPERATOR]):
            with pytest.raises(RollnetError) as missing:
                await client.commitments.get_commitment(
                    commitment_service_pb2.GetCommitmentRequest(commitment_id="0" * 24)
                )
            assert missing.value.reason == ErrorReason.COMMITMENT_NOT_FOUND

        # Every role x every RPC (DeregisterNode last: it takes the caller out of work).
        methods = sorted(ALL_METHODS, key=lambda m: (m.endswith("/DeregisterNode"), m))
        cells = 0
        for method in methods:
            outcomes = await asyncio.gather(*(_call(channels[role], method) for role in identities))
            for role, outcome in zip(identities, outcomes, strict=True):
                refused = outcome is not None and outcome.reason == ErrorReason.ROLE_NOT_ALLOWED
                assert refused == (role not in documented[method]), (method, role, outcome)
                if refused:
                    assert outcome is not None
                    assert outcome.code == grpc.StatusCode.PERMISSION_DENIED
                cells += 1
        assert cells == len(identities) * len(ALL_METHODS)
    finally:
        for client in [*clients.values(), other]:
            await client.close()
        for channel in channels.values():
            await channel.close()
        await coordinator.stop(grace=0.1)


@pytest.mark.timeout(60)
async def test_a_relay_reads_checkpoints_and_may_not_lease_work(
    coordinator_config: CoordinatorConfig, trainer_identity: Identity
) -> None:
    coordinator = await start_coordinator(coordinator_config)
    relay_key = Identity.generate()
    trainer = connect(coordinator.address, trainer_identity)
    relay = connect(coordinator.address, relay_key)
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        await publish_checkpoint(trainer, trainer_identity, 1)
        await request_tasks(trainer, 1)
        # What `rollnet relay --coordinator` calls: no allow-list needed for the role.
        assert await register_relay(relay) == common_pb2.ROLE_RELAY
        node = await relay.nodes.get_node(
            node_service_pb2.GetNodeRequest(node_id=relay_key.node_id)
        )
        assert node.node.role == common_pb2.ROLE_RELAY
        latest = await relay.checkpoints.get_latest_checkpoint()
        assert latest.checkpoint.step == 1
        same = await relay.checkpoints.get_checkpoint(
            checkpoint_service_pb2.GetCheckpointRequest(step=1)
        )
        assert same.checkpoint.manifest == latest.checkpoint.manifest
        with pytest.raises(RollnetError) as refused:
            await relay.tasks.pull_task(task_service_pb2.PullTaskRequest())
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert refused.value.reason == ErrorReason.ROLE_NOT_ALLOWED
        # A coordinator that predates ROLE_RELAY refuses it as this one refuses a role it does
        # not know; the relay recognises that refusal (and then registers as a worker).
        with pytest.raises(RollnetError) as unknown:
            await register(relay, relay_key, 99)
        assert refuses_unknown_role(unknown.value), unknown.value
        assert not refuses_unknown_role(refused.value)
    finally:
        await trainer.close()
        await relay.close()
        await coordinator.stop(grace=0.1)
