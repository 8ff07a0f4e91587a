"""The coordinator suite's cases: health, reflection."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2

from rollnet.sdk.conformance.coordinator._base import case, expect
from rollnet.sdk.conformance.suite import CaseFailure
from rollnet.sdk.conformance.target import HEALTH_WATCH, Target


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
