"""Per-node statistics: the EOS test's counts and CUSUM in ``node_statistics``.

EOS steering (taking EOS whenever it is within tolerance of the winner, to stop early) needs
its own sequential test: in the near-tie CUSUM its few EOS losses are cancelled by the many
honest-looking band wins (docs/verification.md, "Per-node statistics"). Existing rows start the
EOS test at zero.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("node_statistics") as batch:
        batch.add_column(
            sa.Column("eos_near_tie_losses", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("eos_near_tie_passes", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("eos_cusum", sa.Float(), nullable=False, server_default="0"))
        batch.create_check_constraint(
            "eos_counts",
            "eos_near_tie_losses >= 0 AND eos_near_tie_passes >= 0",
        )


def downgrade() -> None:
    with op.batch_alter_table("node_statistics") as batch:
        batch.drop_constraint("eos_counts", type_="check")
        batch.drop_column("eos_cusum")
        batch.drop_column("eos_near_tie_passes")
        batch.drop_column("eos_near_tie_losses")
