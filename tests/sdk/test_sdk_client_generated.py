"""The generated client layer covers every unary RPC, typed by its own request and response."""

from __future__ import annotations

import inspect
import re

import pytest
from google.protobuf.descriptor import ServiceDescriptor

from rollnet.sdk import client as client_module
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
