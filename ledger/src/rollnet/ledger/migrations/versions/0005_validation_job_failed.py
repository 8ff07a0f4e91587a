"""Validation jobs may end FAILED: given up after ``max_validation_attempts`` leases.

A job none of the (trusted) validators can finish — its checkpoint or blob cannot be had, or it
takes every validator that leases it down — used to be requeued forever.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NAME = "ck_validation_jobs_state_valid"


def _replace_state_check(states: str) -> None:
    with op.batch_alter_table("validation_jobs") as batch:
        batch.drop_constraint(op.f(_NAME), type_="check")
        batch.create_check_constraint(op.f(_NAME), f"state IN ({states})")


def upgrade() -> None:
    _replace_state_check("'queued', 'leased', 'done', 'failed'")


def downgrade() -> None:
    op.execute("UPDATE validation_jobs SET state = 'queued' WHERE state = 'failed'")
    _replace_state_check("'queued', 'leased', 'done'")
