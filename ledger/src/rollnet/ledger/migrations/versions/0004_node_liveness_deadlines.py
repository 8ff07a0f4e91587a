"""Per-node liveness deadlines: heartbeats record when the node turns SUSPECT and OFFLINE.

Nodes may be granted different heartbeat intervals (they ask for one; the coordinator clamps it
and lengthens it under load), so silence must be judged against each node's own interval.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("suspect_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("offline_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("offline_at")
        batch.drop_column("suspect_at")
