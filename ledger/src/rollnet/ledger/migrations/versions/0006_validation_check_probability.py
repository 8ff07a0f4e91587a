"""Validation jobs record the probability with which their commitment was chosen for checking.

A trusted node's commitments are spot-checked with probability p (down to
``min_validation_rate``); the others are credited unchecked. A reject is now slashed the claimed
work divided by p, so cheating on work that is checked one time in ten costs ten times the work
when caught, and its expected value is not positive. Existing jobs get p = 1 (the old slash).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("validation_jobs") as batch:
        batch.add_column(
            sa.Column("check_probability", sa.Float(), server_default="1.0", nullable=False)
        )
        batch.create_check_constraint(
            op.f("ck_validation_jobs_check_probability_range"),
            "check_probability > 0 AND check_probability <= 1",
        )


def downgrade() -> None:
    with op.batch_alter_table("validation_jobs") as batch:
        batch.drop_constraint(op.f("ck_validation_jobs_check_probability_range"), type_="check")
        batch.drop_column("check_probability")
