"""Node repository: registration, heartbeats and state changes.

Functions take a session and run inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Float, and_, bindparam, case, cast, or_, select, update
from sqlalchemy.orm import Session

from rollnet.ledger.enums import HEARTBEAT_REVIVABLE_STATES, NodeRole, NodeState
from rollnet.ledger.models import HASH_LENGTH, NODE_ID_LENGTH, Node, table_of
from rollnet.ledger.prepared import Prepared

_LOWER_HEX = "0123456789abcdef"


def register_node(
    session: Session,
    *,
    node_id: str,
    public_key: bytes,
    role: NodeRole,
    protocol_version: str,
    software_version: str,
    capabilities: Collection[str],
    hardware: Mapping[str, Any],
    pool: str | None,
    now: datetime,
    initial_state: NodeState = NodeState.PENDING,
) -> Node:
    """Create the node, or refresh the reports of an already registered one.

    Re-registering never changes a node's state, role or trust: an ejected or banned node stays
    ejected or banned. Raises :class:`ValueError` if ``node_id`` is not 32 lowercase hex
    characters, the key not 32 bytes, or ``node_id`` is registered with another key.
    """
    if len(node_id) != NODE_ID_LENGTH or node_id.strip(_LOWER_HEX):
        raise ValueError(f"node id {node_id!r} is not {NODE_ID_LENGTH} lowercase hex characters")
    if len(public_key) != HASH_LENGTH:
        raise ValueError(f"an Ed25519 public key is {HASH_LENGTH} bytes, got {len(public_key)}")
    node = session.get(Node, node_id, with_for_update=True)
    if node is None:
        node = Node(
            id=node_id,
            public_key=public_key,
            role=role,
            state=initial_state,
            trust=0.0,
            accepted_streak=0,
            protocol_version=protocol_version,
            software_version=software_version,
            capabilities=sorted(capabilities),
            hardware=dict(hardware),
            pool=pool,
            registered_at=now,
            last_heartbeat_at=now,
            state_changed_at=now,
        )
        session.add(node)
        session.flush()
        return node
    if node.public_key != public_key:
        raise ValueError(f"node {node_id} is registered with a different public key")
    node.protocol_version = protocol_version
    node.software_version = software_version
    node.capabilities = sorted(capabilities)
    node.hardware = dict(hardware)
    node.pool = pool
    session.flush()
    return node


def get_node(session: Session, node_id: str) -> Node | None:
    """The node with ``node_id``, if registered."""
    return session.get(Node, node_id)


def get_keys(
    session: Session, node_ids: Sequence[str]
) -> dict[str, tuple[bytes, NodeRole, NodeState]]:
    """Public key, role and state of each registered node among ``node_ids`` (one SELECT)."""
    if not node_ids:
        return {}
    return {
        node_id: (bytes(public_key), NodeRole(role), NodeState(state))
        for node_id, public_key, role, state in _KEYS.rows(session, {"ids": list(node_ids)})
    }


@dataclass(frozen=True, slots=True)
class NodeStanding:
    """What a call on the work path needs to know of its node (no ORM object is built)."""

    id: str
    role: NodeRole
    state: NodeState
    capabilities: list[str]
    accepted_streak: int


def get_standing(session: Session, node_id: str) -> NodeStanding | None:
    """The standing of the node with ``node_id``, if registered (one prebuilt SELECT)."""
    row = _STANDING.one_or_none(session, {"node_id": node_id})
    return None if row is None else _standing_of(row)


def get_standings(session: Session, node_ids: Collection[str]) -> dict[str, NodeStanding]:
    """The standing of each registered node among ``node_ids`` (one prebuilt SELECT)."""
    if not node_ids:
        return {}
    rows = _STANDINGS.rows(session, {"ids": sorted(set(node_ids))})
    return {row[0]: _standing_of(row) for row in rows}


def _standing_of(row: tuple[Any, ...]) -> NodeStanding:
    found_id, role, state, capabilities, accepted_streak = row
    return NodeStanding(
        id=found_id,
        role=NodeRole(role),
        state=NodeState(state),
        capabilities=list(capabilities),
        accepted_streak=accepted_streak,
    )


_N = table_of(Node).c
_REVIVE_STATEMENT = (
    update(table_of(Node))
    .where(
        _N.id.in_(bindparam("ids", expanding=True)),
        _N.state.in_(sorted(HEARTBEAT_REVIVABLE_STATES)),
    )
    .values(
        last_heartbeat_at=bindparam("now"),
        state=NodeState.ACTIVE,
        state_changed_at=case(
            (_N.state == NodeState.ACTIVE, _N.state_changed_at), else_=bindparam("now")
        ),
    )
)
_REVIVE_WITH_DEADLINES = Prepared(
    _REVIVE_STATEMENT.values(suspect_at=bindparam("suspect"), offline_at=bindparam("offline"))
)
_REVIVE = Prepared(_REVIVE_STATEMENT)
_REVIVE_WITH_DEADLINES_AND_STEP = Prepared(
    _REVIVE_STATEMENT.values(
        suspect_at=bindparam("suspect"),
        offline_at=bindparam("offline"),
        checkpoint_step=bindparam("step"),
    )
)
#: The largest checkpoint step a node can be recorded at (BIGINT); larger reports are capped.
MAX_RECORDED_STEP = 2**63 - 1
_KEYS = Prepared(
    select(_N.id, _N.public_key, _N.role, _N.state).where(
        _N.id.in_(bindparam("ids", expanding=True))
    )
)
_STATES = Prepared(
    select(_N.id, _N.state, _N.role, _N.state_reason).where(
        _N.id.in_(bindparam("ids", expanding=True))
    )
)
_STANDING_COLUMNS = (_N.id, _N.role, _N.state, _N.capabilities, _N.accepted_streak)
_STANDING = Prepared(select(*_STANDING_COLUMNS).where(_N.id == bindparam("node_id")))
_STANDINGS = Prepared(select(*_STANDING_COLUMNS).where(_N.id.in_(bindparam("ids", expanding=True))))


def list_nodes(
    session: Session, *, role: NodeRole | None = None, state: NodeState | None = None
) -> list[Node]:
    """Nodes, optionally filtered by role and state, ordered by id."""
    query = select(Node).order_by(Node.id)
    if role is not None:
        query = query.where(Node.role == role)
    if state is not None:
        query = query.where(Node.state == state)
    return list(session.scalars(query))


def record_heartbeat(session: Session, node_id: str, *, now: datetime) -> bool:
    """Record a heartbeat and make the node active — unless it is ejected, banned or gone.

    One conditional UPDATE, so a heartbeat racing an operator's ban can never revive the node.
    Returns whether the node was in a revivable state (False: unknown or terminal node).
    """
    result = session.execute(
        update(Node)
        .where(Node.id == node_id, Node.state.in_(sorted(HEARTBEAT_REVIVABLE_STATES)))
        .values(
            last_heartbeat_at=now,
            state=NodeState.ACTIVE,
            state_changed_at=case(
                (Node.state == NodeState.ACTIVE, Node.state_changed_at), else_=now
            ),
        )
        .execution_options(synchronize_session=False)
    )
    return _rowcount(result) == 1


def set_node_state(
    session: Session,
    node_id: str,
    state: NodeState,
    *,
    now: datetime,
    from_states: Collection[NodeState] | None = None,
) -> bool:
    """Move a node to ``state`` (only from ``from_states`` when given); returns whether it moved."""
    query = update(Node).where(Node.id == node_id)
    if from_states is not None:
        query = query.where(Node.state.in_(sorted(from_states)))
    result = session.execute(
        query.values(state=state, state_changed_at=now).execution_options(synchronize_session=False)
    )
    return _rowcount(result) == 1


@dataclass(frozen=True, slots=True)
class StaleNodes:
    """Node ids moved by :func:`mark_stale_nodes`."""

    suspect: list[str]
    offline: list[str]


def mark_stale_nodes(
    session: Session, *, suspect_before: datetime, offline_before: datetime, now: datetime
) -> StaleNodes:
    """Active nodes past their ``suspect_at`` become suspect; active or suspect nodes past their
    ``offline_at`` go offline (the caller then requeues their leases). Nodes without per-node
    deadlines are judged by ``suspect_before`` / ``offline_before`` (silent since then)."""
    offline = session.scalars(
        update(Node)
        .where(
            Node.state.in_([NodeState.ACTIVE, NodeState.SUSPECT]),
            or_(
                and_(Node.offline_at.is_not(None), Node.offline_at < now),
                and_(Node.offline_at.is_(None), Node.last_heartbeat_at < offline_before),
            ),
        )
        .values(state=NodeState.OFFLINE, state_changed_at=now)
        .returning(Node.id)
        .execution_options(synchronize_session=False)
    ).all()
    suspect = session.scalars(
        update(Node)
        .where(
            Node.state == NodeState.ACTIVE,
            or_(
                and_(Node.suspect_at.is_not(None), Node.suspect_at < now),
                and_(Node.suspect_at.is_(None), Node.last_heartbeat_at < suspect_before),
            ),
        )
        .values(state=NodeState.SUSPECT, state_changed_at=now)
        .returning(Node.id)
        .execution_options(synchronize_session=False)
    ).all()
    return StaleNodes(suspect=sorted(suspect), offline=sorted(offline))


def set_trust(session: Session, node_id: str, *, trust: float, accepted_streak: int) -> bool:
    """Store a node's trust (in [0, 1]) and accepted streak; returns whether the node exists."""
    if not 0.0 <= trust <= 1.0:
        raise ValueError(f"trust must be in [0, 1], got {trust}")
    result = session.execute(
        update(Node)
        .where(Node.id == node_id)
        .values(trust=trust, accepted_streak=accepted_streak)
        .execution_options(synchronize_session=False)
    )
    return _rowcount(result) == 1


def record_accepted(session: Session, node_id: str, trusted_streak: int) -> int | None:
    """One more accepted commitment for ``node_id``: its streak grows by one and its trust
    becomes ``min(1, streak / trusted_streak)``, in one UPDATE that reads the row it writes (a
    concurrent reset or increment is never overwritten). Returns the new streak (None: no
    such node)."""
    streak = Node.accepted_streak + 1
    trust = case(
        (streak >= trusted_streak, 1.0),
        else_=cast(streak, Float) / float(max(trusted_streak, 1)),
    )
    result = session.execute(
        update(Node)
        .where(Node.id == node_id)
        .values(accepted_streak=streak, trust=trust)
        .returning(Node.accepted_streak)
        .execution_options(synchronize_session=False)
    )
    value = result.scalar_one_or_none()
    return None if value is None else int(value)


def _rowcount(result: Any) -> int:
    count: int = result.rowcount
    return count


def list_nodes_page(
    session: Session,
    *,
    role: NodeRole | None = None,
    state: NodeState | None = None,
    after_id: str | None = None,
    limit: int = 100,
) -> list[Node]:
    """A page of nodes ordered by id, after ``after_id`` (keyset pagination)."""
    query = select(Node).order_by(Node.id).limit(limit)
    if role is not None:
        query = query.where(Node.role == role)
    if state is not None:
        query = query.where(Node.state == state)
    if after_id is not None:
        query = query.where(Node.id > after_id)
    return list(session.scalars(query))


def set_state_reason(session: Session, node_id: str, reason: str) -> None:
    """Record why a node was ejected, banned or deregistered."""
    session.execute(
        update(Node)
        .where(Node.id == node_id)
        .values(state_reason=reason[:1000])
        .execution_options(synchronize_session=False)
    )


def record_heartbeats(
    session: Session,
    node_ids: Collection[str],
    *,
    now: datetime,
    deadlines: Mapping[str, tuple[datetime, datetime]] | None = None,
    checkpoint_steps: Mapping[str, int] | None = None,
) -> dict[str, tuple[NodeState, NodeRole, str]]:
    """Group commit of many heartbeats: one conditional UPDATE, one SELECT.

    Revivable nodes (see :data:`HEARTBEAT_REVIVABLE_STATES`) become ACTIVE with ``now`` as their
    last heartbeat (and, with ``deadlines`` and ``checkpoint_steps``, the checkpoint step each
    reported); ejected, banned and deregistered ones are untouched. Returns the state and
    role and state reason of every known node among ``node_ids`` after the update (unknown ids
    are absent).
    """
    ids = sorted(set(node_ids))
    if not ids:
        return {}
    # Prebuilt statements: one UPDATE per distinct (suspect_at, offline_at, step) (nodes granted
    # the same interval in the same batch, at the same checkpoint, share it: usually all of
    # them), then one SELECT. Not executemany: that would convert the same timestamps once per
    # node, which costs more than the updates themselves.
    groups: dict[tuple[tuple[datetime, datetime] | None, int | None], list[str]] = {}
    for node_id in ids:
        pair = deadlines.get(node_id) if deadlines else None
        step = checkpoint_steps.get(node_id) if checkpoint_steps and pair else None
        if step is not None:
            step = min(step, MAX_RECORDED_STEP)
        groups.setdefault((pair, step), []).append(node_id)
    for (pair, step), members in groups.items():
        if pair is None:
            _REVIVE.run(session, {"ids": members, "now": now})
        elif step is None:
            _REVIVE_WITH_DEADLINES.run(
                session, {"ids": members, "now": now, "suspect": pair[0], "offline": pair[1]}
            )
        else:
            _REVIVE_WITH_DEADLINES_AND_STEP.run(
                session,
                {
                    "ids": members,
                    "now": now,
                    "suspect": pair[0],
                    "offline": pair[1],
                    "step": step,
                },
            )
    return {
        node_id: (NodeState(state), NodeRole(role), reason or "")
        for node_id, state, role, reason in _STATES.rows(session, {"ids": ids})
    }


def reinstate_node(
    session: Session, node_id: str, *, reason: str, rejects: int, now: datetime
) -> bool:
    """Move an EJECTED node to OFFLINE (its next heartbeat makes it ACTIVE): trust and streak
    start afresh and its ``rejects`` rejected commitments so far are forgiven. Returns whether
    the node was ejected (anything else is left as it is)."""
    result = session.execute(
        update(Node)
        .where(Node.id == node_id, Node.state == NodeState.EJECTED)
        .values(
            state=NodeState.OFFLINE,
            state_changed_at=now,
            state_reason=reason[:1000],
            trust=0.0,
            accepted_streak=0,
            rejects_forgiven=rejects,
        )
        .execution_options(synchronize_session=False)
    )
    return _rowcount(result) == 1
