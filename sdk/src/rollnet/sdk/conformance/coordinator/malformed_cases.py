"""The coordinator suite's cases: malformed input."""

from __future__ import annotations

import math

from rollnet.sdk.conformance.coordinator._base import C, case, expect
from rollnet.sdk.conformance.suite import CaseFailure
from rollnet.sdk.conformance.target import GET_NODE, HEARTBEAT, PULL_TASK, Target
from rollnet.sdk.conformance.wire import describe, refusal
from rollnet.sdk.errors import RollnetError
from rollnet.v1 import node_service_pb2, task_service_pb2


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
