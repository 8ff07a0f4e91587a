"""Batches of uncredited work can be pruned: ``blobs.pruned_at``, and finished validation jobs
indexed by when they ended.

The coordinator deletes the rollout batch of a commitment whose validation rejected it, or
failed for good, ``rejected_blob_ttl`` after that (the row stays: the ledger names its digest).
It walks finished jobs in the order they ended, from where its last sweep stopped.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("blobs") as batch:
        batch.add_column(sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        op.f("ix_validation_jobs_state_updated_at_id"),
        "validation_jobs",
        ["state", "updated_at", "id"],
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_validation_jobs_state_updated_at_id"), table_name="validation_jobs")
    with op.batch_alter_table("blobs") as batch:
        batch.drop_column("pruned_at")
