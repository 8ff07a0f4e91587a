"""Commitments keep the worker's full commitment record (per-rollout digests included).

Validators need every ``RolloutDigest`` (seed, proof digest, per-rollout commitment digest) that
the worker submitted; the record is the serialized ``rollnet.v1.Commitment`` as received.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("commitments") as batch:
        batch.add_column(sa.Column("record", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("commitments") as batch:
        batch.drop_column("record")
