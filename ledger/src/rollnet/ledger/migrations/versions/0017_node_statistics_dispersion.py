"""Per-node statistics: the log-probability dispersion test's sums and CUSUM.

The validator compares each token's reported behaviour log-probability with its own; the
dispersion of the difference (in units of the honest interval) catches cheaper models whose
scores move by about honest noise on near-ties but add their own error on every token
(docs/verification.md, "Per-node statistics"). Existing rows start the test at zero.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("node_statistics") as batch:
        batch.add_column(
            sa.Column("logprob_dispersion", sa.Float(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("dispersion_tokens", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("dispersion_cusum", sa.Float(), nullable=False, server_default="0")
        )
        batch.create_check_constraint(
            "dispersion_sums",
            "dispersion_tokens >= 0 AND logprob_dispersion >= 0",
        )


def downgrade() -> None:
    with op.batch_alter_table("node_statistics") as batch:
        batch.drop_constraint("dispersion_sums", type_="check")
        batch.drop_column("dispersion_cusum")
        batch.drop_column("dispersion_tokens")
        batch.drop_column("logprob_dispersion")
