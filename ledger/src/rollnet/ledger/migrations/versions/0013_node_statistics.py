"""Per-node statistics: ``node_statistics``.

One row per worker: running sums of the validators' per-rollout statistics and the CUSUMs of the
per-node sequential tests (docs/verification.md, "Per-node statistics").

Revision ID: 0013
Revises: 0011 (0012 when it is merged first: then this revises 0012)
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_statistics",
        sa.Column("node_id", sa.String(length=32), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("near_tie_losses", sa.BigInteger(), nullable=False),
        sa.Column("near_tie_wins", sa.BigInteger(), nullable=False),
        sa.Column("logprob_excess", sa.Float(), nullable=False),
        sa.Column("logprob_variance", sa.Float(), nullable=False),
        sa.Column("near_tie_cusum", sa.Float(), nullable=False),
        sa.Column("logprob_high_cusum", sa.Float(), nullable=False),
        sa.Column("logprob_low_cusum", sa.Float(), nullable=False),
        sa.Column("flagged_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("flagged_test", sa.String(length=32), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("tokens >= 0", name=op.f("ck_node_statistics_tokens_non_negative")),
        sa.CheckConstraint(
            "near_tie_losses >= 0 AND near_tie_wins >= 0 "
            "AND near_tie_losses + near_tie_wins <= tokens",
            name=op.f("ck_node_statistics_near_tie_counts"),
        ),
        sa.CheckConstraint(
            "logprob_variance >= 0", name=op.f("ck_node_statistics_variance_non_negative")
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_node_statistics_node_id_nodes")
        ),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_node_statistics")),
    )


def downgrade() -> None:
    op.drop_table("node_statistics")
