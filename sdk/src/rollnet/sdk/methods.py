"""Full gRPC method names of protocol v1, taken from the generated descriptors, and the default
method → roles policy a coordinator's :class:`~rollnet.sdk.verifier.RequestVerifier` enforces."""

from __future__ import annotations

import enum
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

_W: int = common_pb2.ROLE_WORKER
_V: int = common_pb2.ROLE_VALIDATOR
_T: int = common_pb2.ROLE_TRAINER
_O: int = common_pb2.ROLE_OPERATOR
_R: int = common_pb2.ROLE_RELAY
ROLE_ORDER: tuple[int, ...] = (_W, _V, _T, _O, _R)
"""The roles in the order the docs' roles table names them."""


class Access(enum.Enum):
    """How far a role may reach with a method."""

    ALL = "all"
    """Any object the method names (any node, any commitment)."""
    OWN = "own"
    """Only the caller's own: its own node (GetNode), its own commitments (GetCommitment). The
    handler refuses another's with PERMISSION_DENIED / ``ROLE_NOT_ALLOWED``."""


_A, _OWN = Access.ALL, Access.OWN
_ANY = {_W: _A, _V: _A, _T: _A, _O: _A, _R: _A}
"""Every role. Relays cache and serve checkpoints: besides keeping themselves registered they
only read (checkpoints, blobs, the public ledger), so every method that leases work, submits
or judges it leaves them out."""

_ROLE_TABLE: dict[tuple[str, str], dict[int, Access]] = {
    ("NodeService", "RegisterNode"): _ANY,
    ("NodeService", "Heartbeat"): _ANY,
    ("NodeService", "DeregisterNode"): _ANY,
    ("NodeService", "GetNode"): {_W: _OWN, _V: _OWN, _T: _OWN, _O: _A, _R: _OWN},
    ("NodeService", "ListNodes"): {_O: _A},
    ("NodeService", "EjectNode"): {_O: _A},
    ("NodeService", "BanNode"): {_O: _A},
    ("NodeService", "ReinstateNode"): {_O: _A},
    ("TaskService", "PullTask"): {_W: _A},
    ("TaskService", "ReportProgress"): {_W: _A},
    ("TaskService", "FailTask"): {_W: _A},
    # Workers upload rollout batches, trainers checkpoint shards (the handler tells them apart).
    ("BlobService", "UploadBlob"): {_W: _A, _T: _A},
    ("BlobService", "GetBlob"): _ANY,
    ("CommitmentService", "SubmitCommitment"): {_W: _A},
    # A worker reads its own commitments; validators judge and operators oversee any. Trainers
    # receive accepted work through StreamRollouts, not by reading workers' commitments.
    ("CommitmentService", "GetCommitment"): {_W: _OWN, _V: _A, _O: _A},
    ("ValidationService", "PullValidationJob"): {_V: _A},
    ("ValidationService", "SubmitVerdict"): {_V: _A},
    ("CheckpointService", "PublishCheckpoint"): {_T: _A},
    ("CheckpointService", "GetLatestCheckpoint"): _ANY,
    ("CheckpointService", "GetCheckpoint"): _ANY,
    ("CheckpointService", "WatchCheckpoints"): _ANY,
    ("RolloutService", "RequestRollouts"): {_T: _A},
    ("RolloutService", "StreamRollouts"): {_T: _A},
    ("LedgerService", "ListEntries"): _ANY,
    ("LedgerService", "GetBalance"): _ANY,
    ("LedgerService", "GetChainHead"): _ANY,
}

ROLE_TABLE: Mapping[str, Mapping[int, Access]] = {
    method_path(service, rpc): dict(access) for (service, rpc), access in _ROLE_TABLE.items()
}
"""The roles table of docs/protocol.md (*Services*), the one source of who may call what: full
method path → the ``rollnet.v1.Role`` values that may call it, each with its
:class:`Access`. A role absent from a method's entry is refused ``ROLE_NOT_ALLOWED`` by the
verifier; ``Access.OWN`` is narrowed by the handler."""


def may_reach_others(method: str, role: int) -> bool:
    """Whether ``role`` may name another node's object with ``method`` (``Access.ALL``)."""
    return ROLE_TABLE.get(method, {}).get(role) is Access.ALL


def roles_text(method: str) -> str:
    """The docs' *Roles* cell of ``method``: "all", or the roles in table order, "(own)" after
    those limited to their own objects."""
    access = ROLE_TABLE[method]
    if all(access.get(role) is Access.ALL for role in ROLE_ORDER):
        return "all (and any new key)" if method == REGISTER_NODE else "all"
    names = {_W: "worker", _V: "validator", _T: "trainer", _O: "operator", _R: "relay"}
    return ", ".join(
        names[role] + (" (own)" if access[role] is Access.OWN else "")
        for role in ROLE_ORDER
        if role in access
    )


def default_method_policy() -> Mapping[str, frozenset[int]]:
    """Which roles (``rollnet.v1.Role`` values) may call each RPC: :data:`ROLE_TABLE`'s roles.

    Covers every method in :data:`ALL_METHODS`. A coordinator may pass its own mapping instead.
    """
    return {method: frozenset(access) for method, access in ROLE_TABLE.items()}
