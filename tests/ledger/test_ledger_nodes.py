"""Node registration, heartbeats and state changes on both engines."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from rollnet.ledger import NodeRole, NodeState
from rollnet.ledger.nodes import (
    get_node,
    list_nodes,
    mark_stale_nodes,
    record_accepted,
    record_heartbeat,
    register_node,
    set_node_state,
    set_trust,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
AddNodes = Callable[..., list[str]]


def test_register_then_reregister_keeps_state_and_refreshes_reports(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (node_id,) = add_nodes(1)
    with sessions.begin() as session:
        node = get_node(session, node_id)
        assert node is not None
        assert (node.role, node.state, node.trust) == (NodeRole.WORKER, NodeState.PENDING, 0.0)
        assert set_node_state(session, node_id, NodeState.BANNED, now=T0)
        public_key = node.public_key
    with sessions.begin() as session:
        again = register_node(
            session,
            node_id=node_id,
            public_key=public_key,
            role=NodeRole.WORKER,
            protocol_version="1.1",
            software_version="new",
            capabilities=["b", "a"],
            hardware={"gpu": "H100"},
            pool="eu",
            now=T0 + timedelta(hours=1),
        )
        assert again.state is NodeState.BANNED
        assert (again.protocol_version, again.capabilities, again.pool) == ("1.1", ["a", "b"], "eu")
        with pytest.raises(ValueError, match="different public key"):
            register_node(
                session,
                node_id=node_id,
                public_key=b"\x01" * 32,
                role=NodeRole.WORKER,
                protocol_version="1.1",
                software_version="x",
                capabilities=[],
                hardware={},
                pool=None,
                now=T0,
            )


@pytest.mark.parametrize(
    ("node_id", "public_key"),
    [
        ("ABCDEF" + "0" * 26, b"k" * 32),
        ("0" * 31, b"k" * 32),
        ("g" * 32, b"k" * 32),
        ("0" * 32, b"k" * 31),
    ],
)
def test_malformed_ids_and_keys_are_refused(
    sessions: sessionmaker[Session], node_id: str, public_key: bytes
) -> None:
    with sessions.begin() as session, pytest.raises(ValueError, match=r"lowercase hex|32 bytes"):
        register_node(
            session,
            node_id=node_id,
            public_key=public_key,
            role=NodeRole.WORKER,
            protocol_version="1.0",
            software_version="x",
            capabilities=[],
            hardware={},
            pool=None,
            now=T0,
        )


@pytest.mark.parametrize("terminal", [NodeState.EJECTED, NodeState.BANNED, NodeState.DEREGISTERED])
def test_heartbeat_never_revives_a_terminal_node(
    sessions: sessionmaker[Session], add_nodes: AddNodes, terminal: NodeState
) -> None:
    (node_id,) = add_nodes(1)
    with sessions.begin() as session:
        assert set_node_state(session, node_id, terminal, now=T0)
    with sessions.begin() as session:
        assert not record_heartbeat(session, node_id, now=T0 + timedelta(seconds=5))
    with sessions.begin() as session:
        node = get_node(session, node_id)
        assert node is not None
        assert node.state is terminal
        assert node.last_heartbeat_at == T0


@pytest.mark.parametrize(
    "revivable", [NodeState.PENDING, NodeState.ACTIVE, NodeState.SUSPECT, NodeState.OFFLINE]
)
def test_heartbeat_activates_revivable_nodes(
    sessions: sessionmaker[Session], add_nodes: AddNodes, revivable: NodeState
) -> None:
    (node_id,) = add_nodes(1)
    with sessions.begin() as session:
        set_node_state(session, node_id, revivable, now=T0)
    beat = T0 + timedelta(seconds=5)
    with sessions.begin() as session:
        assert record_heartbeat(session, node_id, now=beat)
    with sessions.begin() as session:
        node = get_node(session, node_id)
        assert node is not None
        assert (node.state, node.last_heartbeat_at) == (NodeState.ACTIVE, beat)
        # An active node's state_changed_at stays put; others record the transition time.
        assert node.state_changed_at == (T0 if revivable is NodeState.ACTIVE else beat)


def test_unknown_node_heartbeat_matches_nothing(sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as session:
        assert not record_heartbeat(session, "e" * 32, now=T0)


def test_stale_nodes_become_suspect_then_offline(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    fresh, quiet, silent, banned = add_nodes(4)
    with sessions.begin() as session:
        for node_id in (fresh, quiet, silent):
            set_node_state(session, node_id, NodeState.ACTIVE, now=T0)
        set_node_state(session, banned, NodeState.BANNED, now=T0)
        record_heartbeat(session, fresh, now=T0 + timedelta(seconds=100))
        record_heartbeat(session, quiet, now=T0 + timedelta(seconds=50))
    now = T0 + timedelta(seconds=110)
    with sessions.begin() as session:
        stale = mark_stale_nodes(
            session,
            suspect_before=now - timedelta(seconds=30),
            offline_before=now - timedelta(seconds=90),
            now=now,
        )
    assert stale.suspect == [quiet]
    assert stale.offline == [silent]
    with sessions.begin() as session:
        states = {node.id: node.state for node in list_nodes(session)}
        assert states[banned] is NodeState.BANNED
        assert [n.id for n in list_nodes(session, state=NodeState.ACTIVE)] == [fresh]
        assert len(list_nodes(session, role=NodeRole.VALIDATOR)) == 0


def test_trust_is_bounded(sessions: sessionmaker[Session], add_nodes: AddNodes) -> None:
    (node_id,) = add_nodes(1)
    with sessions.begin() as session:
        assert set_trust(session, node_id, trust=0.75, accepted_streak=3)
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            set_trust(session, node_id, trust=1.5, accepted_streak=0)
        assert not set_trust(session, "e" * 32, trust=0.5, accepted_streak=0)


def test_an_accept_grows_the_streak_the_row_holds(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    """The streak is incremented in SQL, from the row as it is when the UPDATE runs: a reset
    committed since the caller read the node (a concurrent reject) is not overwritten."""
    (node_id,) = add_nodes(1)
    with sessions.begin() as session:
        assert record_accepted(session, node_id, trusted_streak=4) == 1
        assert record_accepted(session, node_id, trusted_streak=4) == 2
    with sessions.begin() as session:
        stale = get_node(session, node_id)
        assert stale is not None
        assert (stale.accepted_streak, stale.trust) == (2, 0.5)
        set_trust(session, node_id, trust=0.0, accepted_streak=0)  # a reject meanwhile
        assert record_accepted(session, node_id, trusted_streak=4) == 1
    with sessions.begin() as session:
        for _ in range(5):
            record_accepted(session, node_id, trusted_streak=4)
    with sessions() as session:
        node = get_node(session, node_id)
        assert node is not None
        assert (node.accepted_streak, node.trust) == (6, 1.0), "trust is capped at 1"
        assert record_accepted(session, "e" * 32, trusted_streak=4) is None
