"""What the operator dashboard shows without scanning history, and reinstated nodes.

- ``nodes.checkpoint_step``: the checkpoint step the node reported in its last heartbeat
  (NULL until it reports one): broadcast progress per node.
- ``nodes.rejects_forgiven``: rejected commitments an operator forgave by reinstating the node
  after an ejection; ejection after repeated rejects counts only the rejects since.
- ``step_rewards``: validated rewards of accepted rollouts summed per trainer step
  (``rollout_step``), kept up to date by each accepting verdict: the reward curve is one small
  indexed read instead of a pass over every verdict. Filled here from the verdicts recorded so
  far.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("checkpoint_step", sa.BigInteger(), nullable=True))
        batch.add_column(
            sa.Column("rejects_forgiven", sa.Integer(), nullable=False, server_default="0")
        )
    step_rewards = op.create_table(
        "step_rewards",
        sa.Column("rollout_step", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("rollouts", sa.BigInteger(), nullable=False),
        sa.Column("task_reward_sum", sa.Float(), nullable=False),
        sa.Column("total_reward_sum", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("rollout_step >= 0", name=op.f("ck_step_rewards_step_non_negative")),
        sa.CheckConstraint("rollouts >= 0", name=op.f("ck_step_rewards_rollouts_non_negative")),
        sa.PrimaryKeyConstraint("rollout_step", name=op.f("pk_step_rewards")),
    )
    _fill_step_rewards(step_rewards)


def _fill_step_rewards(step_rewards: sa.Table) -> None:
    verdicts = sa.table(
        "verdicts",
        sa.column("commitment_id", sa.String),
        sa.column("accepted", sa.Boolean),
        sa.column("check_figures", sa.JSON),
        sa.column("decided_at", sa.DateTime(timezone=True)),
    )
    commitments = sa.table("commitments", sa.column("id", sa.String), sa.column("task_id"))
    tasks = sa.table("tasks", sa.column("id", sa.String), sa.column("sampling", sa.JSON))
    query = (
        sa.select(verdicts.c.check_figures, verdicts.c.decided_at, tasks.c.sampling)
        .join(commitments, commitments.c.id == verdicts.c.commitment_id)
        .join(tasks, tasks.c.id == commitments.c.task_id)
        .where(verdicts.c.accepted.is_(True))
    )
    counts: dict[int, int] = {}
    task_sums: dict[int, float] = {}
    total_sums: dict[int, float] = {}
    updated: dict[int, datetime] = {}
    for figures, decided_at, sampling in op.get_bind().execute(query):
        step = int((sampling or {}).get("rollout_step", 0))
        rewards = (figures or {}).get("validated_rewards", [])
        counts[step] = counts.get(step, 0) + len(rewards)
        task_sums[step] = task_sums.get(step, 0.0) + sum(float(r[0]) for r in rewards)
        total_sums[step] = total_sums.get(step, 0.0) + sum(float(r[2]) for r in rewards)
        updated[step] = max(updated.get(step, decided_at), decided_at)
    if counts:
        op.bulk_insert(
            step_rewards,
            [
                {
                    "rollout_step": step,
                    "rollouts": count,
                    "task_reward_sum": task_sums[step],
                    "total_reward_sum": total_sums[step],
                    "updated_at": updated[step],
                }
                for step, count in counts.items()
            ],
        )


def downgrade() -> None:
    op.drop_table("step_rewards")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("rejects_forgiven")
        batch.drop_column("checkpoint_step")
