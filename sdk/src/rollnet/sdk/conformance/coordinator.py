"""The coordinator suite: each case one documented behaviour of docs/protocol.md, checked over the
wire against any coordinator.

Cases run in the order listed, each with its own new worker keys, so one case's refusal does not
spoil the next. They change the target — they publish checkpoints, queue tasks, credit and slash
made-up work, eject and ban keys, and (last) exhaust the registration rate limit — so run the
suite against a deployment made for it, never against a network in use.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Awaitable, Callable, Sequence

import blake3
import grpc
from google.protobuf import timestamp_pb2
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2

from rollnet.sdk.checkpoints import CHECKPOINT_DOMAIN
from rollnet.sdk.commitments import verify_receipt
from rollnet.sdk.conformance.ledger import verify_chain
from rollnet.sdk.conformance.suite import (
    Case,
    CaseFailure,
    Report,
    Result,
    Skipped,
    run_cases,
    select,
)
from rollnet.sdk.conformance.target import (
    BAN,
    CHAIN_HEAD,
    DEREGISTER,
    EJECT,
    FAIL_TASK,
    GET_BALANCE,
    GET_CHECKPOINT,
    GET_COMMITMENT,
    GET_NODE,
    HEALTH_WATCH,
    HEARTBEAT,
    LATEST,
    LIST_ENTRIES,
    LIST_NODES,
    PUBLISH,
    PULL_JOB,
    PULL_TASK,
    REGISTER,
    REINSTATE,
    REPORT_PROGRESS,
    REQUEST_ROLLOUTS,
    STREAM_ROLLOUTS,
    SUBMIT,
    VERDICT,
    WATCH,
    Peer,
    Target,
    TargetConfig,
    Work,
    duration,
    new_request_id,
    registration,
    upload_chunk,
    upload_header,
)
from rollnet.sdk.conformance.wire import (
    Tamper,
    Wire,
    describe,
    refusal,
    replace_header,
)
from rollnet.sdk.errors import RollnetError
from rollnet.sdk.identity import Identity, b64url_encode, node_id_from_public_key, verify_signature
from rollnet.sdk.signing import (
    BODY_HASH_HEADER,
    KEY_HEADER,
    NONCE_HEADER,
    SIGNATURE_HEADER,
    SIGNING_HEADERS,
    TIMESTAMP_HEADER,
)
from rollnet.sdk.version import PROTOCOL_MAJOR
from rollnet.v1 import (
    blob_service_pb2,
    checkpoint_pb2,
    checkpoint_service_pb2,
    commitment_pb2,
    commitment_service_pb2,
    common_pb2,
    ledger_pb2,
    ledger_service_pb2,
    node_pb2,
    node_service_pb2,
    rollout_service_pb2,
    task_service_pb2,
    validation_pb2,
    validation_service_pb2,
)

C = grpc.StatusCode
CASES: list[Case[Target]] = []
SUITE = "coordinator"


def case(
    name: str, summary: str, *, timeout: float = 150.0
) -> Callable[[Callable[[Target], Awaitable[None]]], Callable[[Target], Awaitable[None]]]:
    """Add the decorated function to :data:`CASES`."""

    def add(body: Callable[[Target], Awaitable[None]]) -> Callable[[Target], Awaitable[None]]:
        CASES.append(Case(name, summary, body, timeout))
        return body

    return add


def expect(condition: bool, message: str) -> None:
    """Fail the case with ``message`` unless ``condition``."""
    if not condition:
        raise CaseFailure(message)


def _get_node() -> node_service_pb2.GetNodeRequest:
    return node_service_pb2.GetNodeRequest()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _seconds(value: timestamp_pb2.Timestamp) -> float:
    return float(value.seconds) + value.nanos / 1e9


# ============================================================================ health, reflection


@case("health.check", "Health/Check answers SERVING without a signature")
async def health_check(target: Target) -> None:
    status = await target.health()
    expect(
        status == health_pb2.HealthCheckResponse.SERVING,
        f"Health/Check answered {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}",
    )


@case("health.watch", "Health/Watch streams SERVING first, unsigned")
async def health_watch(target: Target) -> None:
    call = target.wire.server_stream(
        HEALTH_WATCH,
        health_pb2.HealthCheckRequest().SerializeToString(),
        [],
        health_pb2.HealthCheckResponse,
        timeout=target.config.call_timeout,
    )
    try:
        async for update in call:
            expect(
                update.status == health_pb2.HealthCheckResponse.SERVING,
                f"the first Watch update is {update.status}, not SERVING",
            )
            return
    finally:
        call.cancel()
    raise CaseFailure("Health/Watch ended without an update")


def _reflection_services(response: bytes) -> list[str]:
    """Service names of a ServerReflectionResponse's list_services_response (field 6), decoded
    by hand so that the suite needs no reflection package."""

    def fields(data: bytes) -> list[tuple[int, bytes | int]]:
        out: list[tuple[int, bytes | int]] = []
        i = 0
        while i < len(data):
            key, i = _varint(data, i)
            number, kind = key >> 3, key & 7
            if kind == 0:
                value, i = _varint(data, i)
                out.append((number, value))
            elif kind == 2:
                length, i = _varint(data, i)
                out.append((number, data[i : i + length]))
                i += length
            else:
                raise CaseFailure(f"reflection answered wire type {kind}, unexpected")
        return out

    names = []
    for number, value in fields(response):
        if number == 6 and isinstance(value, bytes):
            for inner_number, service in fields(value):
                if inner_number == 1 and isinstance(service, bytes):
                    for name_number, name in fields(service):
                        if name_number == 1 and isinstance(name, bytes):
                            names.append(name.decode())
    return names


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


@case("health.reflection", "server reflection lists every rollnet.v1 service, unsigned")
async def reflection(target: Target) -> None:
    wanted = {
        f"rollnet.v1.{name}"
        for name in (
            "NodeService",
            "TaskService",
            "BlobService",
            "CommitmentService",
            "ValidationService",
            "CheckpointService",
            "RolloutService",
            "LedgerService",
        )
    }
    problems = []
    for version in ("v1", "v1alpha"):
        method = f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo"
        call: grpc.aio.StreamStreamMultiCallable[bytes, bytes] = target.wire.channel.stream_stream(
            method, request_serializer=None, response_deserializer=None
        )
        stream = call(iter([b"\x3a\x00"]), timeout=target.config.call_timeout)  # list_services ""
        try:
            async for response in stream:
                names = set(_reflection_services(response))
                missing = wanted - names
                expect(not missing, f"reflection {version} does not list {sorted(missing)}")
                return
        except grpc.aio.AioRpcError as error:
            problems.append(f"{version}: {error.code().name}")
    raise CaseFailure(f"no server reflection answered ({', '.join(problems)})")


# ============================================================================ registration


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


# ============================================================================ authentication


async def _expect_auth(
    target: Target,
    peer: Peer,
    headers: list[tuple[str, str]],
    reason: str,
    what: str,
    body: bytes = b"",
) -> None:
    """A GetNode call (``body``, by default the empty request) with exactly ``headers`` is
    refused UNAUTHENTICATED / ``reason``."""
    try:
        await target.wire.raw_unary(GET_NODE, body, headers, timeout=target.config.call_timeout)
    except RollnetError as error:
        try:
            refusal(error, C.UNAUTHENTICATED, reason)
        except CaseFailure as failure:
            raise CaseFailure(f"{what}: {failure}") from None
        return
    raise CaseFailure(f"{what}: the call was accepted; expected UNAUTHENTICATED/{reason}")


@case("auth.missing", "each signing header absent or empty: SIGNATURE_MISSING")
async def auth_missing(target: Target) -> None:
    peer = await target.shared_worker()
    body = _get_node().SerializeToString()
    for name in SIGNING_HEADERS:
        headers = replace_header(peer.headers(GET_NODE, body), name, None)
        await _expect_auth(target, peer, headers, "SIGNATURE_MISSING", f"without {name}")
        headers = replace_header(peer.headers(GET_NODE, body), name, "")
        await _expect_auth(target, peer, headers, "SIGNATURE_MISSING", f"empty {name}")
    await _expect_auth(target, peer, [], "SIGNATURE_MISSING", "no headers at all")


@case("auth.repeated", "a signing header sent twice: SIGNATURE_MALFORMED")
async def auth_repeated(target: Target) -> None:
    peer = await target.shared_worker()
    body = _get_node().SerializeToString()
    for name in (KEY_HEADER, NONCE_HEADER, SIGNATURE_HEADER):
        headers = peer.headers(GET_NODE, body)
        headers.append((name, dict(headers)[name]))
        await _expect_auth(target, peer, headers, "SIGNATURE_MALFORMED", f"{name} twice")


@case(
    "auth.malformed",
    "undecodable headers (key, signature, timestamp, nonce, digest): SIGNATURE_MALFORMED",
)
async def auth_malformed(target: Target) -> None:
    peer = await target.shared_worker()
    body = _get_node().SerializeToString()
    honest = dict(peer.headers(GET_NODE, body))
    bad = [
        (KEY_HEADER, "not base64url!"),
        (KEY_HEADER, b64url_encode(peer.identity.public_key[:31])),
        (SIGNATURE_HEADER, b64url_encode(os.urandom(63))),
        (SIGNATURE_HEADER, "***"),
        (TIMESTAMP_HEADER, "12x45"),
        (TIMESTAMP_HEADER, "-" + honest[TIMESTAMP_HEADER]),
        (
            NONCE_HEADER,
            honest[NONCE_HEADER].upper()
            if any(c.isalpha() for c in honest[NONCE_HEADER])
            else "ZZ" * 16,
        ),
        (NONCE_HEADER, "00" * 15),
        (BODY_HASH_HEADER, honest[BODY_HASH_HEADER][:60]),
        (BODY_HASH_HEADER, "g" * 64),
    ]
    for name, value in bad:
        headers = replace_header(peer.headers(GET_NODE, body), name, value)
        await _expect_auth(target, peer, headers, "SIGNATURE_MALFORMED", f"{name}: {value!r}")


@case("auth.forged", "a signature by another key, or random bytes: SIGNATURE_INVALID")
async def auth_forged(target: Target) -> None:
    peer = await target.shared_worker()
    body = _get_node().SerializeToString()
    forged = peer.headers(GET_NODE, body, Tamper(signer=Identity.generate()))
    await _expect_auth(target, peer, forged, "SIGNATURE_INVALID", "signed by another key")
    random = replace_header(
        peer.headers(GET_NODE, body), SIGNATURE_HEADER, b64url_encode(os.urandom(64))
    )
    await _expect_auth(target, peer, random, "SIGNATURE_INVALID", "a random signature")


@case("auth.tampered_body", "a body other than the signed one: BODY_HASH_MISMATCH")
async def auth_tampered_body(target: Target) -> None:
    peer = await target.shared_worker()
    body = node_service_pb2.GetNodeRequest(node_id=peer.node_id).SerializeToString()
    signed = _get_node().SerializeToString()
    headers = peer.headers(GET_NODE, body, Tamper(signed_body=signed))
    try:
        await target.wire.raw_unary(GET_NODE, body, headers, timeout=target.config.call_timeout)
    except RollnetError as error:
        refusal(error, C.UNAUTHENTICATED, "BODY_HASH_MISMATCH")
        # The digest header changed to match, the signature still over the old one.
        honest = peer.headers(GET_NODE, body)
        digest = dict(honest)[BODY_HASH_HEADER]
        headers = replace_header(headers, BODY_HASH_HEADER, digest)
        await _expect_auth(
            target, peer, headers, "SIGNATURE_INVALID", "digest header fixed, signature not", body
        )
        return
    raise CaseFailure("a body that does not match its signed digest was accepted")


@case("auth.other_method", "a signature made for another method: SIGNATURE_INVALID")
async def auth_other_method(target: Target) -> None:
    peer = await target.shared_worker()
    body = node_service_pb2.HeartbeatRequest().SerializeToString()  # empty, as GetNode's
    headers = peer.headers(HEARTBEAT, body, Tamper(signed_method=GET_NODE))
    try:
        await target.wire.raw_unary(HEARTBEAT, body, headers, timeout=target.config.call_timeout)
    except RollnetError as error:
        refusal(error, C.UNAUTHENTICATED, "SIGNATURE_INVALID")
        return
    raise CaseFailure("a GetNode signature was accepted for Heartbeat")


@case("auth.replay", "the same signed call twice: the second NONCE_REPLAYED")
async def auth_replay(target: Target) -> None:
    peer = await target.shared_worker()
    body = _get_node().SerializeToString()
    headers = peer.headers(GET_NODE, body)
    await target.wire.raw_unary(GET_NODE, body, headers, timeout=target.config.call_timeout)
    await _expect_auth(target, peer, headers, "NONCE_REPLAYED", "a replayed call")


@case(
    "auth.replay_after_restart",
    "a call replayed after the target restarted: NONCE_REPLAYED",
    timeout=240.0,
)
async def auth_replay_after_restart(target: Target) -> None:
    if target.config.restart is None:
        raise Skipped("needs a restart hook (--restart-command)")
    peer = await target.shared_worker()
    body = _get_node().SerializeToString()
    headers = peer.headers(GET_NODE, body)
    await target.wire.raw_unary(GET_NODE, body, headers, timeout=target.config.call_timeout)
    await target.restart()
    await _expect_auth(target, peer, headers, "NONCE_REPLAYED", "replayed after a restart")


@case(
    "auth.replay_other_replica", "a call replayed at another replica of the target: NONCE_REPLAYED"
)
async def auth_replay_other_replica(target: Target) -> None:
    if target.config.replica is None:
        raise Skipped("needs the address of another replica (--replica HOST:PORT)")
    peer = await target.shared_worker()
    body = _get_node().SerializeToString()
    headers = peer.headers(GET_NODE, body)
    await target.wire.raw_unary(GET_NODE, body, headers, timeout=target.config.call_timeout)
    other = Wire(target.config.replica, tls=target.config.tls)
    try:
        await other.raw_unary(GET_NODE, body, headers, timeout=target.config.call_timeout)
    except RollnetError as error:
        try:
            refusal(error, C.UNAUTHENTICATED, "NONCE_REPLAYED")
        except CaseFailure as failure:
            raise CaseFailure(f"replayed at the other replica: {failure}") from None
        return
    finally:
        await other.close()
    raise CaseFailure("a call replayed at another replica was accepted")


@case("auth.clock_skew", "a timestamp 5 minutes off either way: TIMESTAMP_SKEW")
async def auth_clock_skew(target: Target) -> None:
    peer = await target.shared_worker()
    body = _get_node().SerializeToString()
    for offset in (-300_000, 300_000):
        headers = peer.headers(GET_NODE, body, Tamper(timestamp_ms=_now_ms() + offset))
        await _expect_auth(target, peer, headers, "TIMESTAMP_SKEW", f"{offset // 1000:+d} s")


@case("auth.audience", "a call signed for another network: AUDIENCE_MISMATCH")
async def auth_audience(target: Target) -> None:
    peer = await target.shared_worker()
    body = _get_node().SerializeToString()
    headers = peer.headers(GET_NODE, body, Tamper(audience=target.config.network_id + "-other"))
    await _expect_auth(target, peer, headers, "AUDIENCE_MISMATCH", "another network")


@case("auth.unknown_key", "a well-signed call from an unregistered key: UNKNOWN_KEY")
async def auth_unknown_key(target: Target) -> None:
    peer = Peer(target, Identity.generate(), common_pb2.ROLE_WORKER)
    await peer.refused(GET_NODE, _get_node(), C.UNAUTHENTICATED, "UNKNOWN_KEY")


@case(
    "auth.strict_ed25519", "a small-order key with the all-verifying signature: SIGNATURE_INVALID"
)
async def auth_strict_ed25519(target: Target) -> None:
    # The identity point as the key, R = identity and S = 0: a lenient (RFC 8032-only) verifier
    # accepts this for every message; a strict one (protocol.md, step 6) refuses it.
    identity_point = b"\x01" + b"\x00" * 31
    signature = identity_point + b"\x00" * 32
    peer = Peer(target, Identity.generate(), common_pb2.ROLE_WORKER)
    body = _get_node().SerializeToString()
    headers = replace_header(
        replace_header(peer.headers(GET_NODE, body), KEY_HEADER, b64url_encode(identity_point)),
        SIGNATURE_HEADER,
        b64url_encode(signature),
    )
    await _expect_auth(target, peer, headers, "SIGNATURE_INVALID", "the small-order key")


@case(
    "auth.role_not_allowed",
    "a worker calling trainer, validator and operator RPCs: ROLE_NOT_ALLOWED",
)
async def auth_role_not_allowed(target: Target) -> None:
    peer = await target.shared_worker()
    calls: list[tuple[str, Message]] = [
        (PUBLISH, checkpoint_service_pb2.PublishCheckpointRequest()),
        (REQUEST_ROLLOUTS, rollout_service_pb2.RequestRolloutsRequest()),
        (PULL_JOB, validation_service_pb2.PullValidationJobRequest()),
        (LIST_NODES, node_service_pb2.ListNodesRequest()),
        (EJECT, node_service_pb2.EjectNodeRequest()),
    ]
    for method, request in calls:
        try:
            await peer.refused(method, request, C.PERMISSION_DENIED, "ROLE_NOT_ALLOWED")
        except CaseFailure as failure:
            raise CaseFailure(f"{method}: {failure}") from None


@case("auth.banned", "a banned key is refused everywhere: NODE_BANNED")
async def auth_banned(target: Target) -> None:
    operator = await target.peer("operator")
    worker = await target.worker()
    await operator.call(
        BAN,
        node_service_pb2.BanNodeRequest(
            request_id=new_request_id(), node_id=worker.node_id, reason="conformance"
        ),
        node_service_pb2.BanNodeResponse,
    )
    await worker.refused(GET_NODE, _get_node(), C.PERMISSION_DENIED, "NODE_BANNED")
    await worker.refused(
        HEARTBEAT, node_service_pb2.HeartbeatRequest(), C.PERMISSION_DENIED, "NODE_BANNED"
    )
    await worker.refused(
        REGISTER, registration(worker.identity, worker.role), C.PERMISSION_DENIED, "NODE_BANNED"
    )
    await operator.refused(
        REINSTATE,
        node_service_pb2.ReinstateNodeRequest(request_id=new_request_id(), node_id=worker.node_id),
        C.PERMISSION_DENIED,
        "NODE_BANNED",
    )


# ============================================================================ nodes and heartbeats


@case("node.heartbeat", "a heartbeat makes a registered node ACTIVE and grants an interval")
async def node_heartbeat(target: Target) -> None:
    worker = await target.worker(heartbeat=False)
    beat = await worker.heartbeat()
    expect(
        beat.state == node_pb2.Node.STATE_ACTIVE,
        f"after a heartbeat the node is {node_pb2.Node.State.Name(beat.state)}, not ACTIVE",
    )
    expect(beat.heartbeat_interval.ToTimedelta().total_seconds() > 0, "no heartbeat_interval")
    expect(abs(_seconds(beat.server_time) - time.time()) < 60, "server_time is more than 60 s off")
    node = await worker.call(GET_NODE, _get_node(), node_service_pb2.GetNodeResponse)
    expect(node.node.node_id == worker.node_id, "GetNode without a node id is not the caller")
    expect(node.node.state == node_pb2.Node.STATE_ACTIVE, "GetNode does not say ACTIVE")


@case(
    "node.deregistered", "after DeregisterNode: heartbeat DEREGISTERED + reregister, work refused"
)
async def node_deregistered(target: Target) -> None:
    worker = await target.worker()
    await worker.call(
        DEREGISTER,
        node_service_pb2.DeregisterNodeRequest(request_id=new_request_id(), reason="conformance"),
        node_service_pb2.DeregisterNodeResponse,
    )
    beat = await worker.heartbeat()
    expect(
        beat.state == node_pb2.Node.STATE_DEREGISTERED,
        f"a deregistered node's heartbeat says {node_pb2.Node.State.Name(beat.state)}",
    )
    expect(
        any(command.HasField("reregister") for command in beat.commands),
        "a deregistered node's heartbeat carries no ReregisterCommand",
    )
    await worker.refused(
        PULL_TASK,
        task_service_pb2.PullTaskRequest(request_id=new_request_id()),
        C.FAILED_PRECONDITION,
        "NODE_DEREGISTERED",
    )
    await target.register(worker)
    beat = await worker.heartbeat()
    expect(beat.state == node_pb2.Node.STATE_ACTIVE, "registering again did not bring it back")


@case("node.ejected", "an ejected node: heartbeat EJECTED + drain, work NODE_EJECTED, reinstate")
async def node_ejected(target: Target) -> None:
    operator = await target.peer("operator")
    worker = await target.worker()
    await operator.call(
        EJECT,
        node_service_pb2.EjectNodeRequest(
            request_id=new_request_id(), node_id=worker.node_id, reason="conformance"
        ),
        node_service_pb2.EjectNodeResponse,
    )
    beat = await worker.heartbeat()
    expect(
        beat.state == node_pb2.Node.STATE_EJECTED,
        f"an ejected node's heartbeat says {node_pb2.Node.State.Name(beat.state)}",
    )
    expect(
        any(command.HasField("drain") for command in beat.commands),
        "an ejected node's heartbeat carries no DrainCommand",
    )
    await worker.refused(
        PULL_TASK,
        task_service_pb2.PullTaskRequest(request_id=new_request_id()),
        C.PERMISSION_DENIED,
        "NODE_EJECTED",
    )
    again = await target.register(worker)
    expect(
        again.node.state == node_pb2.Node.STATE_EJECTED,
        "registering again lifted the ejection",
    )
    reinstated = await operator.call(
        REINSTATE,
        node_service_pb2.ReinstateNodeRequest(request_id=new_request_id(), node_id=worker.node_id),
        node_service_pb2.ReinstateNodeResponse,
    )
    expect(
        reinstated.node.state == node_pb2.Node.STATE_OFFLINE,
        f"a reinstated node is {node_pb2.Node.State.Name(reinstated.node.state)}, not OFFLINE",
    )
    beat = await worker.heartbeat()
    expect(beat.state == node_pb2.Node.STATE_ACTIVE, "a reinstated node's heartbeat is not ACTIVE")


@case("node.others", "a worker reading another node: ROLE_NOT_ALLOWED; the operator may")
async def node_others(target: Target) -> None:
    worker = await target.worker()
    other = await target.worker()
    await worker.refused(
        GET_NODE,
        node_service_pb2.GetNodeRequest(node_id=other.node_id),
        C.PERMISSION_DENIED,
        "ROLE_NOT_ALLOWED",
    )
    operator = await target.peer("operator")
    read = await operator.call(
        GET_NODE,
        node_service_pb2.GetNodeRequest(node_id=other.node_id),
        node_service_pb2.GetNodeResponse,
    )
    expect(read.node.node_id == other.node_id, "the operator's GetNode answered another node")
    unchanged = await operator.call(
        REINSTATE,
        node_service_pb2.ReinstateNodeRequest(request_id=new_request_id(), node_id=other.node_id),
        node_service_pb2.ReinstateNodeResponse,
    )
    expect(
        unchanged.node.state == read.node.state,
        "ReinstateNode changed a node that was not ejected",
    )


@case("node.operator_self", "an operator ejecting or banning its own key: INVALID_FIELDS node_id")
async def node_operator_self(target: Target) -> None:
    operator = await target.peer("operator")
    for method, request in (
        (
            EJECT,
            node_service_pb2.EjectNodeRequest(
                request_id=new_request_id(), node_id=operator.node_id
            ),
        ),
        (
            BAN,
            node_service_pb2.BanNodeRequest(request_id=new_request_id(), node_id=operator.node_id),
        ),
    ):
        await operator.refused(
            method, request, C.INVALID_ARGUMENT, "INVALID_FIELDS", field="node_id"
        )


@case("node.list", "ListNodes (operator) lists a registered worker; GetNode of an unknown id")
async def node_list(target: Target) -> None:
    operator = await target.peer("operator")
    worker = await target.worker()
    found = False
    token = ""
    for _ in range(1000):
        page = await operator.call(
            LIST_NODES,
            node_service_pb2.ListNodesRequest(
                page_size=500, page_token=token, role=common_pb2.ROLE_WORKER
            ),
            node_service_pb2.ListNodesResponse,
        )
        found = found or any(node.node_id == worker.node_id for node in page.nodes)
        token = page.next_page_token
        if found or not token:
            break
    expect(found, f"ListNodes(role=worker) does not list worker {worker.node_id}")
    await operator.refused(
        GET_NODE,
        node_service_pb2.GetNodeRequest(node_id=os.urandom(16).hex()),
        C.NOT_FOUND,
        "NODE_NOT_FOUND",
    )


# ============================================================================ dispatch


@case(
    "dispatch.long_poll",
    "PullTask with nothing to do returns after about its wait, with retry_after",
)
async def dispatch_long_poll(target: Target) -> None:
    worker = await target.shared_worker()
    start = time.monotonic()
    pulled = await worker.call(
        PULL_TASK,
        task_service_pb2.PullTaskRequest(
            request_id=new_request_id(), wait=duration(1.0), environments=["conformance-none"]
        ),
        task_service_pb2.PullTaskResponse,
        timeout=1.0 + target.config.call_timeout,
    )
    took = time.monotonic() - start
    expect(not pulled.HasField("task"), "a task of an environment nobody serves was leased")
    expect(took < 6.0, f"a 1 s long poll took {took:.1f} s")
    expect(pulled.retry_after.ToTimedelta().total_seconds() > 0, "no retry_after with no work")


@case(
    "dispatch.lease", "a leased task: lease id, fencing token = attempt, deadline = lease_duration"
)
async def dispatch_lease(target: Target) -> None:
    worker = await target.worker()
    task, lease = await target.lease(worker)
    assert worker.registration is not None
    expect(lease.fencing_token >= 1, "fencing token below 1")
    expect(task.attempt == lease.fencing_token, "the fencing token is not the task's attempt")
    expect(task.state == task.STATE_LEASED, "a leased task is not LEASED")
    granted = _seconds(lease.deadline) - _seconds(lease.issued_at)
    wanted = worker.registration.lease_duration.ToTimedelta().total_seconds()
    expect(
        abs(granted - wanted) <= 1.0,
        f"deadline - issued_at is {granted:.1f} s, lease_duration {wanted:.1f} s",
    )
    beat = await worker.heartbeat(lease.lease_id)
    statuses = {status.lease_id: status for status in beat.leases}
    expect(lease.lease_id in statuses, "the heartbeat does not answer for the held lease")
    expect(statuses[lease.lease_id].valid, "a live lease is reported invalid")
    expect(
        _seconds(statuses[lease.lease_id].deadline) >= _seconds(lease.deadline) - 0.001,
        "a heartbeat moved the lease deadline earlier",
    )
    progress = await worker.call(
        REPORT_PROGRESS,
        task_service_pb2.ReportProgressRequest(
            lease_id=lease.lease_id, fencing_token=lease.fencing_token, total_rollouts=1
        ),
        task_service_pb2.ReportProgressResponse,
    )
    expect(progress.HasField("deadline"), "ReportProgress answers no deadline")


@case("dispatch.pull_request_id", "a PullTask retried with its request id returns the same lease")
async def dispatch_pull_request_id(target: Target) -> None:
    worker = await target.worker()
    await target.request_tasks()
    request_id = new_request_id()
    first = await worker.pull(request_id=request_id)
    expect(first.HasField("task"), "a task was queued, yet PullTask leased none")
    again = await worker.pull(request_id=request_id)
    expect(
        again.lease.lease_id == first.lease.lease_id,
        f"the retry leased {again.lease.lease_id!r}, not {first.lease.lease_id!r}",
    )


@case("dispatch.lease_cap", "a worker at its max_concurrent_leases gets no task, with retry_after")
async def dispatch_lease_cap(target: Target) -> None:
    worker = Peer(target, Identity.generate(), common_pb2.ROLE_WORKER)
    await target.register(
        worker,
        registration(
            worker.identity,
            worker.role,
            capabilities=node_pb2.Capabilities(max_concurrent_leases=1),
        ),
    )
    await worker.heartbeat()
    await target.lease(worker)
    await target.request_tasks()
    pulled = await worker.pull(wait=1.0)
    expect(not pulled.HasField("task"), "a second lease past max_concurrent_leases = 1")
    expect(pulled.retry_after.ToTimedelta().total_seconds() > 0, "no retry_after at the cap")
    # Take the queued task off the queue so that later cases lease their own.
    other = await target.worker()
    extra = await other.pull(wait=2.0)
    if extra.HasField("task"):
        await target.commit(other, target.work(other, extra.task, extra.lease))


@case("dispatch.fail_requeue", "FailTask requeues the task: another worker leases it, token + 1")
async def dispatch_fail_requeue(target: Target) -> None:
    first = await target.worker()
    task, lease = await target.lease(first)
    request = task_service_pb2.FailTaskRequest(
        request_id=new_request_id(),
        lease_id=lease.lease_id,
        fencing_token=lease.fencing_token,
        reason=task_service_pb2.FAIL_REASON_BACKEND_ERROR,
        message="conformance",
    )
    failed = await first.call(FAIL_TASK, request, task_service_pb2.FailTaskResponse)
    expect(failed.requeued, "a first attempt's FailTask did not requeue the task")
    repeat = await first.call(FAIL_TASK, request, task_service_pb2.FailTaskResponse)
    expect(repeat.requeued == failed.requeued, "a FailTask retried with its request id differs")
    await _lease_again(target, task.task_id, lease.fencing_token)


async def _lease_again(target: Target, task_id: str, old_token: int) -> None:
    """Another worker leases ``task_id`` again, with a higher fencing token."""
    other = await target.worker()
    for _ in range(50):
        pulled = await other.pull(wait=2.0)
        if not pulled.HasField("task"):
            break
        if pulled.task.task_id != task_id:
            # A task an earlier case left (its lease ran out): finish it, so it leaves the
            # queue and does not hold one of this worker's leases.
            await target.commit(other, target.work(other, pulled.task, pulled.lease))
            continue
        token = pulled.lease.fencing_token
        expect(token > old_token, f"the new lease's fencing token {token} is not above {old_token}")
        return
    raise CaseFailure(f"task {task_id} was not leased again")


@case("dispatch.fencing", "a commitment with another fencing token: FENCING_TOKEN_STALE")
async def dispatch_fencing(target: Target) -> None:
    worker = await target.worker()
    task, lease = await target.lease(worker)
    for token in (lease.fencing_token + 1, lease.fencing_token - 1):
        # The batch names the same token as the commitment: only the lease check can object.
        work = target.work(worker, task, lease, fencing_token=token)
        uploaded = await worker.upload(work.batch)
        request = target.commitment(worker, work, uploaded.blob)
        await worker.refused(
            SUBMIT, request, C.FAILED_PRECONDITION, "FENCING_TOKEN_STALE", what=f"token {token}"
        )


@case(
    "dispatch.duplicate_submit",
    "a commitment retried (same or new request id) answers the original receipt",
)
async def dispatch_duplicate_submit(target: Target) -> None:
    worker = await target.worker()
    task, lease = await target.lease(worker)
    work = target.work(worker, task, lease)
    uploaded = await worker.upload(work.batch)
    request = target.commitment(worker, work, uploaded.blob)
    first = await worker.call(SUBMIT, request, commitment_service_pb2.SubmitCommitmentResponse)
    again = await worker.call(SUBMIT, request, commitment_service_pb2.SubmitCommitmentResponse)
    expect(
        again.commitment.commitment_id == first.commitment.commitment_id
        and again.receipt.signature == first.receipt.signature,
        "a retry with the same request id answered another commitment or receipt",
    )
    request.request_id = new_request_id()
    third = await worker.call(SUBMIT, request, commitment_service_pb2.SubmitCommitmentResponse)
    expect(
        third.commitment.commitment_id == first.commitment.commitment_id,
        "the same work under a new request id made a second commitment",
    )
    changed = target.commitment(worker, work, uploaded.blob)
    changed.request_id = request.request_id
    changed.claimed_work.decode_tokens += 1
    await worker.refused(SUBMIT, changed, C.FAILED_PRECONDITION, "REQUEST_ID_REUSED")


def _lease_seconds(target: Target, worker: Peer) -> float:
    """The lease duration the target announced, or skip when waiting it out takes too long."""
    assert worker.registration is not None
    seconds = worker.registration.lease_duration.ToTimedelta().total_seconds()
    if seconds + 5 > target.config.max_wait:
        raise Skipped(
            f"lease_duration is {seconds:g} s; waiting it out needs --max-wait {seconds + 5:g}"
        )
    return seconds


async def _expired_lease(target: Target) -> tuple[Peer, Work, common_pb2.BlobRef]:
    """A worker whose lease ran out (0.5 s ago), with its uploaded batch."""
    worker = await target.worker()
    _lease_seconds(target, worker)
    task, lease = await target.lease(worker)
    work = target.work(worker, task, lease)
    uploaded = await worker.upload(work.batch)
    await asyncio.sleep(max(0.0, _seconds(lease.deadline) - time.time()) + 0.5)
    return worker, work, uploaded.blob


@case(
    "dispatch.lease_expiry", "a commitment after the lease deadline: LEASE_EXPIRED", timeout=180.0
)
async def dispatch_lease_expiry(target: Target) -> None:
    worker, work, blob = await _expired_lease(target)
    beat = await worker.heartbeat(work.lease.lease_id)
    expect(
        not any(s.valid for s in beat.leases if s.lease_id == work.lease.lease_id),
        "a heartbeat still calls an expired lease valid",
    )
    await worker.refused(
        SUBMIT,
        target.commitment(worker, work, blob),
        C.FAILED_PRECONDITION,
        "LEASE_EXPIRED",
        what="a commitment 0.5 s after the deadline",
    )


@case(
    "dispatch.requeue",
    "an expired lease's task is leased again, token + 1; the old lease: FENCING_TOKEN_STALE",
    timeout=180.0,
)
async def dispatch_requeue(target: Target) -> None:
    worker, work, blob = await _expired_lease(target)
    await _lease_again(target, work.task.task_id, work.lease.fencing_token)
    await worker.refused(
        SUBMIT,
        target.commitment(worker, work, blob),
        C.FAILED_PRECONDITION,
        "FENCING_TOKEN_STALE",
        what="the old holder's commitment after the task was leased again",
    )


# ============================================================================ blobs


@case(
    "blob.roundtrip",
    "an uploaded batch reads back byte for byte; a second upload is already_present",
)
async def blob_roundtrip(target: Target) -> None:
    worker = await target.worker()
    data = os.urandom(3000)
    first = await worker.upload(data)
    expect(
        first.blob.size == len(data), f"the BlobRef says {first.blob.size} bytes, not {len(data)}"
    )
    expect(not first.already_present, "new content reported already_present")
    again = await worker.upload(data)
    expect(again.already_present, "the same content uploaded twice is not already_present")
    back = await worker.get_blob(first.blob.blake3)
    expect(back == data, f"GetBlob returned {len(back)} bytes that differ from the upload")
    part = await worker.get_blob(first.blob.blake3, offset=1000, length=500)
    expect(part == data[1000:1500], "GetBlob(offset 1000, length 500) is not those bytes")
    tail = await worker.get_blob(first.blob.blake3, offset=2900)
    expect(tail == data[2900:], "GetBlob(offset 2900, length 0) is not the rest of the blob")


@case("blob.hash_mismatch", "bytes that do not hash to the declared digest: BLOB_HASH_MISMATCH")
async def blob_hash_mismatch(target: Target) -> None:
    worker = await target.shared_worker()
    data = os.urandom(1000)
    other = os.urandom(1000)
    try:
        await worker.upload_messages([upload_header(data), upload_chunk(other)])
    except RollnetError as error:
        refusal(error, C.INVALID_ARGUMENT, "BLOB_HASH_MISMATCH")
        return
    raise CaseFailure("an upload whose bytes do not hash to the declared digest was accepted")


@case("blob.size_mismatch", "fewer or more bytes than declared: BLOB_SIZE_MISMATCH")
async def blob_size_mismatch(target: Target) -> None:
    worker = await target.shared_worker()
    data = os.urandom(1000)
    for declared in (len(data) + 1, len(data) - 1):
        try:
            await worker.upload_messages([upload_header(data, size=declared), upload_chunk(data)])
        except RollnetError as error:
            refusal(error, C.INVALID_ARGUMENT, "BLOB_SIZE_MISMATCH")
            continue
        raise CaseFailure(f"{len(data)} bytes declared as {declared} were accepted")


@case("blob.size_cap", "a header declaring 2^62 bytes: BLOB_TOO_LARGE, before any byte")
async def blob_size_cap(target: Target) -> None:
    worker = await target.shared_worker()
    try:
        await worker.upload_messages([upload_header(b"x", size=1 << 62)])
    except RollnetError as error:
        refusal(error, C.RESOURCE_EXHAUSTED, "BLOB_TOO_LARGE")
        return
    raise CaseFailure("a header declaring 2^62 bytes was accepted")


@case("blob.header", "a stream starting with a chunk, or with two headers: BLOB_HEADER_INVALID")
async def blob_header(target: Target) -> None:
    worker = await target.shared_worker()
    data = os.urandom(100)
    for what, messages in (
        ("a chunk first", [upload_chunk(data)]),
        ("two headers", [upload_header(data), upload_header(data), upload_chunk(data)]),
    ):
        try:
            await worker.upload_messages(messages)
        except RollnetError as error:
            try:
                refusal(error, C.INVALID_ARGUMENT, "BLOB_HEADER_INVALID")
            except CaseFailure as failure:
                raise CaseFailure(f"{what}: {failure}") from None
            continue
        raise CaseFailure(f"an upload with {what} was accepted")


@case("blob.worker_shard", "a worker uploading a checkpoint shard: ROLE_NOT_ALLOWED")
async def blob_worker_shard(target: Target) -> None:
    worker = await target.shared_worker()
    try:
        await worker.upload(os.urandom(100), blob_service_pb2.BLOB_KIND_CHECKPOINT_SHARD)
    except RollnetError as error:
        refusal(error, C.PERMISSION_DENIED, "ROLE_NOT_ALLOWED")
        return
    raise CaseFailure("a worker's checkpoint shard was accepted")


@case("blob.not_found", "GetBlob of a digest nobody uploaded: BLOB_NOT_FOUND")
async def blob_not_found(target: Target) -> None:
    worker = await target.shared_worker()
    try:
        await worker.get_blob(os.urandom(32))
    except RollnetError as error:
        refusal(error, C.NOT_FOUND, "BLOB_NOT_FOUND")
        return
    raise CaseFailure("GetBlob of an unknown digest answered content")


@case(
    "blob.quota",
    "uploads past the node's quota: UPLOAD_QUOTA_EXCEEDED from the header, no RetryInfo",
)
async def blob_quota(target: Target) -> None:
    quota = target.config.upload_quota_bytes
    if quota is None:
        raise Skipped("needs the target's upload quota (--upload-quota-bytes)")
    if quota > 64 << 20:
        raise Skipped(f"filling a quota of {quota} bytes takes too long; use at most 64 MiB")
    worker = await target.worker()
    chunk = 1 << 20
    stored = 0
    while stored <= quota:
        data = os.urandom(min(chunk, quota + 1 - stored) or 1)
        try:
            await worker.upload(data)
        except RollnetError as error:
            refusal(error, C.RESOURCE_EXHAUSTED, "UPLOAD_QUOTA_EXCEEDED")
            expect(error.retry_after is None, "UPLOAD_QUOTA_EXCEEDED carries a RetryInfo")
            expect(stored + len(data) > quota, f"refused at {stored + len(data)} of {quota} bytes")
            return
        stored += len(data)
    raise CaseFailure(f"{stored} bytes nothing references were accepted under a quota of {quota}")


# ============================================================================ commitments


@case(
    "commitment.receipt",
    "a commitment's receipt verifies with the coordinator key; GetCommitment reads it",
)
async def commitment_receipt(target: Target) -> None:
    worker = await target.worker()
    work, response = await target.committed(worker)
    key = await target.coordinator_public_key()
    expect(verify_receipt(response.receipt, key), "the receipt's signature does not verify")
    expect(
        bytes(response.receipt.coordinator_public_key) == key,
        "the receipt names another coordinator key than registration announced",
    )
    commitment = response.commitment
    expect(commitment.node_id == worker.node_id, "the commitment names another node")
    expect(commitment.task_id == work.task.task_id, "the commitment names another task")
    read = await worker.call(
        GET_COMMITMENT,
        commitment_service_pb2.GetCommitmentRequest(commitment_id=commitment.commitment_id),
        commitment_service_pb2.GetCommitmentResponse,
    )
    expect(
        read.commitment.binding_digest == commitment.binding_digest,
        "GetCommitment answers another binding digest",
    )
    await worker.refused(
        GET_COMMITMENT,
        commitment_service_pb2.GetCommitmentRequest(commitment_id="conformance-none"),
        C.NOT_FOUND,
        "COMMITMENT_NOT_FOUND",
    )


@case(
    "commitment.others",
    "a worker reading another node's commitment: ROLE_NOT_ALLOWED; a validator may",
)
async def commitment_others(target: Target) -> None:
    owner = await target.worker()
    other = await target.worker()
    _, response = await target.committed(owner)
    request = commitment_service_pb2.GetCommitmentRequest(
        commitment_id=response.commitment.commitment_id
    )
    await other.refused(GET_COMMITMENT, request, C.PERMISSION_DENIED, "ROLE_NOT_ALLOWED")
    validator = await target.peer("validator")
    read = await validator.call(
        GET_COMMITMENT, request, commitment_service_pb2.GetCommitmentResponse
    )
    expect(read.commitment.node_id == owner.node_id, "the validator read another commitment")


@case(
    "commitment.claimed_work",
    "claimed_work is the coordinator's count of the batch, whatever the node claimed",
)
async def commitment_claimed_work(target: Target) -> None:
    worker = await target.worker()
    task, lease = await target.lease(worker)
    work = target.work(worker, task, lease)
    uploaded = await worker.upload(work.batch)
    request = target.commitment(worker, work, uploaded.blob)
    counted = commitment_pb2.WorkClaim()
    counted.CopyFrom(request.claimed_work)
    request.claimed_work.decode_tokens += 1_000_000
    response = await worker.call(SUBMIT, request, commitment_service_pb2.SubmitCommitmentResponse)
    for shown, where in (
        (response.commitment.claimed_work, "SubmitCommitment"),
        (
            (
                await worker.call(
                    GET_COMMITMENT,
                    commitment_service_pb2.GetCommitmentRequest(
                        commitment_id=response.commitment.commitment_id
                    ),
                    commitment_service_pb2.GetCommitmentResponse,
                )
            ).commitment.claimed_work,
            "GetCommitment",
        ),
    ):
        expect(
            (shown.prefill_tokens, shown.decode_tokens)
            == (counted.prefill_tokens, counted.decode_tokens),
            f"{where} shows claimed_work {shown.prefill_tokens} + {shown.decode_tokens}, the "
            f"batch holds {counted.prefill_tokens} + {counted.decode_tokens} tokens",
        )


@case("commitment.binding", "a binding digest made for another node: COMMITMENT_BINDING_INVALID")
async def commitment_binding(target: Target) -> None:
    worker = await target.worker()
    task, lease = await target.lease(worker)
    work = target.work(worker, task, lease)
    uploaded = await worker.upload(work.batch)
    request = target.commitment(worker, work, uploaded.blob, binding_node=os.urandom(16).hex())
    await worker.refused(SUBMIT, request, C.INVALID_ARGUMENT, "COMMITMENT_BINDING_INVALID")


@case("commitment.blob_missing", "a commitment naming a blob never uploaded: BLOB_NOT_FOUND")
async def commitment_blob_missing(target: Target) -> None:
    worker = await target.worker()
    task, lease = await target.lease(worker)
    work = target.work(worker, task, lease)
    blob = common_pb2.BlobRef(blake3=blake3.blake3(work.batch).digest(), size=len(work.batch))
    await worker.refused(
        SUBMIT, target.commitment(worker, work, blob), C.NOT_FOUND, "BLOB_NOT_FOUND"
    )


@case("commitment.others_lease", "a worker committing under another node's lease: LEASE_NOT_FOUND")
async def commitment_others_lease(target: Target) -> None:
    owner = await target.worker()
    thief = await target.worker()
    task, lease = await target.lease(owner)
    work = target.work(thief, task, lease)
    uploaded = await thief.upload(work.batch)
    await thief.refused(
        SUBMIT, target.commitment(thief, work, uploaded.blob), C.NOT_FOUND, "LEASE_NOT_FOUND"
    )


@case(
    "commitment.others_blob",
    "a worker naming another node's batch under its own lease: ROLLOUT_BATCH_INVALID",
)
async def commitment_others_blob(target: Target) -> None:
    owner = await target.worker()
    thief = await target.worker()
    owner_task, owner_lease = await target.lease(owner)
    owner_work = target.work(owner, owner_task, owner_lease)
    uploaded = await owner.upload(owner_work.batch)
    task, lease = await target.lease(thief)
    work = target.work(thief, task, lease)
    await thief.refused(
        SUBMIT,
        target.commitment(thief, work, uploaded.blob),
        C.INVALID_ARGUMENT,
        "ROLLOUT_BATCH_INVALID",
    )


@case("commitment.rollout_count", "a batch with a rollout too many: ROLLOUT_BATCH_INVALID")
async def commitment_rollout_count(target: Target) -> None:
    worker = await target.worker()
    task, lease = await target.lease(worker)
    wanted = len(task.prompt_ids) * task.samples_per_prompt
    work = target.work(worker, task, lease, rollouts=wanted + 1)
    uploaded = await worker.upload(work.batch)
    await worker.refused(
        SUBMIT,
        target.commitment(worker, work, uploaded.blob),
        C.INVALID_ARGUMENT,
        "ROLLOUT_BATCH_INVALID",
        "INVALID_FIELDS",
    )


# ============================================================================ validation


@case(
    "validation.accept",
    "ACCEPT credits the worker: commitment ACCEPTED, a credit entry, the balance",
)
async def validation_accept(target: Target) -> None:
    validator = await target.peer("validator")
    worker = await target.worker()
    _, response = await target.committed(worker)
    commitment_id = response.commitment.commitment_id
    pulled = await target.job_for(validator, commitment_id)
    expect(pulled.job.network_id == target.config.network_id, "the job names another network")
    expect(pulled.job.task.task_id == response.commitment.task_id, "the job carries another task")
    verdict = await validator.call(
        VERDICT, target.verdict(pulled, accept=True), validation_service_pb2.SubmitVerdictResponse
    )
    expect(verdict.verdict.decision == validation_pb2.Verdict.DECISION_ACCEPT, "not ACCEPT")
    expect(verdict.verdict.work_units >= 0, "negative work units")
    read = await worker.call(
        GET_COMMITMENT,
        commitment_service_pb2.GetCommitmentRequest(commitment_id=commitment_id),
        commitment_service_pb2.GetCommitmentResponse,
    )
    expect(
        read.commitment.state == commitment_pb2.Commitment.STATE_ACCEPTED,
        f"an accepted commitment is {commitment_pb2.Commitment.State.Name(read.commitment.state)}",
    )
    expect(read.commitment.validated, "an accepted, checked commitment is not validated")
    entries = await _entries(worker, worker.node_id)
    credits = [e for e in entries if e.commitment_id == commitment_id]
    expect(len(credits) == 1, f"{len(credits)} ledger entries for the accepted commitment, not 1")
    balance = await worker.call(
        GET_BALANCE,
        ledger_service_pb2.GetBalanceRequest(node_id=worker.node_id),
        ledger_service_pb2.GetBalanceResponse,
    )
    expect(
        balance.balance == sum(e.amount for e in entries),
        f"GetBalance says {balance.balance}, the node's entries sum to "
        f"{sum(e.amount for e in entries)}",
    )


@case("validation.reject", "REJECT slashes the worker: commitment REJECTED, a negative entry")
async def validation_reject(target: Target) -> None:
    validator = await target.peer("validator")
    worker = await target.worker()
    _, response = await target.committed(worker)
    commitment_id = response.commitment.commitment_id
    pulled = await target.job_for(validator, commitment_id)
    await validator.call(
        VERDICT, target.verdict(pulled, accept=False), validation_service_pb2.SubmitVerdictResponse
    )
    read = await worker.call(
        GET_COMMITMENT,
        commitment_service_pb2.GetCommitmentRequest(commitment_id=commitment_id),
        commitment_service_pb2.GetCommitmentResponse,
    )
    expect(
        read.commitment.state == commitment_pb2.Commitment.STATE_REJECTED,
        f"a rejected commitment is {commitment_pb2.Commitment.State.Name(read.commitment.state)}",
    )
    entries = [
        e for e in await _entries(worker, worker.node_id) if e.commitment_id == commitment_id
    ]
    expect(len(entries) == 1 and entries[0].amount < 0, "the reject left no negative entry")


@case(
    "validation.one_verdict",
    "a second verdict on a job: VERDICT_ALREADY_RECORDED; a retry: the first",
)
async def validation_one_verdict(target: Target) -> None:
    validator = await target.peer("validator")
    worker = await target.worker()
    _, response = await target.committed(worker)
    pulled = await target.job_for(validator, response.commitment.commitment_id)
    request = target.verdict(pulled, accept=True)
    first = await validator.call(VERDICT, request, validation_service_pb2.SubmitVerdictResponse)
    again = await validator.call(VERDICT, request, validation_service_pb2.SubmitVerdictResponse)
    expect(
        again.verdict.verdict_id == first.verdict.verdict_id,
        "a verdict retried with its request id answered another verdict",
    )
    other = target.verdict(pulled, accept=False)
    await validator.refused(VERDICT, other, C.FAILED_PRECONDITION, "VERDICT_ALREADY_RECORDED")


@case(
    "validation.pull_request_id",
    "a PullValidationJob retried with its request id returns the same job",
)
async def validation_pull_request_id(target: Target) -> None:
    validator = await target.peer("validator")
    worker = await target.worker()
    _, response = await target.committed(worker)
    request = validation_service_pb2.PullValidationJobRequest(
        request_id=new_request_id(), wait=duration(5.0)
    )
    first = await validator.call(
        PULL_JOB, request, validation_service_pb2.PullValidationJobResponse, timeout=20.0
    )
    expect(first.HasField("job"), "a job was queued, yet PullValidationJob leased none")
    again = await validator.call(
        PULL_JOB, request, validation_service_pb2.PullValidationJobResponse, timeout=20.0
    )
    expect(
        again.lease.lease_id == first.lease.lease_id and again.job.job_id == first.job.job_id,
        "a PullValidationJob retried with its request id leased another job",
    )
    await validator.call(
        VERDICT, target.verdict(first, accept=True), validation_service_pb2.SubmitVerdictResponse
    )
    if first.job.commitment.commitment_id != response.commitment.commitment_id:
        pulled = await target.job_for(validator, response.commitment.commitment_id)
        await validator.call(
            VERDICT,
            target.verdict(pulled, accept=True),
            validation_service_pb2.SubmitVerdictResponse,
        )


@case(
    "validation.verdict_fields",
    "logprobs of the wrong shape, with a REJECT, or work above the batch's: INVALID_FIELDS",
)
async def validation_verdict_fields(target: Target) -> None:
    validator = await target.peer("validator")
    worker = await target.worker()
    _, response = await target.committed(worker)
    pulled = await target.job_for(validator, response.commitment.commitment_id)
    short = target.verdict(pulled, accept=True)
    del short.validated_logprobs[0].logprobs[-1]
    await validator.refused(
        VERDICT,
        short,
        C.INVALID_ARGUMENT,
        "INVALID_FIELDS",
        field="validated_logprobs",
        what="a rollout's log-probabilities one too few",
    )
    positive = target.verdict(pulled, accept=True)
    positive.validated_logprobs[0].logprobs[0] = 0.5
    await validator.refused(
        VERDICT,
        positive,
        C.INVALID_ARGUMENT,
        "INVALID_FIELDS",
        field="validated_logprobs",
        what="a log-probability above 0",
    )
    reject = target.verdict(pulled, accept=False)
    reject.validated_logprobs.extend(target.verdict(pulled, accept=True).validated_logprobs)
    await validator.refused(
        VERDICT,
        reject,
        C.INVALID_ARGUMENT,
        "INVALID_FIELDS",
        field="validated_logprobs",
        what="log-probabilities with a REJECT",
    )
    inflated = target.verdict(pulled, accept=True)
    inflated.validated_work.decode_tokens += 1_000_000
    await validator.refused(
        VERDICT,
        inflated,
        C.INVALID_ARGUMENT,
        "INVALID_FIELDS",
        field="validated_work",
        what="validated_work above the batch's tokens",
    )
    # Nothing was recorded: the job still takes its verdict.
    await validator.call(
        VERDICT, target.verdict(pulled, accept=True), validation_service_pb2.SubmitVerdictResponse
    )


@case("validation.job_not_found", "a verdict on a job the validator does not hold: JOB_NOT_FOUND")
async def validation_job_not_found(target: Target) -> None:
    validator = await target.peer("validator")
    request = validation_service_pb2.SubmitVerdictRequest(
        request_id=new_request_id(),
        job_id="conformance-none",
        lease_id="conformance-none",
        fencing_token=1,
        decision=validation_pb2.Verdict.DECISION_REJECT,
        reject_reason="conformance",
    )
    await validator.refused(VERDICT, request, C.NOT_FOUND, "JOB_NOT_FOUND")


# ============================================================================ checkpoints


@case(
    "checkpoint.publish",
    "a published step is the latest, reads back signed, and WatchCheckpoints streams it",
)
async def checkpoint_publish(target: Target) -> None:
    trainer = await target.peer("trainer")
    step = await target.publish(trainer)
    latest = await trainer.call(
        LATEST,
        checkpoint_service_pb2.GetLatestCheckpointRequest(),
        checkpoint_service_pb2.GetLatestCheckpointResponse,
    )
    manifest = checkpoint_pb2.CheckpointManifest.FromString(latest.checkpoint.manifest)
    expect(manifest.step == step, f"GetLatestCheckpoint answers step {manifest.step}, not {step}")
    expect(
        verify_signature(
            trainer.identity.public_key,
            latest.checkpoint.signature,
            CHECKPOINT_DOMAIN + latest.checkpoint.manifest,
        ),
        "the stored manifest and signature do not verify with the trainer's key",
    )
    read = await trainer.call(
        GET_CHECKPOINT,
        checkpoint_service_pb2.GetCheckpointRequest(step=step),
        checkpoint_service_pb2.GetCheckpointResponse,
    )
    expect(read.checkpoint.manifest == latest.checkpoint.manifest, "GetCheckpoint differs")
    body = checkpoint_service_pb2.WatchCheckpointsRequest(after_step=step - 1).SerializeToString()
    call = target.wire.server_stream(
        WATCH,
        body,
        trainer.headers(WATCH, body),
        checkpoint_service_pb2.WatchCheckpointsResponse,
        timeout=target.config.call_timeout,
    )
    try:
        async for update in call:
            got = checkpoint_pb2.CheckpointManifest.FromString(update.checkpoint.manifest).step
            expect(got == step, f"WatchCheckpoints(after {step - 1}) streamed step {got} first")
            return
    finally:
        call.cancel()
    raise CaseFailure("WatchCheckpoints ended without a checkpoint")


@case(
    "checkpoint.refusals",
    "bad signature, old step, missing shard, other network, bad path: each refused",
)
async def checkpoint_refusals(target: Target) -> None:
    trainer = await target.peer("trainer")
    step = await target.publish(trainer)

    async def refused(
        manifest: bytes,
        signature: bytes,
        code: grpc.StatusCode,
        reason: str,
        field: str | None = None,
    ) -> None:
        request = checkpoint_service_pb2.PublishCheckpointRequest(
            request_id=new_request_id(), manifest=manifest, signature=signature
        )
        await trainer.refused(PUBLISH, request, code, reason, field=field)

    manifest, _ = await target.manifest(trainer, step + 1)
    await refused(
        manifest,
        trainer.identity.sign(b"something else"),
        C.INVALID_ARGUMENT,
        "CHECKPOINT_SIGNATURE_INVALID",
    )
    old, old_signature = await target.manifest(trainer, step)
    await refused(old, old_signature, C.FAILED_PRECONDITION, "CHECKPOINT_STEP_NOT_MONOTONIC")
    other, other_signature = await target.manifest(
        trainer, step + 1, network_id="conformance-other"
    )
    await refused(
        other, other_signature, C.INVALID_ARGUMENT, "INVALID_FIELDS", "manifest.network_id"
    )
    bad, bad_signature = await target.manifest(trainer, step + 1, path="../escape.bin")
    await refused(
        bad, bad_signature, C.INVALID_ARGUMENT, "INVALID_FIELDS", "manifest.files[0].path"
    )
    ghost = common_pb2.BlobRef(blake3=os.urandom(32), size=10)
    missing = checkpoint_pb2.CheckpointManifest(
        step=step + 1,
        network_id=target.config.network_id,
        files=[checkpoint_pb2.CheckpointFile(path="model.bin", content=ghost, shards=[ghost])],
    ).SerializeToString(deterministic=True)
    await refused(
        missing,
        trainer.identity.sign(CHECKPOINT_DOMAIN + missing),
        C.FAILED_PRECONDITION,
        "CHECKPOINT_SHARD_MISSING",
    )
    await trainer.refused(
        GET_CHECKPOINT,
        checkpoint_service_pb2.GetCheckpointRequest(step=1 << 62),
        C.NOT_FOUND,
        "CHECKPOINT_NOT_FOUND",
    )


@case("checkpoint.republish", "republishing the identical latest manifest is idempotent")
async def checkpoint_republish(target: Target) -> None:
    trainer = await target.peer("trainer")
    latest = await target.latest_step(trainer)
    step = 1 if latest is None else latest + 1
    manifest, signature = await target.manifest(trainer, step)
    for _ in range(2):
        await trainer.call(
            PUBLISH,
            checkpoint_service_pb2.PublishCheckpointRequest(
                request_id=new_request_id(), manifest=manifest, signature=signature
            ),
            checkpoint_service_pb2.PublishCheckpointResponse,
        )


# ============================================================================ rollouts


@case(
    "rollouts.request",
    "RequestRollouts: a retry creates no more tasks; bad sampling: INVALID_FIELDS",
)
async def rollouts_request(target: Target) -> None:
    trainer = await target.peer("trainer")
    step = await target.checkpoint(trainer)
    request = target.rollouts_request(2, 1, step)
    first = await trainer.call(
        REQUEST_ROLLOUTS, request, rollout_service_pb2.RequestRolloutsResponse
    )
    again = await trainer.call(
        REQUEST_ROLLOUTS, request, rollout_service_pb2.RequestRolloutsResponse
    )
    expect(list(again.task_ids) == list(first.task_ids), "a retry answered other task ids")
    bad = target.rollouts_request(1, 1, step)
    bad.sampling.temperature = math.nan
    await trainer.refused(
        REQUEST_ROLLOUTS, bad, C.INVALID_ARGUMENT, "INVALID_FIELDS", field="sampling.temperature"
    )
    bad = target.rollouts_request(1, 0, step)
    await trainer.refused(
        REQUEST_ROLLOUTS, bad, C.INVALID_ARGUMENT, "INVALID_FIELDS", field="samples_per_prompt"
    )
    bad = target.rollouts_request(8192, 2, step)
    bad.prompts_per_task = 4096  # 4,096 prompts x 2 samples: above 4,096 rollouts per task
    await trainer.refused(
        REQUEST_ROLLOUTS, bad, C.INVALID_ARGUMENT, "INVALID_FIELDS", field="prompts_per_task"
    )
    # Finish the two tasks so that later cases lease their own.
    worker = await target.worker()
    for _ in first.task_ids:
        pulled = await worker.pull(wait=2.0)
        if pulled.HasField("task"):
            await target.commit(worker, target.work(worker, pulled.task, pulled.lease))


@case("rollouts.stream", "accepted rollouts reach StreamRollouts, with sequences, resumable")
async def rollouts_stream(target: Target) -> None:
    validator = await target.peer("validator")
    trainer = await target.peer("trainer")
    worker = await target.worker()
    work, response = await target.committed(worker)
    pulled = await target.job_for(validator, response.commitment.commitment_id)
    await validator.call(
        VERDICT, target.verdict(pulled, accept=True), validation_service_pb2.SubmitVerdictResponse
    )
    body = rollout_service_pb2.StreamRolloutsRequest(after_sequence=0).SerializeToString()
    call = target.wire.server_stream(
        STREAM_ROLLOUTS,
        body,
        trainer.headers(STREAM_ROLLOUTS, body),
        rollout_service_pb2.StreamRolloutsResponse,
        timeout=target.config.call_timeout,
    )
    mine = []
    last = 0
    try:
        async for item in call:
            rollout = item.rollout
            expect(rollout.sequence > last, f"sequence {rollout.sequence} after {last}")
            last = rollout.sequence
            if rollout.commitment_id == response.commitment.commitment_id:
                mine.append(rollout)
                if len(mine) == len(work.rollouts):
                    break
    except grpc.aio.AioRpcError as error:
        if error.code() != C.DEADLINE_EXCEEDED:
            raise
    finally:
        call.cancel()
    expect(
        len(mine) == len(work.rollouts),
        f"{len(mine)} of the accepted commitment's {len(work.rollouts)} rollouts were streamed",
    )
    expect(
        all(list(r.validated_logprobs) for r in mine),
        "a validated rollout streamed without validated_logprobs",
    )
    # Resuming after the first of them starts after it.
    body = rollout_service_pb2.StreamRolloutsRequest(
        after_sequence=mine[0].sequence
    ).SerializeToString()
    call = target.wire.server_stream(
        STREAM_ROLLOUTS,
        body,
        trainer.headers(STREAM_ROLLOUTS, body),
        rollout_service_pb2.StreamRolloutsResponse,
        timeout=target.config.call_timeout,
    )
    try:
        if len(mine) > 1:
            async for item in call:
                expect(
                    item.rollout.sequence > mine[0].sequence,
                    f"resumed after {mine[0].sequence}, got {item.rollout.sequence}",
                )
                break
    finally:
        call.cancel()


# ============================================================================ ledger


async def _entries(peer: Peer, node_id: str = "") -> list[ledger_pb2.LedgerEntry]:
    entries: list[ledger_pb2.LedgerEntry] = []
    after = 0
    while True:
        page = await peer.call(
            LIST_ENTRIES,
            ledger_service_pb2.ListEntriesRequest(
                after_sequence=after, page_size=1000, node_id=node_id
            ),
            ledger_service_pb2.ListEntriesResponse,
        )
        if not page.entries:
            return entries
        entries.extend(page.entries)
        after = page.entries[-1].sequence


@case("ledger.chain", "every ledger entry hashes as docs/ledger.md says; the signed head verifies")
async def ledger_chain(target: Target) -> None:
    worker = await target.shared_worker()
    key = await target.coordinator_public_key()
    head = await worker.call(
        CHAIN_HEAD,
        ledger_service_pb2.GetChainHeadRequest(fresh=True),
        ledger_service_pb2.GetChainHeadResponse,
    )
    entries = [e for e in await _entries(worker) if e.sequence <= head.head.sequence]
    problem = verify_chain(entries, head.head, target.config.network_id, key)
    expect(problem is None, problem or "")


# ============================================================================ malformed input


@case(
    "malformed.unparseable",
    "a signed body that is not the request message: INVALID_FIELDS, never INTERNAL",
)
async def malformed_unparseable(target: Target) -> None:
    worker = await target.shared_worker()
    # A message that does not parse names no field, so no field violation is required.
    for body in (b"\xff\xff\xff\xff", b"\x0a\x05ab"):
        await worker.refused(GET_NODE, body, C.INVALID_ARGUMENT, "INVALID_FIELDS", violations=False)


@case(
    "malformed.fields",
    "out-of-bounds fields each named: enum, NaN, request id, node id, list length",
)
async def malformed_fields(target: Target) -> None:
    worker = await target.shared_worker()
    beat = node_service_pb2.HeartbeatRequest(metrics={"tokens/s": math.nan})
    beat.activity = 99  # type: ignore[assignment]
    error = await worker.refused(
        HEARTBEAT, beat, C.INVALID_ARGUMENT, "INVALID_FIELDS", field="activity"
    )
    paths = [violation.field for violation in error.field_violations]
    expect(any(path.startswith("metrics") for path in paths), f"NaN metric not named: {paths}")
    await worker.refused(
        PULL_TASK,
        task_service_pb2.PullTaskRequest(request_id="has space"),
        C.INVALID_ARGUMENT,
        "INVALID_FIELDS",
        field="request_id",
    )
    await worker.refused(
        GET_NODE,
        node_service_pb2.GetNodeRequest(node_id="NOT-A-NODE-ID"),
        C.INVALID_ARGUMENT,
        "INVALID_FIELDS",
        field="node_id",
    )
    twice = node_service_pb2.HeartbeatRequest(held_lease_ids=["lease-a", "lease-a"])
    await worker.refused(
        HEARTBEAT, twice, C.INVALID_ARGUMENT, "INVALID_FIELDS", field="held_lease_ids"
    )
    many = node_service_pb2.HeartbeatRequest(held_lease_ids=[f"l{i}" for i in range(300)])
    await worker.refused(
        HEARTBEAT, many, C.INVALID_ARGUMENT, "INVALID_FIELDS", field="held_lease_ids"
    )


@case("malformed.newer_fields", "fields of a newer minor version (unknown numbers) are ignored")
async def malformed_newer_fields(target: Target) -> None:
    worker = await target.shared_worker()
    # Field 1000 as a varint and field 1001 as bytes: what a 1.n node could add.
    extra = b"\xc0\x3e\x07" + b"\xca\x3e\x03abc"
    body = node_service_pb2.GetNodeRequest(node_id=worker.node_id).SerializeToString() + extra
    read = await worker.call(GET_NODE, body, node_service_pb2.GetNodeResponse)
    expect(read.node.node_id == worker.node_id, "GetNode with newer fields answered another node")
    beat = node_service_pb2.HeartbeatRequest().SerializeToString() + extra
    await worker.call(HEARTBEAT, beat, node_service_pb2.HeartbeatResponse)


@case("malformed.too_large", "a message above the size cap: RESOURCE_EXHAUSTED, no RetryInfo")
async def malformed_too_large(target: Target) -> None:
    worker = await target.shared_worker()
    cap = target.config.max_message_bytes
    big = node_service_pb2.HeartbeatRequest(metrics={"k": 1.0})
    body = big.SerializeToString() + b"\x22" + _encode_varint(cap) + b"\x00" * cap  # field 4 bytes
    try:
        await worker.call(HEARTBEAT, body, node_service_pb2.HeartbeatResponse, timeout=60.0)
    except RollnetError as error:
        expect(
            error.code is C.RESOURCE_EXHAUSTED,
            f"expected RESOURCE_EXHAUSTED, got {describe(error)}",
        )
        expect(error.retry_after is None, "a size refusal carries a RetryInfo")
        if error.status is not None:  # gRPC's own cut-off carries no details
            refusal(error, C.RESOURCE_EXHAUSTED, "MESSAGE_TOO_LARGE")
            expect(
                "max_message_bytes" in error.metadata and "message_bytes" in error.metadata,
                f"MESSAGE_TOO_LARGE metadata is {dict(error.metadata)}",
            )
        return
    raise CaseFailure(f"a message of {len(body)} bytes was accepted (cap {cap})")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# ============================================================================ last: rate limits


@case(
    "errors.rate_limit",
    "registrations past the per-address limit: RATE_LIMITED with a RetryInfo",
    timeout=180.0,
)
async def errors_rate_limit(target: Target) -> None:
    for _ in range(2000):
        peer = Peer(target, Identity.generate(), common_pb2.ROLE_WORKER)
        try:
            await peer.call(
                REGISTER,
                registration(peer.identity, peer.role),
                node_service_pb2.RegisterNodeResponse,
            )
        except RollnetError as error:
            refusal(error, C.RESOURCE_EXHAUSTED, "RATE_LIMITED")
            expect(error.retry_after is not None and error.retry_after > 0, "no RetryInfo delay")
            return
    raise CaseFailure("2000 registrations from one address were all admitted")


async def unreachable(config: TargetConfig) -> str | None:
    """Why the target cannot be asked anything (no connection within ``call_timeout``), or
    ``None`` when Health/Check answers (SERVING or not: the health cases judge that)."""
    target = Target(config)
    try:
        await target.health()
    except RollnetError as error:
        if error.code in (C.UNAVAILABLE, C.DEADLINE_EXCEEDED) and error.status is None:
            return f"{error.code.name}: {error.message}"
    finally:
        await target.close()
    return None


async def run_coordinator_suite(
    config: TargetConfig,
    *,
    patterns: Sequence[str] = (),
    skip: Sequence[str] = (),
    on_result: Callable[[Result], None] | None = None,
) -> Report:
    """Run the coordinator suite (or the cases ``patterns`` select, less those ``skip`` names)
    against ``config``."""
    target = Target(config)
    try:
        return await run_cases(SUITE, select(CASES, patterns, skip), target, on_result=on_result)
    finally:
        await target.close()
