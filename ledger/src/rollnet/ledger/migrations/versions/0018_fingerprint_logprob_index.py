"""The copy index's tokens digest indexed with the claimed log-probability.

A likely new rollout is a copy only of an improbable original with the same tokens. Indexed on
the digest alone, that look-up read every earlier rollout with the same tokens: a short answer
that honest workers give again and again (a lone EOS, "42") made every commitment's copy check
slower than the last. With the log-probability in the index it is one range probe.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        op.f("ix_rollout_fingerprints_tokens_blake3_logprob_sum"),
        "rollout_fingerprints",
        ["tokens_blake3", "logprob_sum"],
    )
    op.drop_index(op.f("ix_rollout_fingerprints_tokens_blake3"), table_name="rollout_fingerprints")


def downgrade() -> None:
    op.create_index(
        op.f("ix_rollout_fingerprints_tokens_blake3"), "rollout_fingerprints", ["tokens_blake3"]
    )
    op.drop_index(
        op.f("ix_rollout_fingerprints_tokens_blake3_logprob_sum"),
        table_name="rollout_fingerprints",
    )
