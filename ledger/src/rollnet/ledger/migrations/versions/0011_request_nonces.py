"""The replay cache in the database: ``request_nonces``.

A signed call's (signed timestamp, node id, nonce) is recorded until its signature's time window
closes, so a call captured before a restart, or sent to another replica sharing the database, is
refused as a replay. The key leads with the signed timestamp (Unix milliseconds): new rows are
appended to one B-tree (no rowid table on SQLite, no second index) and the coordinator's sweep
prunes expired ones as one range.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "request_nonces",
        sa.Column("signed_ms", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("node_id", sa.String(length=32), nullable=False),
        sa.Column("nonce", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("signed_ms", "node_id", "nonce", name=op.f("pk_request_nonces")),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("request_nonces")
