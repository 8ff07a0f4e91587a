"""The generated client layer covers every unary RPC, typed by its own request and response."""

from __future__ import annotations

import inspect
import re
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import Message

from rollnet.sdk import client as client_module
from rollnet.sdk._service_client import ServiceClient
from rollnet.v1 import (
    checkpoint_service_pb2,
    commitment_service_pb2,
    ledger_service_pb2,
    node_service_pb2,
    rollout_service_pb2,
    task_service_pb2,
    validation_service_pb2,
)

MODULES = [
    checkpoint_service_pb2,
    commitment_service_pb2,
    ledger_service_pb2,
    node_service_pb2,
    rollout_service_pb2,
    task_service_pb2,
    validation_service_pb2,
]


def unary_rpcs() -> list[tuple[ServiceDescriptor, str, str, str]]:
    found = []
    for module in MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                if method.client_streaming or method.server_streaming:
                    continue
                found.append(
                    (service, method.name, method.input_type.name, method.output_type.name)
                )
    return found


@pytest.mark.parametrize(("service", "rpc", "request_type", "response_type"), unary_rpcs())
def test_every_unary_rpc_has_a_typed_client_method(
    service: ServiceDescriptor, rpc: str, request_type: str, response_type: str
) -> None:
    client_class = getattr(client_module, service.name.removesuffix("Service") + "Client")
    name = re.sub(r"(?<!^)(?=[A-Z])", "_", rpc).lower()
    method = getattr(client_class, name)
    assert inspect.iscoroutinefunction(method)
    signature = inspect.signature(method)
    assert request_type in str(signature.parameters["request"].annotation)
    assert response_type in str(signature.return_annotation)
    assert list(signature.parameters)[2:] == ["timeout", "metadata", "retry"]
    assert method.__doc__, f"{service.name}.{rpc} has no docstring"


@pytest.mark.parametrize(
    ("client_class", "call", "request_type"),
    [
        (client_module.TaskClient, "pull_task", task_service_pb2.PullTaskRequest),
        (
            client_module.ValidationClient,
            "pull_validation_job",
            validation_service_pb2.PullValidationJobRequest,
        ),
    ],
)
async def test_a_long_poll_gets_a_default_deadline_covering_its_wait(
    client_class: type[ServiceClient], call: str, request_type: type[Message]
) -> None:
    """A request with a ``wait`` is a long poll: without ``timeout``, its call may last the wait
    and a margin (never less than the client's timeout); the wait is capped at a day."""
    deadlines: list[float | None] = []

    class Recording(client_class):  # type: ignore[valid-type,misc]
        async def _unary(self, method: str, request: Any, response_type: Any, **kw: Any) -> Any:
            deadlines.append(kw.get("default_timeout"))
            return response_type()

    channel = grpc.aio.insecure_channel("127.0.0.1:1")
    try:
        for timeout, wait in [(30.0, 60), (30.0, 5), (30.0, 10**9), (None, 60)]:
            request = request_type(wait=duration_pb2.Duration(seconds=wait))
            await getattr(Recording(channel, timeout=timeout), call)(request)
    finally:
        await channel.close()
    assert deadlines == [70.0, 30.0, 86_410.0, None]
