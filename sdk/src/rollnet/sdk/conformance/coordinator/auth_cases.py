"""The coordinator suite's cases: authentication."""

from __future__ import annotations

import os

from google.protobuf.message import Message

from rollnet.sdk.conformance.coordinator._base import C, _get_node, _now_ms, case
from rollnet.sdk.conformance.suite import CaseFailure, Skipped
from rollnet.sdk.conformance.target import (
    BAN,
    EJECT,
    GET_NODE,
    HEARTBEAT,
    LIST_NODES,
    PUBLISH,
    PULL_JOB,
    REGISTER,
    REINSTATE,
    REQUEST_ROLLOUTS,
    Peer,
    Target,
    new_request_id,
    registration,
)
from rollnet.sdk.conformance.wire import Tamper, Wire, refusal, replace_header
from rollnet.sdk.errors import RollnetError
from rollnet.sdk.identity import Identity, b64url_encode
from rollnet.sdk.signing import (
    BODY_HASH_HEADER,
    KEY_HEADER,
    NONCE_HEADER,
    SIGNATURE_HEADER,
    SIGNING_HEADERS,
    TIMESTAMP_HEADER,
)
from rollnet.v1 import (
    checkpoint_service_pb2,
    common_pb2,
    node_service_pb2,
    rollout_service_pb2,
    validation_service_pb2,
)


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
