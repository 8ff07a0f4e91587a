"""Fixtures of the ledger tests (on top of the shared database fixtures in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from blake3 import blake3
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from rollnet.ledger import NodeRole, session_factory
from rollnet.ledger.nodes import register_node

#: A fixed "now" so tests never depend on the wall clock.
T0 = datetime(2026, 1, 1, tzinfo=UTC)

AddNodes = Callable[..., list[str]]


def new_node_key() -> tuple[str, bytes]:
    """A fresh Ed25519 public key and a 32-hex-char node id derived from it."""
    public_key = (
        Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    )
    return blake3(public_key).hexdigest()[:32], public_key


@pytest.fixture
def sessions(migrated_engine: Engine) -> sessionmaker[Session]:
    """Session factory on the migrated test database."""
    return session_factory(migrated_engine)


@pytest.fixture
def add_nodes(sessions: sessionmaker[Session]) -> AddNodes:
    """``add_nodes(n, role=NodeRole.WORKER)`` registers ``n`` nodes and returns their ids."""

    def add(count: int, role: NodeRole = NodeRole.WORKER) -> list[str]:
        ids = []
        with sessions.begin() as session:
            for _ in range(count):
                node_id, public_key = new_node_key()
                register_node(
                    session,
                    node_id=node_id,
                    public_key=public_key,
                    role=role,
                    protocol_version="1.0",
                    software_version="test",
                    capabilities=["env:arithmetic"],
                    hardware={"gpu": "none"},
                    pool=None,
                    now=T0,
                )
                ids.append(node_id)
        return ids

    return add
