"""Verdicts keep the validator's recomputed log-probabilities of every completion token.

A validator's prefill computes the log-probability of each completion token under the task's
sampling distribution anyway; an accepted verdict now carries them, and the coordinator streams
them to the trainer (``AcceptedRollout.validated_logprobs``), whose importance ratios must not use
numbers a worker can shade. Stored packed (``rollnet.ledger.validation.pack_logprobs``), NULL for
verdicts without them (every verdict before this revision).

Revision ID: 0009
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("verdicts") as batch:
        batch.add_column(sa.Column("validated_logprobs", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("verdicts") as batch:
        batch.drop_column("validated_logprobs")
