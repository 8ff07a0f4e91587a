"""Lease-order indexes cover the whole ORDER BY (state, created_at, id).

Tasks enqueued in one batch share ``created_at``; with an index on (state, created_at) only, every
lease had to sort all queued tasks of the batch by id (10,000 tasks: ~3 ms per lease).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for table in ("tasks", "validation_jobs"):
        op.drop_index(op.f(f"ix_{table}_state_created_at"), table_name=table)
        op.create_index(
            op.f(f"ix_{table}_state_created_at_id"), table, ["state", "created_at", "id"]
        )


def downgrade() -> None:
    for table in ("tasks", "validation_jobs"):
        op.drop_index(op.f(f"ix_{table}_state_created_at_id"), table_name=table)
        op.create_index(op.f(f"ix_{table}_state_created_at"), table, ["state", "created_at"])
