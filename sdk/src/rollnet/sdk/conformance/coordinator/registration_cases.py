"""The coordinator suite's cases: registration."""

from __future__ import annotations

import time

from rollnet.sdk.conformance.coordinator._base import C, _seconds, case, expect
from rollnet.sdk.conformance.suite import Skipped
from rollnet.sdk.conformance.target import REGISTER, Peer, Target, registration
from rollnet.sdk.identity import Identity, node_id_from_public_key
from rollnet.sdk.version import PROTOCOL_MAJOR
from rollnet.v1 import common_pb2, node_pb2


@case("registration.new", "a new key registers as a worker: its node id, PENDING, the network")
async def registration_new(target: Target) -> None:
    peer = Peer(target, Identity.generate(), common_pb2.ROLE_WORKER)
    response = await target.register(peer)
    expect(
        response.node.node_id == node_id_from_public_key(peer.identity.public_key),
        f"node id {response.node.node_id!r} is not the one derived from the key",
    )
    expect(
        response.node.state == node_pb2.Node.STATE_PENDING,
        f"a new node is {node_pb2.Node.State.Name(response.node.state)}, not PENDING",
    )
    expect(
        response.network_id == target.config.network_id,
        f"network_id {response.network_id!r}, expected {target.config.network_id!r}",
    )
    expect(
        response.server_protocol_version.major == PROTOCOL_MAJOR,
        f"server_protocol_version.major is not {PROTOCOL_MAJOR}",
    )
    expect(response.heartbeat_interval.ToTimedelta().total_seconds() > 0, "no heartbeat_interval")
    expect(response.lease_duration.ToTimedelta().total_seconds() > 0, "no lease_duration")
    expect(
        abs(_seconds(response.server_time) - time.time()) < 60, "server_time is more than 60 s off"
    )
    expect(len(response.coordinator_public_key) == 32, "coordinator_public_key is not 32 bytes")


@case("registration.repeated", "registering again (same key and role) answers the same node")
async def registration_repeated(target: Target) -> None:
    peer = Peer(target, Identity.generate(), common_pb2.ROLE_WORKER)
    request = registration(peer.identity, peer.role)
    first = await target.register(peer, request)
    again = await target.register(peer, request)  # the same request id: the stored answer
    expect(again.node.node_id == first.node.node_id, "a repeat with the same request id differs")
    other = registration(peer.identity, peer.role)  # a fresh request id
    third = await target.register(peer, other)
    expect(third.node.node_id == first.node.node_id, "a second registration made another node")


@case(
    "registration.request_id_reused",
    "a RegisterNode request id reused with another body: REQUEST_ID_REUSED",
)
async def registration_request_id_reused(target: Target) -> None:
    peer = Peer(target, Identity.generate(), common_pb2.ROLE_WORKER)
    request = registration(peer.identity, peer.role)
    await target.register(peer, request)
    changed = registration(peer.identity, peer.role, software_version="rollnet-conformance/0.2")
    changed.request_id = request.request_id
    await peer.refused(REGISTER, changed, C.FAILED_PRECONDITION, "REQUEST_ID_REUSED")


@case("registration.bad_version", "protocol major 2: PROTOCOL_VERSION_UNSUPPORTED naming 1")
async def registration_bad_version(target: Target) -> None:
    peer = Peer(target, Identity.generate(), common_pb2.ROLE_WORKER)
    request = registration(
        peer.identity,
        peer.role,
        protocol_version=common_pb2.ProtocolVersion(major=2, minor=0),
    )
    error = await peer.refused(
        REGISTER, request, C.FAILED_PRECONDITION, "PROTOCOL_VERSION_UNSUPPORTED"
    )
    expect(
        error.metadata.get("supported_major") == "1",
        f"ErrorInfo.metadata supported_major is {error.metadata.get('supported_major')!r}",
    )


@case("registration.bad_role", "no role, or a role this protocol lacks: INVALID_FIELDS on role")
async def registration_bad_role(target: Target) -> None:
    peer = Peer(target, Identity.generate(), common_pb2.ROLE_WORKER)
    for role in (common_pb2.ROLE_UNSPECIFIED, 99):
        request = registration(peer.identity, common_pb2.ROLE_WORKER)
        request.role = role  # type: ignore[assignment]
        await peer.refused(REGISTER, request, C.INVALID_ARGUMENT, "INVALID_FIELDS", field="role")


@case("registration.key_mismatch", "a body naming another key than the signer's: KEY_MISMATCH")
async def registration_key_mismatch(target: Target) -> None:
    peer = Peer(target, Identity.generate(), common_pb2.ROLE_WORKER)
    request = registration(Identity.generate(), common_pb2.ROLE_WORKER)
    await peer.refused(REGISTER, request, C.INVALID_ARGUMENT, "KEY_MISMATCH")


@case("registration.hardware", "implausible hardware: HARDWARE_CLAIM_IMPLAUSIBLE")
async def registration_hardware(target: Target) -> None:
    peer = Peer(target, Identity.generate(), common_pb2.ROLE_WORKER)
    request = registration(
        peer.identity,
        peer.role,
        hardware=node_pb2.HardwareReport(cpu_cores=1_000_000, memory_bytes=1 << 30),
    )
    await peer.refused(REGISTER, request, C.INVALID_ARGUMENT, "HARDWARE_CLAIM_IMPLAUSIBLE")


@case("registration.unknown_pool", "a pool the target does not have: INVITE_TOKEN_INVALID")
async def registration_unknown_pool(target: Target) -> None:
    peer = Peer(target, Identity.generate(), common_pb2.ROLE_WORKER)
    request = registration(peer.identity, peer.role, pool="conformance-no-such-pool")
    await peer.refused(REGISTER, request, C.PERMISSION_DENIED, "INVITE_TOKEN_INVALID")


@case("registration.invite", "an invite-only pool: a wrong token refused, its token admitted")
async def registration_invite(target: Target) -> None:
    pool, token = target.config.invite_pool, target.config.invite_token
    if not pool or not token:
        raise Skipped("needs an invite-only pool and one of its tokens (--invite POOL:TOKEN)")
    peer = Peer(target, Identity.generate(), common_pb2.ROLE_WORKER)
    for wrong in ("", token + "x"):
        request = registration(peer.identity, peer.role, pool=pool, invite_token=wrong)
        await peer.refused(REGISTER, request, C.PERMISSION_DENIED, "INVITE_TOKEN_INVALID")
    await target.register(
        peer, registration(peer.identity, peer.role, pool=pool, invite_token=token)
    )


@case(
    "registration.allow_list",
    "a new key asking for validator, trainer or operator: ROLE_NOT_PERMITTED",
)
async def registration_allow_list(target: Target) -> None:
    for role in (common_pb2.ROLE_VALIDATOR, common_pb2.ROLE_TRAINER, common_pb2.ROLE_OPERATOR):
        peer = Peer(target, Identity.generate(), role)
        await peer.refused(
            REGISTER, registration(peer.identity, role), C.PERMISSION_DENIED, "ROLE_NOT_PERMITTED"
        )


@case("registration.allow_listed", "the given allow-listed keys register with their roles")
async def registration_allow_listed(target: Target) -> None:
    roles = [role for role in ("validator", "trainer", "operator") if role in target.config.keys]
    if not roles:
        raise Skipped("needs a validator, trainer or operator key (--keys DIR)")
    for role in roles:
        peer = await target.peer(role)
        expect(peer.registration is not None, f"the {role} key did not register")


@case("registration.role_conflict", "an allow-listed key asking for another role: ROLE_CONFLICT")
async def registration_role_conflict(target: Target) -> None:
    roles = [role for role in ("validator", "trainer", "operator") if role in target.config.keys]
    if not roles:
        raise Skipped("needs a validator, trainer or operator key (--keys DIR)")
    peer = await target.peer(roles[0])
    request = registration(peer.identity, common_pb2.ROLE_WORKER)
    await peer.refused(REGISTER, request, C.FAILED_PRECONDITION, "ROLE_CONFLICT")
