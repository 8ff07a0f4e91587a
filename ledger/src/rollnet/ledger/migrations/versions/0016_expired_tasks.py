"""Tasks may end ``expired``: queued, but behind the staleness bound, so never leased again.

A task still queued once the newest checkpoint is more than ``async_level`` steps past its own
is never handed to a worker; it used to stay queued forever. The coordinator's sweep now ends
it as ``expired`` (docs/reliability.md, *Findings*).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NAME = "ck_tasks_state_valid"
_STATES = "'queued', 'leased', 'submitted', 'validating', 'accepted', 'rejected', 'failed'"


def _replace_state_check(states: str) -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_constraint(op.f(_NAME), type_="check")
        batch.create_check_constraint(op.f(_NAME), f"state IN ({states})")


def upgrade() -> None:
    _replace_state_check(f"{_STATES}, 'expired'")


def downgrade() -> None:
    # Before 0016 a task that can never be leased stays queued; an ended one must stay ended.
    op.execute("UPDATE tasks SET state = 'failed' WHERE state = 'expired'")
    _replace_state_check(_STATES)
