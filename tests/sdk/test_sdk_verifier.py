"""The request verifier on a real grpc.aio server: what it admits and each reason it refuses."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sdk_testing import Swarm

from rollnet.sdk import (
    AUDIENCE_HEADER,
    BODY_HASH_HEADER,
    KEY_HEADER,
    NONCE_HEADER,
    SIGNATURE_HEADER,
    SIGNING_HEADERS,
    TIMESTAMP_HEADER,
    ErrorReason,
    Identity,
    NodeClient,
    NonceCache,
    PermissionDenied,
    RequestSigner,
    RetryPolicy,
    RollnetError,
    Unauthenticated,
    from_rpc_error,
    method_path,
    signing_interceptors,
    verifier,
)
from rollnet.sdk.identity import b64url_encode
from rollnet.sdk.nonce_cache import NonceCacheFull
from rollnet.sdk.testing import NETWORK_ID
from rollnet.v1 import common_pb2, node_service_pb2

GET_NODE = method_path("NodeService", "GetNode")
REGISTER = method_path("NodeService", "RegisterNode")
LIST_NODES = method_path("NodeService", "ListNodes")
NO_RETRY = RetryPolicy.no_retry()


async def raw_call(
    swarm: Swarm, method: str, body: bytes, metadata: Sequence[tuple[str, str]]
) -> bytes:
    """Send exact bytes and headers on an unsigned channel; raise the typed error on failure."""
    async with grpc.aio.insecure_channel(swarm.target) as channel:
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            method, request_serializer=None, response_deserializer=None
        )
        try:
            response: bytes = await call(body, metadata=tuple(metadata), timeout=5)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from exc
        return response


def signed(
    identity: Identity,
    method: str,
    body: bytes,
    *,
    audience: str = NETWORK_ID,
    clock: Callable[[], float] = time.time,
) -> list[tuple[str, str]]:
    return list(RequestSigner(identity, audience, clock=clock).sign(method, body).as_metadata())


def replace(metadata: list[tuple[str, str]], name: str, value: str | None) -> list[tuple[str, str]]:
    """Metadata with header ``name`` set to ``value`` (``None``: dropped)."""
    kept = [(k, v) for k, v in metadata if k != name]
    return kept if value is None else [*kept, (name, value)]


def get_node_body(node_id: str = "n1") -> bytes:
    return node_service_pb2.GetNodeRequest(node_id=node_id).SerializeToString(deterministic=True)


def register_body(identity: Identity) -> bytes:
    return node_service_pb2.RegisterNodeRequest(
        public_key=identity.public_key, role=common_pb2.ROLE_WORKER
    ).SerializeToString(deterministic=True)


async def expect_refusal(
    swarm: Swarm, method: str, body: bytes, metadata: Sequence[tuple[str, str]]
) -> RollnetError:
    with pytest.raises(RollnetError) as info:
        await raw_call(swarm, method, body, metadata)
    return info.value


async def test_signed_call_succeeds_and_handler_sees_the_caller(swarm: Swarm) -> None:
    async with swarm.channel(swarm.worker) as channel:
        response = await NodeClient(channel).get_node(node_service_pb2.GetNodeRequest(node_id="x"))
    assert response.node.node_id == "x"
    (seen,) = swarm.nodes.observed
    assert seen.caller_node_id == swarm.worker.node_id
    assert seen.caller_role == common_pb2.ROLE_WORKER
    assert seen.caller_registered
    assert len(seen.request_id) == 32  # the signing nonce, as GetNode has no request_id


async def test_raw_signed_bytes_succeed(swarm: Swarm) -> None:
    body = get_node_body()
    response = await raw_call(swarm, GET_NODE, body, signed(swarm.worker, GET_NODE, body))
    assert node_service_pb2.GetNodeResponse.FromString(response).node.node_id == "n1"


@pytest.mark.parametrize("header", SIGNING_HEADERS)
@pytest.mark.parametrize("value", [None, ""], ids=["absent", "empty"])
async def test_missing_or_empty_header_is_refused(
    swarm: Swarm, header: str, value: str | None
) -> None:
    body = get_node_body()
    metadata = replace(signed(swarm.worker, GET_NODE, body), header, value)
    error = await expect_refusal(swarm, GET_NODE, body, metadata)
    assert isinstance(error, Unauthenticated)
    assert error.reason == ErrorReason.SIGNATURE_MISSING
    assert header in error.message


async def test_unsigned_call_is_refused(swarm: Swarm) -> None:
    error = await expect_refusal(swarm, GET_NODE, get_node_body(), [])
    assert error.code == grpc.StatusCode.UNAUTHENTICATED
    assert error.reason == ErrorReason.SIGNATURE_MISSING
    assert swarm.nodes.observed == []


@pytest.mark.parametrize(
    ("header", "value"),
    [
        (KEY_HEADER, "not base64!"),
        (KEY_HEADER, "AAAA"),  # decodes, but 3 bytes
        (SIGNATURE_HEADER, "AAAA"),
        (TIMESTAMP_HEADER, "12.5"),
        (TIMESTAMP_HEADER, "-1000"),
        (NONCE_HEADER, "ABCDEF0123456789ABCDEF0123456789"),  # uppercase
        (BODY_HASH_HEADER, "00"),
        (AUDIENCE_HEADER, "has space"),
    ],
)
async def test_malformed_header_is_refused(swarm: Swarm, header: str, value: str) -> None:
    body = get_node_body()
    metadata = replace(signed(swarm.worker, GET_NODE, body), header, value)
    error = await expect_refusal(swarm, GET_NODE, body, metadata)
    assert error.code == grpc.StatusCode.UNAUTHENTICATED
    assert error.reason == ErrorReason.SIGNATURE_MALFORMED


async def test_repeated_header_is_refused(swarm: Swarm) -> None:
    body = get_node_body()
    metadata = signed(swarm.worker, GET_NODE, body)
    nonce = dict(metadata)[NONCE_HEADER]
    error = await expect_refusal(swarm, GET_NODE, body, [*metadata, (NONCE_HEADER, nonce)])
    assert error.reason == ErrorReason.SIGNATURE_MALFORMED


async def test_signature_by_another_key_is_refused(swarm: Swarm) -> None:
    body = get_node_body()
    forged = signed(Identity.generate(), GET_NODE, body)
    genuine_key = dict(signed(swarm.worker, GET_NODE, body))[KEY_HEADER]
    error = await expect_refusal(swarm, GET_NODE, body, replace(forged, KEY_HEADER, genuine_key))
    assert error.code == grpc.StatusCode.UNAUTHENTICATED
    assert error.reason == ErrorReason.SIGNATURE_INVALID


async def test_universal_signature_of_a_small_order_key_is_refused(swarm: Swarm) -> None:
    # The identity point as a key, with R = identity and S = 0, satisfies Ed25519's equation for
    # any message: were it admitted, anyone could register and call as that key.
    identity_point = bytes([1]) + bytes(31)
    body = node_service_pb2.RegisterNodeRequest(
        public_key=identity_point, role=common_pb2.ROLE_WORKER
    ).SerializeToString(deterministic=True)
    headers = signed(Identity.generate(), REGISTER, body)
    headers = replace(headers, KEY_HEADER, b64url_encode(identity_point))
    headers = replace(headers, SIGNATURE_HEADER, b64url_encode(identity_point + bytes(32)))
    error = await expect_refusal(swarm, REGISTER, body, headers)
    assert error.code == grpc.StatusCode.UNAUTHENTICATED
    assert error.reason == ErrorReason.SIGNATURE_INVALID


async def test_body_altered_after_signing_is_refused(swarm: Swarm) -> None:
    metadata = signed(swarm.worker, GET_NODE, get_node_body("n1"))
    error = await expect_refusal(swarm, GET_NODE, get_node_body("n2"), metadata)
    assert error.code == grpc.StatusCode.UNAUTHENTICATED
    assert error.reason == ErrorReason.BODY_HASH_MISMATCH
    assert swarm.nodes.observed == []


async def test_body_hash_header_rewritten_to_match_is_refused(swarm: Swarm) -> None:
    """Fixing up the digest header for an altered body breaks the signature instead."""
    from rollnet.sdk import body_digest

    altered = get_node_body("n2")
    metadata = replace(
        signed(swarm.worker, GET_NODE, get_node_body("n1")), BODY_HASH_HEADER, body_digest(altered)
    )
    error = await expect_refusal(swarm, GET_NODE, altered, metadata)
    assert error.reason == ErrorReason.SIGNATURE_INVALID


@pytest.mark.parametrize("offset", [61.0, -61.0])
async def test_timestamp_outside_window_is_refused(swarm: Swarm, offset: float) -> None:
    body = get_node_body()
    metadata = signed(swarm.worker, GET_NODE, body, clock=lambda: time.time() + offset)
    error = await expect_refusal(swarm, GET_NODE, body, metadata)
    assert error.code == grpc.StatusCode.UNAUTHENTICATED
    assert error.reason == ErrorReason.TIMESTAMP_SKEW


@pytest.mark.parametrize("offset", [55.0, -55.0])
async def test_timestamp_inside_window_is_admitted(swarm: Swarm, offset: float) -> None:
    body = get_node_body()
    metadata = signed(swarm.worker, GET_NODE, body, clock=lambda: time.time() + offset)
    await raw_call(swarm, GET_NODE, body, metadata)


async def test_wrong_audience_is_refused(swarm: Swarm) -> None:
    body = get_node_body()
    metadata = signed(swarm.worker, GET_NODE, body, audience="another-network")
    error = await expect_refusal(swarm, GET_NODE, body, metadata)
    assert error.code == grpc.StatusCode.UNAUTHENTICATED
    assert error.reason == ErrorReason.AUDIENCE_MISMATCH


async def test_audience_header_swapped_after_signing_is_refused(swarm: Swarm) -> None:
    body = get_node_body()
    metadata = signed(swarm.worker, GET_NODE, body, audience="another-network")
    error = await expect_refusal(
        swarm, GET_NODE, body, replace(metadata, AUDIENCE_HEADER, NETWORK_ID)
    )
    assert error.reason == ErrorReason.SIGNATURE_INVALID


async def test_unknown_key_is_refused_except_on_register(swarm: Swarm) -> None:
    stranger = Identity.generate()
    body = get_node_body()
    error = await expect_refusal(swarm, GET_NODE, body, signed(stranger, GET_NODE, body))
    assert error.code == grpc.StatusCode.UNAUTHENTICATED
    assert error.reason == ErrorReason.UNKNOWN_KEY

    async with swarm.channel(stranger) as channel:
        response = await NodeClient(channel).register_node(
            node_service_pb2.RegisterNodeRequest(
                public_key=stranger.public_key, role=common_pb2.ROLE_WORKER
            )
        )
    assert response.node.node_id == stranger.node_id
    (seen,) = swarm.nodes.observed
    assert not seen.caller_registered
    assert seen.caller_role == common_pb2.ROLE_UNSPECIFIED


async def test_role_not_allowed_is_refused(swarm: Swarm) -> None:
    async with swarm.channel(swarm.worker) as channel:
        with pytest.raises(PermissionDenied) as info:
            await NodeClient(channel).list_nodes(node_service_pb2.ListNodesRequest())
    assert info.value.reason == ErrorReason.ROLE_NOT_ALLOWED
    async with swarm.channel(swarm.operator) as channel:
        await NodeClient(channel).list_nodes(node_service_pb2.ListNodesRequest())


async def test_method_absent_from_policy_is_refused(swarm: Swarm) -> None:
    policy = dict(swarm.verifier.config.method_policy)
    del policy[GET_NODE]
    swarm.verifier.config.method_policy = policy
    async with swarm.channel(swarm.operator) as channel:
        with pytest.raises(PermissionDenied) as info:
            await NodeClient(channel).get_node(node_service_pb2.GetNodeRequest())
    assert info.value.reason == ErrorReason.ROLE_NOT_ALLOWED


async def test_banned_key_is_refused(swarm: Swarm) -> None:
    swarm.register(swarm.worker, common_pb2.ROLE_WORKER, banned=True)
    async with swarm.channel(swarm.worker) as channel:
        with pytest.raises(PermissionDenied) as info:
            await NodeClient(channel).get_node(node_service_pb2.GetNodeRequest())
    assert info.value.reason == ErrorReason.NODE_BANNED


class Recorder(grpc.aio.UnaryUnaryClientInterceptor):
    """Records the metadata and request bytes of each call, as sent after signing."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[tuple[str, str]], bytes]] = []

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        method = client_call_details.method
        self.sent.append(
            (
                method.decode() if isinstance(method, bytes) else method,
                list(client_call_details.metadata or ()),
                bytes(request),
            )
        )
        return await continuation(client_call_details, request)


async def capture(swarm: Swarm, request: Any, *, call: str = "get_node") -> tuple[Any, ...]:
    recorder = Recorder()
    signer = RequestSigner(swarm.worker, NETWORK_ID)
    async with grpc.aio.insecure_channel(
        swarm.target, interceptors=[*signing_interceptors(signer), recorder]
    ) as channel:
        await getattr(NodeClient(channel), call)(request, retry=NO_RETRY)
    (sent,) = recorder.sent
    return sent


async def test_replayed_request_is_refused(swarm: Swarm) -> None:
    method, metadata, body = await capture(swarm, node_service_pb2.GetNodeRequest(node_id="r"))
    assert {k for k, _ in metadata} >= set(SIGNING_HEADERS)
    error = await expect_refusal(swarm, method, body, metadata)
    assert error.code == grpc.StatusCode.UNAUTHENTICATED
    assert error.reason == ErrorReason.NONCE_REPLAYED
    assert len(swarm.nodes.observed) == 1


async def test_signature_for_one_method_is_refused_on_another(swarm: Swarm) -> None:
    method, metadata, body = await capture(
        swarm,
        node_service_pb2.DeregisterNodeRequest(request_id="abc"),
        call="deregister_node",
    )
    assert method == method_path("NodeService", "DeregisterNode")
    error = await expect_refusal(swarm, GET_NODE, body, metadata)
    assert error.reason == ErrorReason.SIGNATURE_INVALID


async def test_nonce_is_recorded_only_after_the_signature_verifies(swarm: Swarm) -> None:
    body = get_node_body()
    nonce = bytes(range(16))
    genuine = RequestSigner(swarm.worker, NETWORK_ID).sign(GET_NODE, body, nonce=nonce)
    forged = RequestSigner(Identity.generate(), NETWORK_ID).sign(GET_NODE, body, nonce=nonce)
    metadata = replace(list(forged.as_metadata()), KEY_HEADER, genuine.key)
    error = await expect_refusal(swarm, GET_NODE, body, metadata)
    assert error.reason == ErrorReason.SIGNATURE_INVALID
    await raw_call(swarm, GET_NODE, body, genuine.as_metadata())


async def test_request_id_of_the_message_is_the_call_id(swarm: Swarm) -> None:
    async with swarm.channel(swarm.worker) as channel:
        await NodeClient(channel).deregister_node(
            node_service_pb2.DeregisterNodeRequest(request_id="rid-1")
        )
    assert swarm.nodes.observed[0].request_id == "rid-1"


async def test_health_is_exempt_from_signing(swarm: Swarm) -> None:
    async with grpc.aio.insecure_channel(swarm.target) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    assert response.status == health_pb2.HealthCheckResponse.SERVING


async def test_generated_stub_on_signed_channel_is_admitted(swarm: Swarm) -> None:
    from rollnet.v1 import node_service_pb2_grpc

    signer = RequestSigner(swarm.worker, NETWORK_ID)
    async with grpc.aio.insecure_channel(
        swarm.target, interceptors=signing_interceptors(signer)
    ) as channel:
        response = await node_service_pb2_grpc.NodeServiceStub(channel).GetNode(
            node_service_pb2.GetNodeRequest(node_id="stub"), timeout=5
        )
    assert response.node.node_id == "stub"


def test_nonce_cache_expires_and_is_bounded() -> None:
    now = [0.0]
    cache = NonceCache(ttl=10.0, capacity=3, per_key_capacity=2, clock=lambda: now[0])
    assert cache.record(b"k", "a")
    assert not cache.record(b"k", "a")
    assert cache.record(b"other-key", "a")  # nonces are per key
    assert cache.record(b"k", "b")
    with pytest.raises(NonceCacheFull):
        cache.record(b"k", "c")  # this key's share is full
    with pytest.raises(NonceCacheFull):
        cache.record(b"third-key", "a")  # the whole cache is full
    now[0] = 9.9
    assert not cache.record(b"k", "a")  # still live just before expiry
    now[0] = 10.0
    assert len(cache) == 0
    assert cache.record(b"k", "a")
    assert cache.record(b"k", "c")


async def test_full_nonce_cache_refuses_with_retry_info(swarm: Swarm) -> None:
    swarm.verifier.nonces = NonceCache(ttl=120.0, capacity=1)
    body = get_node_body()
    await raw_call(swarm, GET_NODE, body, signed(swarm.worker, GET_NODE, body))
    error = await expect_refusal(swarm, GET_NODE, body, signed(swarm.worker, GET_NODE, body))
    assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.reason == ErrorReason.RATE_LIMITED
    assert error.retry_after is not None


async def test_fresh_keys_filling_their_pool_leave_registered_keys_served(swarm: Swarm) -> None:
    """Fresh keys (RegisterNode) have a pool of their own: once it is full, a new fresh key is
    refused naming that bound, while a registered key's calls, and the refusal of their
    replays, go on as before."""
    swarm.verifier.nonces = NonceCache(
        ttl=120.0, capacity=10, max_unregistered_keys=2, unregistered_per_key=1
    )
    body = get_node_body()
    honest = signed(swarm.worker, GET_NODE, body)
    await raw_call(swarm, GET_NODE, body, honest)
    for _ in range(2):
        fresh = Identity.generate()
        register = register_body(fresh)
        await raw_call(swarm, REGISTER, register, signed(fresh, REGISTER, register))
    flood = Identity.generate()
    register = register_body(flood)
    error = await expect_refusal(swarm, REGISTER, register, signed(flood, REGISTER, register))
    assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.reason == ErrorReason.RATE_LIMITED
    assert error.metadata["nonce_limit"] == "unregistered_keys"
    assert "unregistered keys are registering" in error.message
    assert error.retry_after is not None
    replay = await expect_refusal(swarm, GET_NODE, body, honest)
    assert replay.reason == ErrorReason.NONCE_REPLAYED
    await raw_call(swarm, GET_NODE, body, signed(swarm.worker, GET_NODE, body))


async def test_fresh_keys_from_one_address_take_only_its_share(swarm: Swarm) -> None:
    swarm.verifier.nonces = NonceCache(
        ttl=120.0, capacity=10, max_unregistered_keys=10, unregistered_per_address=1
    )
    first, second = Identity.generate(), Identity.generate()
    await raw_call(
        swarm, REGISTER, register_body(first), signed(first, REGISTER, register_body(first))
    )
    body = register_body(second)
    error = await expect_refusal(swarm, REGISTER, body, signed(second, REGISTER, body))
    assert error.reason == ErrorReason.RATE_LIMITED
    assert error.metadata["nonce_limit"] == "address"
    assert "127.0.0.1" in error.message  # the peer's address, without its port


async def test_trusted_roles_are_not_held_back_by_a_full_shared_pool(swarm: Swarm) -> None:
    swarm.verifier.config.nonce_trusted_roles = frozenset({common_pb2.ROLE_OPERATOR})
    swarm.verifier.nonces = NonceCache(ttl=120.0, capacity=1, per_key_capacity=5)
    body = get_node_body()
    await raw_call(swarm, GET_NODE, body, signed(swarm.worker, GET_NODE, body))
    error = await expect_refusal(swarm, GET_NODE, body, signed(swarm.worker, GET_NODE, body))
    assert error.metadata["nonce_limit"] == "shared"
    for _ in range(5):  # the operator's role is trusted: its own capacity only
        await raw_call(swarm, GET_NODE, body, signed(swarm.operator, GET_NODE, body))
    error = await expect_refusal(swarm, GET_NODE, body, signed(swarm.operator, GET_NODE, body))
    assert error.metadata["nonce_limit"] == "per_key"
    # Told to come back when its oldest nonce expires (most of the window), not in a second.
    assert error.retry_after is not None
    assert error.retry_after > 60.0


async def test_nonce_recorder_refuses_what_it_recorded_before() -> None:
    """With a ``nonce_recorder`` (a database shared by replicas), a nonce recorded before is a
    replay even to a fresh verifier (a restart, another replica); a recorder that fails refuses
    the call UNAVAILABLE / NOT_SERVING; a deferred method leaves the recording to its handler
    (current_nonce), whose expiry is the signed timestamp plus the skew window."""
    from rollnet.sdk.verifier import (
        KnownKey,
        RequestVerifier,
        VerificationError,
        VerifierConfig,
        current_nonce,
    )

    identity = Identity.generate()
    shared: set[tuple[bytes, str]] = set()
    recorded: list[int] = []
    broken = False

    async def resolve(key: bytes) -> KnownKey:
        return KnownKey(identity.node_id, common_pb2.ROLE_WORKER)

    async def record(key: bytes, nonce: str, signed_ms: int) -> bool:
        if broken:
            raise OSError("database unreachable")
        recorded.append(signed_ms)
        fresh = (key, nonce) not in shared
        shared.add((key, nonce))
        return fresh

    def verifier(deferred: frozenset[str] = frozenset()) -> RequestVerifier:
        return RequestVerifier(
            VerifierConfig(
                NETWORK_ID,
                resolve,
                {GET_NODE: frozenset({common_pb2.ROLE_WORKER})},
                skew=60.0,
                nonce_recorder=record,
                deferred_nonce_methods=deferred,
            )
        )

    body = get_node_body()
    metadata = signed(identity, GET_NODE, body)
    await verifier().verify(GET_NODE, metadata, body)
    timestamp = int(dict(metadata)[TIMESTAMP_HEADER])
    assert recorded == [timestamp]
    with pytest.raises(VerificationError) as replayed:
        await verifier().verify(GET_NODE, metadata, body)  # a fresh verifier: memory is empty
    assert replayed.value.reason == ErrorReason.NONCE_REPLAYED
    broken = True
    with pytest.raises(VerificationError) as failed:
        await verifier().verify(GET_NODE, signed(identity, GET_NODE, body), body)
    assert failed.value.reason == ErrorReason.NOT_SERVING
    assert failed.value.code == grpc.StatusCode.UNAVAILABLE
    fresh = signed(identity, GET_NODE, body)
    await verifier(frozenset({GET_NODE})).verify(GET_NODE, fresh, body)  # not recorded here
    assert current_nonce().nonce == dict(fresh)[NONCE_HEADER]
    assert current_nonce().expires_at == int(dict(fresh)[TIMESTAMP_HEADER]) / 1000 + 60.0


async def test_fresh_keys_from_one_ipv6_network_share_one_address_share() -> None:
    """An IPv6 subscriber holds a /64 (2**64 addresses): its fresh keys count as one address."""
    from rollnet.sdk.verifier import RequestVerifier, VerificationError, VerifierConfig

    async def unknown(key: bytes) -> None:
        return None

    verifier = RequestVerifier(
        VerifierConfig(
            NETWORK_ID,
            unknown,
            {REGISTER: frozenset({common_pb2.ROLE_UNSPECIFIED})},
            nonce_unregistered_per_address=2,
        )
    )
    for host in ("2001:db8:1:2::1", "2001:db8:1:2::ffff"):
        fresh = Identity.generate()
        body = register_body(fresh)
        await verifier.verify(REGISTER, signed(fresh, REGISTER, body), body, f"ipv6:[{host}]:443")
    fresh = Identity.generate()
    body = register_body(fresh)
    # Another address of the same /64, written as gRPC's URI form writes it.
    peer = "ipv6:%5B2001:db8:1:2:abcd::7%5D:443"
    with pytest.raises(VerificationError) as refused:
        await verifier.verify(REGISTER, signed(fresh, REGISTER, body), body, peer)
    assert refused.value.reason == ErrorReason.RATE_LIMITED
    assert refused.value.metadata == {"nonce_limit": "address"}
    # Another /64, and an IPv4 peer (mapped or not), have shares of their own.
    for peer in ("ipv6:[2001:db8:1:3::1]:443", "ipv6:[::ffff:192.0.2.1]:1", "ipv4:192.0.2.1:2"):
        fresh = Identity.generate()
        body = register_body(fresh)
        await verifier.verify(REGISTER, signed(fresh, REGISTER, body), body, peer)
    assert verifier.nonces.unregistered_keys == 5


async def test_a_replay_at_the_windows_far_edge_is_refused() -> None:
    """A call signed ``skew`` ahead of the server's clock is acceptable until ``2 * skew`` after
    it arrived, that instant included: its nonce must still be remembered then (memory only,
    no recorder)."""
    from rollnet.sdk.verifier import KnownKey, RequestVerifier, VerificationError, VerifierConfig

    identity = Identity.generate()
    wall, mono = [1_000.0], [0.0]

    async def resolve(key: bytes) -> KnownKey:
        return KnownKey(identity.node_id, common_pb2.ROLE_WORKER)

    verifier = RequestVerifier(
        VerifierConfig(
            NETWORK_ID,
            resolve,
            {GET_NODE: frozenset({common_pb2.ROLE_WORKER})},
            skew=60.0,
            clock=lambda: wall[0],
            nonce_clock=lambda: mono[0],
        )
    )
    body = get_node_body()
    ahead = signed(identity, GET_NODE, body, clock=lambda: wall[0] + 60.0)
    await verifier.verify(GET_NODE, ahead, body)
    wall[0] += 120.0
    mono[0] += 120.0
    with pytest.raises(VerificationError) as replayed:
        await verifier.verify(GET_NODE, ahead, body)
    assert replayed.value.reason == ErrorReason.NONCE_REPLAYED
    wall[0] += 0.001  # past the window: the signature is stale, whatever memory holds
    with pytest.raises(VerificationError) as stale:
        await verifier.verify(GET_NODE, ahead, body)
    assert stale.value.reason == ErrorReason.TIMESTAMP_SKEW


@pytest.mark.parametrize(
    ("peer", "network"),
    [
        ("ipv4:203.0.113.7:51234", "ipv4:203.0.113.7"),
        ("203.0.113.7", "ipv4:203.0.113.7"),
        ("ipv6:[2001:db8:1:2:3:4:5:6]:443", "ipv6:2001:db8:1:2::/64"),
        ("ipv6:%5B2001:db8:1:2:3:4:5:6%5D:443", "ipv6:2001:db8:1:2::/64"),
        ("ipv6:[::ffff:203.0.113.7]:443", "ipv4:203.0.113.7"),
        ("ipv6:[fe80::1%eth0]:443", "ipv6:fe80::/64"),
        ("unix:/run/rollnet.sock", "unix:/run/rollnet.sock"),
        ("unix:/" + "x" * 100, "unix:/" + "x" * 100),
    ],
)
def test_network_of_a_peer(peer: str, network: str) -> None:
    assert verifier.network_of(peer) == network


def test_remembered_look_ups_keep_only_short_strings() -> None:
    """A connection's peer and a node's key are remembered across calls; a caller cannot fill
    those caches with long strings of its own making."""
    verifier._network_of.cache_clear()
    verifier._decode_known_key.cache_clear()
    for port in (1, 2, 1):
        assert verifier.network_of(f"ipv4:203.0.113.7:{port}") == "ipv4:203.0.113.7"
    assert verifier.network_of("unix:/" + "x" * 100) == "unix:/" + "x" * 100
    assert verifier._network_of.cache_info().currsize == 2
    assert verifier._network_of.cache_info().hits == 1
    identity = Identity.generate()
    signed = dict(RequestSigner(identity, NETWORK_ID).sign("/m", b"body").as_metadata())
    headers = verifier._signing_headers(list(signed.items()))
    for _ in range(2):
        assert verifier._decode_headers(headers)[0] == identity.public_key
    assert verifier._decode_known_key.cache_info().currsize == 1
    long_key = {**headers, KEY_HEADER: b64url_encode(b"k" * 3000)}
    with pytest.raises(verifier.VerificationError, match="32-byte Ed25519 public key"):
        verifier._decode_headers(long_key)
    assert verifier._decode_known_key.cache_info().currsize == 1
