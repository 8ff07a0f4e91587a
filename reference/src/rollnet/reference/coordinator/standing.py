"""A node's standing: the verified caller, the refusals of nodes that may not work (or may not
reach other nodes' objects, or are off an allow-list), and ejection."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from rollnet.ledger import nodes, tasks, validation
from rollnet.ledger.enums import NodeRole, NodeState
from rollnet.ledger.models import Node
from rollnet.ledger.nodes import NodeStanding
from rollnet.reference.coordinator.config import SAMPLE_CONFIG, CoordinatorConfig
from rollnet.reference.coordinator.refusal import Refusal
from rollnet.reference.coordinator.serde import ROLE_FROM_DB
from rollnet.sdk.errors import ErrorReason
from rollnet.sdk.methods import may_reach_others


@dataclass(frozen=True, slots=True)
class Caller:
    """The verified identity of the node making a call."""

    node_id: str
    public_key: bytes
    role: NodeRole | None


#: States in which a node may not work (refused by :func:`refuse_state`).
REFUSED_STATES = frozenset({NodeState.BANNED, NodeState.EJECTED, NodeState.DEREGISTERED})


def refuse_unusable(row: Node | NodeStanding) -> None:
    """Refuse a call from a node that may not work (ejected, banned, deregistered)."""
    refuse_state(row.id, row.state)


def refuse_state(node_id: str, state: NodeState) -> None:
    """Refuse a call from node ``node_id`` if ``state`` may not work."""
    if state is NodeState.BANNED:
        raise Refusal(ErrorReason.NODE_BANNED, f"node {node_id} is banned")
    if state is NodeState.EJECTED:
        raise Refusal(ErrorReason.NODE_EJECTED, f"node {node_id} was ejected")
    if state is NodeState.DEREGISTERED:
        raise Refusal(
            ErrorReason.NODE_DEREGISTERED, f"node {node_id} deregistered; call RegisterNode"
        )


def off_allow_list(
    config: CoordinatorConfig,
    role: NodeRole,
    node_id: str,
    public_key: bytes,
    *,
    now: bool = False,
) -> str:
    """Why ``role`` is not permitted to this key by the configured allow-lists ("" when it is,
    or the role needs none). ``now``: said of a node registered before the list changed."""
    allow = {
        NodeRole.VALIDATOR: config.validators,
        NodeRole.TRAINER: config.trainers,
        NodeRole.OPERATOR: config.operators,
    }.get(role)
    if allow is None or node_id in allow or public_key.hex() in allow:
        return ""
    return (
        f"key {node_id} is {'no longer' if now else 'not'} on the coordinator's {role} allow-list: "
        f'add "{node_id}" to {role}s = [...] in the coordinator\'s TOML file (--config; sample: '
        f"{SAMPLE_CONFIG}) and restart it"
    )


def refuse_unless_reaching_others(method: str, caller: Caller, what: str) -> None:
    """Refuse (``ROLE_NOT_ALLOWED``) a caller whose role may use ``method`` on its own objects
    only (the roles table, :data:`rollnet.sdk.methods.ROLE_TABLE`)."""
    role = ROLE_FROM_DB.get(caller.role) if caller.role is not None else None
    if role is None or not may_reach_others(method, role):
        raise Refusal(
            ErrorReason.ROLE_NOT_ALLOWED,
            f"role {caller.role or 'unregistered'} may not {what} ({method}: own only)",
        )


def refuse_unless_in_standing(session: Session, caller: Caller) -> None:
    """Refuse work from a node that is not registered, or is ejected, banned or deregistered,
    read in the caller's transaction (the key cache may be another replica's, 30 s old)."""
    standing = nodes.get_standing(session, caller.node_id)
    if standing is None:
        raise Refusal(ErrorReason.UNKNOWN_KEY, "node is not registered")
    refuse_unusable(standing)


def eject_node(
    session: Session,
    node_id: str,
    state: NodeState,
    reason: str,
    *,
    now: datetime,
    max_attempts: int,
    max_validation_attempts: int,
) -> None:
    """Move a node to EJECTED or BANNED (never back from BANNED) and take back its leases."""
    from_states = [s for s in NodeState if s is not NodeState.BANNED]
    if state is NodeState.EJECTED:
        from_states = [s for s in from_states if s is not NodeState.EJECTED]
    nodes.set_node_state(session, node_id, state, now=now, from_states=from_states)
    nodes.set_state_reason(session, node_id, reason)
    tasks.requeue_leases_of_node(session, node_id, now=now, max_attempts=max_attempts)
    validation.requeue_validation_jobs_of_node(
        session, node_id, now=now, max_attempts=max_validation_attempts
    )
