"""Full gRPC method names of protocol v1, taken from the generated descriptors, and the default
method → roles policy a coordinator's :class:`~rollnet.sdk.verifier.RequestVerifier` enforces."""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

from rollnet.v1 import (
    blob_service_pb2,
    checkpoint_service_pb2,
    commitment_service_pb2,
    common_pb2,
    ledger_service_pb2,
    node_service_pb2,
    rollout_service_pb2,
    task_service_pb2,
    validation_service_pb2,
)

_SERVICE_MODULES: tuple[ModuleType, ...] = (
    node_service_pb2,
    task_service_pb2,
    blob_service_pb2,
    commitment_service_pb2,
    validation_service_pb2,
    checkpoint_service_pb2,
    rollout_service_pb2,
    ledger_service_pb2,
)


def _all_methods() -> frozenset[str]:
    paths = set()
    for module in _SERVICE_MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                paths.add(f"/{service.full_name}/{method.name}")
    return frozenset(paths)


ALL_METHODS: frozenset[str] = _all_methods()
"""Every RPC of protocol v1 as a full method path (``/rollnet.v1.NodeService/RegisterNode``)."""


def method_path(service: str, rpc: str) -> str:
    """The full method path of ``rpc`` in ``service`` (``"NodeService"``, ``"RegisterNode"``).

    Raises ``KeyError`` when protocol v1 has no such RPC, so a typo fails at import time.
    """
    path = f"/rollnet.v1.{service}/{rpc}"
    if path not in ALL_METHODS:
        raise KeyError(f"protocol v1 has no RPC {service}.{rpc}")
    return path


REGISTER_NODE = method_path("NodeService", "RegisterNode")
"""The one method an unknown key may call."""

EXEMPT_PREFIXES: frozenset[str] = frozenset(
    {
        "/grpc.health.v1.Health/",
        "/grpc.reflection.v1alpha.ServerReflection/",
        "/grpc.reflection.v1.ServerReflection/",
    }
)
"""Method prefixes served without a signature: standard health checking and reflection."""

_W = common_pb2.ROLE_WORKER
_V = common_pb2.ROLE_VALIDATOR
_T = common_pb2.ROLE_TRAINER
_O = common_pb2.ROLE_OPERATOR
_ANY = frozenset({_W, _V, _T, _O})

_DEFAULT_POLICY: dict[tuple[str, str], frozenset[int]] = {
    ("NodeService", "RegisterNode"): _ANY,
    ("NodeService", "Heartbeat"): _ANY,
    ("NodeService", "DeregisterNode"): _ANY,
    # Non-operators may only read themselves; the handler enforces that finer rule.
    ("NodeService", "GetNode"): _ANY,
    ("NodeService", "ListNodes"): frozenset({_O}),
    ("NodeService", "EjectNode"): frozenset({_O}),
    ("NodeService", "BanNode"): frozenset({_O}),
    ("NodeService", "ReinstateNode"): frozenset({_O}),
    ("TaskService", "PullTask"): frozenset({_W}),
    ("TaskService", "ReportProgress"): frozenset({_W}),
    ("TaskService", "FailTask"): frozenset({_W}),
    # Workers upload rollout batches, trainers checkpoint shards.
    ("BlobService", "UploadBlob"): frozenset({_W, _T}),
    ("BlobService", "GetBlob"): _ANY,
    ("CommitmentService", "SubmitCommitment"): frozenset({_W}),
    ("CommitmentService", "GetCommitment"): _ANY,
    ("ValidationService", "PullValidationJob"): frozenset({_V}),
    ("ValidationService", "SubmitVerdict"): frozenset({_V}),
    ("CheckpointService", "PublishCheckpoint"): frozenset({_T}),
    ("CheckpointService", "GetLatestCheckpoint"): _ANY,
    ("CheckpointService", "GetCheckpoint"): _ANY,
    ("CheckpointService", "WatchCheckpoints"): _ANY,
    ("RolloutService", "RequestRollouts"): frozenset({_T}),
    ("RolloutService", "StreamRollouts"): frozenset({_T}),
    ("LedgerService", "ListEntries"): _ANY,
    ("LedgerService", "GetBalance"): _ANY,
    ("LedgerService", "GetChainHead"): _ANY,
}


def default_method_policy() -> Mapping[str, frozenset[int]]:
    """Which roles (``rollnet.v1.Role`` values) may call each RPC, as the protocol comments say.

    Covers every method in :data:`ALL_METHODS`. A coordinator may pass its own mapping instead.
    """
    return {method_path(service, rpc): roles for (service, rpc), roles in _DEFAULT_POLICY.items()}
