"""Initial schema: nodes, tasks, blobs, commitments, validation, checkpoints and the ledger.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "idempotency_records",
        sa.Column("caller_id", sa.String(length=32), nullable=False),
        sa.Column("method", sa.String(length=128), nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("response", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "caller_id", "method", "request_id", name=op.f("pk_idempotency_records")
        ),
    )
    op.create_index(
        op.f("ix_idempotency_records_created_at"),
        "idempotency_records",
        ["created_at"],
        unique=False,
    )
    op.create_table(
        "ledger_chain_tip",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=False),
        sa.Column("head_hash", sa.LargeBinary(length=32), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_ledger_chain_tip_single_row")),
        sa.CheckConstraint(
            "length(head_hash) = 32", name=op.f("ck_ledger_chain_tip_head_hash_length")
        ),
        sa.CheckConstraint("sequence >= 0", name=op.f("ck_ledger_chain_tip_sequence_non_negative")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_chain_tip")),
    )
    # The chain starts empty: sequence 0, whose hash is 32 zero bytes (the genesis prev hash).
    chain_tip = sa.table(
        "ledger_chain_tip",
        sa.column("id", sa.Integer()),
        sa.column("sequence", sa.BigInteger()),
        sa.column("head_hash", sa.LargeBinary()),
    )
    op.bulk_insert(chain_tip, [{"id": 1, "sequence": 0, "head_hash": bytes(32)}])
    op.create_table(
        "ledger_signed_heads",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("network_id", sa.String(length=64), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=False),
        sa.Column("head_hash", sa.LargeBinary(length=32), nullable=False),
        sa.Column("signer_public_key", sa.LargeBinary(length=32), nullable=False),
        sa.Column("signature", sa.LargeBinary(length=64), nullable=False),
        sa.Column("signed_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "length(head_hash) = 32", name=op.f("ck_ledger_signed_heads_head_hash_length")
        ),
        sa.CheckConstraint(
            "length(signature) = 64", name=op.f("ck_ledger_signed_heads_signature_length")
        ),
        sa.CheckConstraint(
            "length(signer_public_key) = 32",
            name=op.f("ck_ledger_signed_heads_signer_public_key_length"),
        ),
        sa.CheckConstraint(
            "sequence >= 0", name=op.f("ck_ledger_signed_heads_sequence_non_negative")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_signed_heads")),
        sa.UniqueConstraint(
            "network_id",
            "sequence",
            "signer_public_key",
            name=op.f("uq_ledger_signed_heads_network_id_sequence_signer_public_key"),
        ),
    )
    op.create_table(
        "nodes",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("public_key", sa.LargeBinary(length=32), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("trust", sa.Float(), nullable=False),
        sa.Column("accepted_streak", sa.Integer(), nullable=False),
        sa.Column("protocol_version", sa.String(length=32), nullable=False),
        sa.Column("software_version", sa.String(length=64), nullable=False),
        sa.Column("capabilities", sa.JSON(), nullable=False),
        sa.Column("hardware", sa.JSON(), nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=True),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state_changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state_reason", sa.Text(), nullable=False),
        sa.CheckConstraint(
            "role IN ('worker', 'validator', 'trainer', 'operator')",
            name=op.f("ck_nodes_role_valid"),
        ),
        sa.CheckConstraint(
            "state IN ('pending', 'active', 'suspect', 'offline', 'ejected', 'banned',"
            " 'deregistered')",
            name=op.f("ck_nodes_state_valid"),
        ),
        sa.CheckConstraint("accepted_streak >= 0", name=op.f("ck_nodes_streak_non_negative")),
        sa.CheckConstraint("length(id) = 32", name=op.f("ck_nodes_id_length")),
        sa.CheckConstraint("length(public_key) = 32", name=op.f("ck_nodes_public_key_length")),
        sa.CheckConstraint("trust >= 0 AND trust <= 1", name=op.f("ck_nodes_trust_range")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
        sa.UniqueConstraint("public_key", name=op.f("uq_nodes_public_key")),
    )
    op.create_table(
        "blobs",
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("location", sa.String(length=1024), nullable=False),
        sa.Column("uploader_id", sa.String(length=32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("length(hash) = 64", name=op.f("ck_blobs_hash_length")),
        sa.CheckConstraint("size >= 0", name=op.f("ck_blobs_size_non_negative")),
        sa.ForeignKeyConstraint(
            ["uploader_id"], ["nodes.id"], name=op.f("fk_blobs_uploader_id_nodes")
        ),
        sa.PrimaryKeyConstraint("hash", name=op.f("pk_blobs")),
    )
    op.create_table(
        "checkpoints",
        sa.Column("step", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("manifest", sa.LargeBinary(), nullable=False),
        sa.Column("manifest_hash", sa.String(length=64), nullable=False),
        sa.Column("signature", sa.LargeBinary(length=64), nullable=False),
        sa.Column("signer_public_key", sa.LargeBinary(length=32), nullable=False),
        sa.Column("publisher_id", sa.String(length=32), nullable=True),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "length(manifest_hash) = 64", name=op.f("ck_checkpoints_manifest_hash_length")
        ),
        sa.CheckConstraint("length(signature) = 64", name=op.f("ck_checkpoints_signature_length")),
        sa.CheckConstraint(
            "length(signer_public_key) = 32", name=op.f("ck_checkpoints_signer_public_key_length")
        ),
        sa.CheckConstraint("step >= 0", name=op.f("ck_checkpoints_step_non_negative")),
        sa.ForeignKeyConstraint(
            ["publisher_id"], ["nodes.id"], name=op.f("fk_checkpoints_publisher_id_nodes")
        ),
        sa.PrimaryKeyConstraint("step", name=op.f("pk_checkpoints")),
        sa.UniqueConstraint("manifest_hash", name=op.f("uq_checkpoints_manifest_hash")),
    )
    op.create_table(
        "tasks",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("environment", sa.String(length=64), nullable=False),
        sa.Column("checkpoint_step", sa.BigInteger(), nullable=False),
        sa.Column("prompt_ids", sa.JSON(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("sampling", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("lease_id", sa.String(length=64), nullable=True),
        sa.Column("lease_holder", sa.String(length=32), nullable=True),
        sa.Column("lease_deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("fencing_token", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "state <> 'leased' OR (lease_id IS NOT NULL AND lease_holder IS NOT NULL"
            " AND lease_deadline IS NOT NULL)",
            name=op.f("ck_tasks_lease_complete"),
        ),
        sa.CheckConstraint(
            "state IN ('queued', 'leased', 'submitted', 'validating', 'accepted', 'rejected',"
            " 'failed')",
            name=op.f("ck_tasks_state_valid"),
        ),
        sa.CheckConstraint("attempt >= 0", name=op.f("ck_tasks_attempt_non_negative")),
        sa.CheckConstraint(
            "checkpoint_step >= 0", name=op.f("ck_tasks_checkpoint_step_non_negative")
        ),
        sa.CheckConstraint(
            "fencing_token = attempt", name=op.f("ck_tasks_fencing_token_is_attempt")
        ),
        sa.CheckConstraint("seed >= 0", name=op.f("ck_tasks_seed_non_negative")),
        sa.ForeignKeyConstraint(
            ["lease_holder"], ["nodes.id"], name=op.f("fk_tasks_lease_holder_nodes")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
    )
    op.create_index(
        op.f("ix_tasks_lease_holder_state"), "tasks", ["lease_holder", "state"], unique=False
    )
    op.create_index(
        op.f("ix_tasks_state_created_at"), "tasks", ["state", "created_at"], unique=False
    )
    op.create_table(
        "commitments",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("task_id", sa.String(length=64), nullable=False),
        sa.Column("node_id", sa.String(length=32), nullable=False),
        sa.Column("lease_id", sa.String(length=64), nullable=False),
        sa.Column("fencing_token", sa.BigInteger(), nullable=False),
        sa.Column("rollout_blob_hash", sa.String(length=64), nullable=False),
        sa.Column("proof_blob_hash", sa.String(length=64), nullable=True),
        sa.Column("sampling_seed", sa.BigInteger(), nullable=False),
        sa.Column("claimed_work", sa.BigInteger(), nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("signature", sa.LargeBinary(length=64), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "claimed_work >= 0", name=op.f("ck_commitments_claimed_work_non_negative")
        ),
        sa.CheckConstraint("length(signature) = 64", name=op.f("ck_commitments_signature_length")),
        sa.CheckConstraint(
            "sampling_seed >= 0", name=op.f("ck_commitments_sampling_seed_non_negative")
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_commitments_node_id_nodes")
        ),
        sa.ForeignKeyConstraint(
            ["proof_blob_hash"], ["blobs.hash"], name=op.f("fk_commitments_proof_blob_hash_blobs")
        ),
        sa.ForeignKeyConstraint(
            ["rollout_blob_hash"],
            ["blobs.hash"],
            name=op.f("fk_commitments_rollout_blob_hash_blobs"),
        ),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.id"], name=op.f("fk_commitments_task_id_tasks")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_commitments")),
        sa.UniqueConstraint(
            "task_id", "fencing_token", name=op.f("uq_commitments_task_id_fencing_token")
        ),
    )
    op.create_index(op.f("ix_commitments_node_id"), "commitments", ["node_id"], unique=False)
    op.create_table(
        "validation_jobs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("commitment_id", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("lease_id", sa.String(length=64), nullable=True),
        sa.Column("lease_holder", sa.String(length=32), nullable=True),
        sa.Column("lease_deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("fencing_token", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "state <> 'leased' OR (lease_id IS NOT NULL AND lease_holder IS NOT NULL"
            " AND lease_deadline IS NOT NULL)",
            name=op.f("ck_validation_jobs_lease_complete"),
        ),
        sa.CheckConstraint(
            "state IN ('queued', 'leased', 'done')", name=op.f("ck_validation_jobs_state_valid")
        ),
        sa.CheckConstraint("attempt >= 0", name=op.f("ck_validation_jobs_attempt_non_negative")),
        sa.CheckConstraint(
            "fencing_token = attempt", name=op.f("ck_validation_jobs_fencing_token_is_attempt")
        ),
        sa.ForeignKeyConstraint(
            ["commitment_id"],
            ["commitments.id"],
            name=op.f("fk_validation_jobs_commitment_id_commitments"),
        ),
        sa.ForeignKeyConstraint(
            ["lease_holder"], ["nodes.id"], name=op.f("fk_validation_jobs_lease_holder_nodes")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_validation_jobs")),
        sa.UniqueConstraint("commitment_id", name=op.f("uq_validation_jobs_commitment_id")),
    )
    op.create_index(
        op.f("ix_validation_jobs_state_created_at"),
        "validation_jobs",
        ["state", "created_at"],
        unique=False,
    )
    op.create_table(
        "verdicts",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("validation_job_id", sa.String(length=64), nullable=False),
        sa.Column("commitment_id", sa.String(length=64), nullable=False),
        sa.Column("validator_id", sa.String(length=32), nullable=False),
        sa.Column("accepted", sa.Boolean(), nullable=False),
        sa.Column("reasons", sa.JSON(), nullable=False),
        sa.Column("check_figures", sa.JSON(), nullable=False),
        sa.Column("awarded_work", sa.BigInteger(), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("awarded_work >= 0", name=op.f("ck_verdicts_awarded_work_non_negative")),
        sa.ForeignKeyConstraint(
            ["commitment_id"],
            ["commitments.id"],
            name=op.f("fk_verdicts_commitment_id_commitments"),
        ),
        sa.ForeignKeyConstraint(
            ["validation_job_id"],
            ["validation_jobs.id"],
            name=op.f("fk_verdicts_validation_job_id_validation_jobs"),
        ),
        sa.ForeignKeyConstraint(
            ["validator_id"], ["nodes.id"], name=op.f("fk_verdicts_validator_id_nodes")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_verdicts")),
        sa.UniqueConstraint("validation_job_id", name=op.f("uq_verdicts_validation_job_id")),
    )
    op.create_index(op.f("ix_verdicts_commitment_id"), "verdicts", ["commitment_id"], unique=False)
    op.create_table(
        "ledger_entries",
        sa.Column("sequence", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node_id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("commitment_id", sa.String(length=64), nullable=True),
        sa.Column("verdict_id", sa.String(length=64), nullable=True),
        sa.Column("memo", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.LargeBinary(length=32), nullable=False),
        sa.Column("entry_hash", sa.LargeBinary(length=32), nullable=False),
        sa.CheckConstraint(
            "(kind IN ('credit', 'validator_reward') AND amount >= 0)"
            " OR (kind = 'slash' AND amount <= 0) OR kind = 'adjustment'",
            name=op.f("ck_ledger_entries_amount_sign"),
        ),
        sa.CheckConstraint(
            "kind IN ('credit', 'slash', 'validator_reward', 'adjustment')",
            name=op.f("ck_ledger_entries_kind_valid"),
        ),
        sa.CheckConstraint(
            "length(entry_hash) = 32", name=op.f("ck_ledger_entries_entry_hash_length")
        ),
        sa.CheckConstraint(
            "length(prev_hash) = 32", name=op.f("ck_ledger_entries_prev_hash_length")
        ),
        sa.CheckConstraint("sequence >= 1", name=op.f("ck_ledger_entries_sequence_positive")),
        sa.ForeignKeyConstraint(
            ["commitment_id"],
            ["commitments.id"],
            name=op.f("fk_ledger_entries_commitment_id_commitments"),
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_ledger_entries_node_id_nodes")
        ),
        sa.ForeignKeyConstraint(
            ["verdict_id"], ["verdicts.id"], name=op.f("fk_ledger_entries_verdict_id_verdicts")
        ),
        sa.PrimaryKeyConstraint("sequence", name=op.f("pk_ledger_entries")),
        sa.UniqueConstraint("entry_hash", name=op.f("uq_ledger_entries_entry_hash")),
    )
    op.create_index(op.f("ix_ledger_entries_node_id"), "ledger_entries", ["node_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_ledger_entries_node_id"), table_name="ledger_entries")
    op.drop_table("ledger_entries")
    op.drop_index(op.f("ix_verdicts_commitment_id"), table_name="verdicts")
    op.drop_table("verdicts")
    op.drop_index(op.f("ix_validation_jobs_state_created_at"), table_name="validation_jobs")
    op.drop_table("validation_jobs")
    op.drop_index(op.f("ix_commitments_node_id"), table_name="commitments")
    op.drop_table("commitments")
    op.drop_index(op.f("ix_tasks_state_created_at"), table_name="tasks")
    op.drop_index(op.f("ix_tasks_lease_holder_state"), table_name="tasks")
    op.drop_table("tasks")
    op.drop_table("checkpoints")
    op.drop_table("blobs")
    op.drop_table("nodes")
    op.drop_table("ledger_signed_heads")
    op.drop_table("ledger_chain_tip")
    op.drop_index(op.f("ix_idempotency_records_created_at"), table_name="idempotency_records")
    op.drop_table("idempotency_records")
