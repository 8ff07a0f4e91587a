"""Bad input on every RPC of the coordinator, on SQLite and PostgreSQL (issue 25).

For each RPC the service descriptors list (a new RPC without a strategy here fails), hypothesis
sends requests built byte by byte from the request's descriptor (every field: edge and random
values, NUL and invalid UTF-8, out-of-range numbers and durations, undeclared enum numbers, huge
repeated fields and maps), alone or merged over an honest request naming live objects, and
damaged on the wire (cut short, wrong wire types, impossible tags, above the message cap). Most
calls are signed by a node whose role may make them, so they reach the handlers; others are
signed by the wrong role or an unknown key, forged, tampered with, or not signed at all.

The property: the coordinator never answers INTERNAL or UNKNOWN, every refusal carries the
documented details (INVALID_FIELDS with field violations when the message parses), no call but
a long poll hangs, and a health check right after each call answers SERVING.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from coordinator_fuzzing import (
    MESSAGE_CAP,
    Swarm,
    allowed_roles,
    judge,
    methods,
    parses,
    start_swarm,
)
from fuzz_testing import LoopThread, fuzz_settings
from hypothesis import event, given
from hypothesis import strategies as st
from wire_strategies import mangled, message

from rollnet.sdk.conformance.wire import Tamper, refusal
from rollnet.sdk.identity import Identity
from rollnet.sdk.methods import REGISTER_NODE
from rollnet.sdk.signing import SIGNING_HEADERS
from rollnet.v1 import blob_service_pb2

METHODS = methods()
#: Examples per RPC and database in CI (times ROLLNET_FUZZ_SCALE).
EXAMPLES = 8
_CALLERS = ["allowed"] * 6 + ["other role", "unknown key", "unsigned", "garbage", "forged"]
_CALLERS += ["tampered"]
_ASCII = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=90)


@pytest.fixture(scope="module")
def swarm(loop_thread: LoopThread, module_db_url: str, module_dir: Path) -> Iterator[Swarm]:
    running = loop_thread.run(start_swarm(loop_thread, module_db_url, module_dir), timeout=300)
    try:
        yield running
    finally:
        running.close()


def _caller(swarm: Swarm, data: st.DataObject, path: str) -> tuple[str, Identity]:
    """How the call is signed, and by whom, as drawn."""
    kind = data.draw(st.sampled_from(_CALLERS), label="caller")
    allowed = [role for role in allowed_roles(path) if role in swarm.peers]
    if path == REGISTER_NODE or kind == "unknown key":
        return kind, Identity.generate()
    if kind == "other role":
        others = [peer for role, peer in swarm.peers.items() if role not in allowed]
        if others:
            return kind, data.draw(st.sampled_from(others), label="peer").identity
        return kind, Identity.generate()
    return kind, swarm.peers[data.draw(st.sampled_from(allowed), label="role")].identity


def _headers(
    swarm: Swarm, data: st.DataObject, kind: str, identity: Identity, path: str, first: bytes
) -> list[tuple[str, str]]:
    """The call's signing headers: honest, forged, tampered, garbage or none."""
    if kind == "unsigned":
        return []
    if kind == "garbage":
        return data.draw(st.lists(st.tuples(st.sampled_from(SIGNING_HEADERS), _ASCII)))
    tamper = None
    if kind == "forged":
        tamper = Tamper(signer=Identity.generate())
    elif kind == "tampered":
        tamper = Tamper(signed_body=first + b"\x00")
    return swarm.headers(identity, path, first, tamper)


def test_every_rpc_is_fuzzed(swarm: Swarm) -> None:
    missing = sorted(set(METHODS) - set(swarm.bases))
    assert not missing, f"RPCs without a fuzz strategy (add them to start_swarm's bases): {missing}"


@pytest.mark.parametrize("path", sorted(METHODS))
def test_rpc_survives_bad_input(swarm: Swarm, path: str) -> None:
    method = METHODS[path]
    base = swarm.bases.get(path)
    assert base is not None, f"{path} has no fuzz strategy"
    fuzzed = message(method.input_type, swarm.pools)

    @fuzz_settings(EXAMPLES)
    @given(data=st.data())
    def property(data: st.DataObject) -> None:
        kind, identity = _caller(swarm, data, path)
        honest = [m.SerializeToString(deterministic=True) for m in base(identity)]

        def body(index: int) -> st.SearchStrategy[bytes]:
            prefix = honest[min(index, len(honest) - 1)]
            merged = st.one_of(st.just(prefix), fuzzed.map(lambda extra: prefix + extra), fuzzed)
            return mangled(method.input_type, merged, oversize=MESSAGE_CAP + 1)

        if method.client_streaming:
            count = data.draw(st.integers(0, 3), label="messages")
            bodies = [data.draw(body(i), label=f"message {i}") for i in range(count)]
        else:
            bodies = [data.draw(body(0), label="message")]
        headers = _headers(swarm, data, kind, identity, path, bodies[0] if bodies else b"")
        error = swarm.call(method, path, bodies, headers)
        event("OK" if error is None else f"{error.code.name}/{error.reason or '-'}")
        oversized = any(len(b) > MESSAGE_CAP for b in bodies)
        judge(path, error, parsed=parses(method, bodies), oversized=oversized)
        swarm.serving()

    property()


def test_get_blob_past_its_end_names_the_offset(swarm: Swarm) -> None:
    # Regression: INVALID_FIELDS without a field violation (found by the property above).
    path = "/rollnet.v1.BlobService/GetBlob"
    digest = swarm.pools.blobs[0]
    body = blob_service_pb2.GetBlobRequest(blake3=digest, offset=2**31 - 1).SerializeToString()
    # A new worker: the properties may have banned or deregistered the swarm's own.
    worker = swarm.loop.run(swarm.target.worker()).identity
    error = swarm.call(METHODS[path], path, [body], swarm.headers(worker, path, body))
    assert error is not None
    refusal(error, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELDS", field="offset")
