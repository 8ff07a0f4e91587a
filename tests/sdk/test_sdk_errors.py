"""Rich errors: the reason enum mirrors the protocol, and details round-trip into typed errors."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest
from sdk_testing import PlannedFailure, Swarm

from rollnet.sdk import (
    REASON_CODES,
    ErrorReason,
    FieldViolation,
    InvalidArgument,
    NodeClient,
    NotFound,
    ResourceExhausted,
    RetryPolicy,
    RollnetError,
    Unavailable,
    error_type,
)
from rollnet.v1 import errors_pb2, node_service_pb2

PROTO = Path(__file__).resolve().parents[2] / "protos" / "rollnet" / "v1" / "errors.proto"
NO_RETRY = RetryPolicy.no_retry()


def test_error_reason_mirrors_the_generated_enum_exactly() -> None:
    generated = [
        name.removeprefix("ERROR_REASON_")
        for name in errors_pb2.ErrorReason.keys()  # noqa: SIM118 (an EnumTypeWrapper, not a dict)
        if name != "ERROR_REASON_UNSPECIFIED"
    ]
    assert [member.value for member in ErrorReason] == generated
    assert [member.name for member in ErrorReason] == generated


def test_reason_codes_match_the_proto_comments() -> None:
    pairs = re.findall(r"//\s*([A-Z_]+):[^\n]*\n\s*ERROR_REASON_([A-Z_]+)\s*=", PROTO.read_text())
    documented = {name: code for code, name in pairs}
    assert {reason.value: code.name for reason, code in REASON_CODES.items()} == documented
    assert set(REASON_CODES) == set(ErrorReason)


def test_every_status_code_has_its_exception_type() -> None:
    for code in grpc.StatusCode:
        if code is grpc.StatusCode.OK:
            continue
        kind = error_type(code)
        assert kind is not RollnetError
        assert kind.__name__.lower() == code.name.replace("_", "").lower()


async def test_bad_request_details_round_trip(swarm: Swarm) -> None:
    violations = (
        FieldViolation("hardware.accelerators[0].memory_bytes", "must be positive", "RANGE"),
        FieldViolation("software_version", "required"),
    )
    swarm.nodes.failures.append(
        PlannedFailure(
            grpc.StatusCode.INVALID_ARGUMENT,
            ErrorReason.INVALID_FIELDS,
            "two fields are invalid",
            field_violations=violations,
            metadata={"node_id": "n1"},
        )
    )
    async with swarm.channel(swarm.worker) as channel:
        with pytest.raises(InvalidArgument) as info:
            await NodeClient(channel).get_node(node_service_pb2.GetNodeRequest(), retry=NO_RETRY)
    error = info.value
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert error.reason is ErrorReason.INVALID_FIELDS
    assert error.message == "two fields are invalid"
    assert error.metadata == {"node_id": "n1"}
    assert error.field_violations == violations
    assert error.retry_after is None
    assert isinstance(error.__cause__, grpc.aio.AioRpcError)
    assert error.status is not None
    assert error.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]


async def test_retry_info_round_trips(swarm: Swarm) -> None:
    swarm.nodes.failures.append(
        PlannedFailure(
            grpc.StatusCode.RESOURCE_EXHAUSTED, ErrorReason.RATE_LIMITED, retry_after=2.5
        )
    )
    async with swarm.channel(swarm.worker) as channel:
        with pytest.raises(ResourceExhausted) as info:
            await NodeClient(channel).get_node(node_service_pb2.GetNodeRequest(), retry=NO_RETRY)
    assert info.value.retry_after == 2.5
    assert info.value.reason == ErrorReason.RATE_LIMITED


async def test_unknown_reason_is_kept_as_text(swarm: Swarm) -> None:
    swarm.nodes.failures.append(PlannedFailure(grpc.StatusCode.NOT_FOUND, "FROM_THE_FUTURE"))
    async with swarm.channel(swarm.worker) as channel:
        with pytest.raises(NotFound) as info:
            await NodeClient(channel).get_node(node_service_pb2.GetNodeRequest(), retry=NO_RETRY)
    assert info.value.reason == "FROM_THE_FUTURE"
    assert not isinstance(info.value.reason, ErrorReason)


async def test_error_without_details_still_types(swarm: Swarm) -> None:
    """Nothing listening: Unavailable with no reason, as no details came back."""
    async with swarm.channel(swarm.worker, target="127.0.0.1:1", timeout=2.0) as channel:
        with pytest.raises(Unavailable) as info:
            await NodeClient(channel).get_node(node_service_pb2.GetNodeRequest(), retry=NO_RETRY)
    assert info.value.reason == ""
    assert info.value.status is None
