"""The give-back history (``task_attempts``) and the copy index (``rollout_fingerprints``).

``task_attempts`` records every lease of a task that ended without credit (given back, expired,
taken back, rejected, unvalidated, refused as a copy): node, lease, reason, time. Sampling seeds
derive from the task alone, so a retry never re-rolls them; this is the trace an operator reads.

``rollout_fingerprints`` holds each committed rollout's tokens digest and completion digest,
indexed, so the coordinator finds the same completion committed by another node in one probe.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "task_attempts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("task_id", sa.String(length=64), nullable=False),
        sa.Column("node_id", sa.String(length=32), nullable=False),
        sa.Column("lease_id", sa.String(length=64), nullable=False),
        sa.Column("fencing_token", sa.BigInteger(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "outcome IN ('given_back', 'expired', 'taken_back', 'rejected', 'unvalidated', "
            "'duplicate')",
            name=op.f("ck_task_attempts_outcome_valid"),
        ),
        sa.CheckConstraint(
            "fencing_token >= 1", name=op.f("ck_task_attempts_fencing_token_positive")
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_task_attempts_node_id_nodes")
        ),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.id"], name=op.f("fk_task_attempts_task_id_tasks")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_attempts")),
    )
    op.create_index(
        op.f("ix_task_attempts_task_id_fencing_token"),
        "task_attempts",
        ["task_id", "fencing_token"],
    )
    op.create_index(
        op.f("ix_task_attempts_node_id_ended_at"), "task_attempts", ["node_id", "ended_at"]
    )
    op.create_table(
        "rollout_fingerprints",
        sa.Column("commitment_id", sa.String(length=64), nullable=False),
        sa.Column("rollout_index", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("node_id", sa.String(length=32), nullable=False),
        sa.Column("tokens_blake3", sa.LargeBinary(length=32), nullable=False),
        sa.Column("completion_blake3", sa.LargeBinary(length=32), nullable=False),
        sa.Column("logprob_sum", sa.Float(), nullable=False),
        sa.CheckConstraint(
            "length(tokens_blake3) = 32", name=op.f("ck_rollout_fingerprints_tokens_blake3_length")
        ),
        sa.CheckConstraint(
            "length(completion_blake3) = 32",
            name=op.f("ck_rollout_fingerprints_completion_blake3_length"),
        ),
        sa.ForeignKeyConstraint(
            ["commitment_id"],
            ["commitments.id"],
            name=op.f("fk_rollout_fingerprints_commitment_id_commitments"),
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_rollout_fingerprints_node_id_nodes")
        ),
        sa.PrimaryKeyConstraint(
            "commitment_id", "rollout_index", name=op.f("pk_rollout_fingerprints")
        ),
    )
    op.create_index(
        op.f("ix_rollout_fingerprints_tokens_blake3"), "rollout_fingerprints", ["tokens_blake3"]
    )
    op.create_index(
        op.f("ix_rollout_fingerprints_completion_blake3"),
        "rollout_fingerprints",
        ["completion_blake3"],
    )


def downgrade() -> None:
    op.drop_index(
        op.f("ix_rollout_fingerprints_completion_blake3"), table_name="rollout_fingerprints"
    )
    op.drop_index(op.f("ix_rollout_fingerprints_tokens_blake3"), table_name="rollout_fingerprints")
    op.drop_table("rollout_fingerprints")
    op.drop_index(op.f("ix_task_attempts_node_id_ended_at"), table_name="task_attempts")
    op.drop_index(op.f("ix_task_attempts_task_id_fencing_token"), table_name="task_attempts")
    op.drop_table("task_attempts")
