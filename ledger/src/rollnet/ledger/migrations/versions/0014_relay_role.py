"""Relays register as nodes of their own role, ``relay``.

A relay (``rollnet relay``) caches and serves checkpoints; it used to register as a worker,
which let its key lease tasks. The ``relay`` role may only read checkpoints and blobs and keep
itself registered (docs/protocol.md, the Roles column).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NAME = "ck_nodes_role_valid"


def _replace_role_check(roles: str) -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_constraint(op.f(_NAME), type_="check")
        batch.create_check_constraint(op.f(_NAME), f"role IN ({roles})")


def upgrade() -> None:
    _replace_role_check("'worker', 'validator', 'trainer', 'operator', 'relay'")


def downgrade() -> None:
    # A relay's key must not become a worker that may lease tasks: it leaves the network.
    op.execute("UPDATE nodes SET role = 'worker', state = 'deregistered' WHERE role = 'relay'")
    _replace_role_check("'worker', 'validator', 'trainer', 'operator'")
