"""The ledger's tables: runs, outcomes, chunks, StorageState changes, polls, gaps.

Revision ID: r0001
Revises: (none: the first)
Create Date: 2026-11-25 08:52:19.885125
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "detection_polls",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_seconds", sa.Float(), nullable=False),
        sa.Column("resources_seen", sa.Integer(), nullable=False),
        sa.Column("changes", sa.Integer(), nullable=False),
        sa.Column("requests_made", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("flow_run_id", sa.String(length=36), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("detection_polls", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_detection_polls_finished_at"), ["finished_at"], unique=False)

    op.create_table(
        "ledger_gaps",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("first_lost_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_lost_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rows_lost", sa.Integer(), nullable=False),
        sa.Column("kinds", sa.Text(), nullable=False),
        sa.Column("resources", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("ledger_gaps", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ledger_gaps_recorded_at"), ["recorded_at"], unique=False)

    op.create_table(
        "migration_chunks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("resource", sa.String(length=253), nullable=False),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("token_in", sa.Text(), nullable=True),
        sa.Column("token_out", sa.Text(), nullable=True),
        sa.Column("retries", sa.Integer(), nullable=False),
        sa.Column("relisted", sa.Integer(), nullable=False),
        sa.Column("duration_seconds", sa.Float(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("listed", sa.Integer(), nullable=False),
        sa.Column("rewritten", sa.Integer(), nullable=False),
        sa.Column("unchanged", sa.Integer(), nullable=False),
        sa.Column("gone", sa.Integer(), nullable=False),
        sa.Column("conflicted", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("migration_chunks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_migration_chunks_resource"), ["resource"], unique=False)
        batch_op.create_index(batch_op.f("ix_migration_chunks_run_id"), ["run_id"], unique=False)

    op.create_table(
        "migration_runs",
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("migration", sa.String(length=253), nullable=False),
        sa.Column("migration_uid", sa.String(length=64), nullable=False),
        sa.Column("resource", sa.String(length=253), nullable=False),
        sa.Column("version", sa.String(length=63), nullable=False),
        sa.Column("target_storage_version_hash", sa.String(length=64), nullable=True),
        sa.Column("encryption_key", sa.String(length=253), nullable=True),
        sa.Column("requested_by", sa.String(length=63), nullable=False),
        sa.Column("flow_run_id", sa.String(length=36), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resumed_from_token", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("run_id"),
    )
    with op.batch_alter_table("migration_runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_migration_runs_migration"), ["migration"], unique=False)
        batch_op.create_index(batch_op.f("ix_migration_runs_migration_uid"), ["migration_uid"], unique=False)
        batch_op.create_index(batch_op.f("ix_migration_runs_resource"), ["resource"], unique=False)
        batch_op.create_index(batch_op.f("ix_migration_runs_started_at"), ["started_at"], unique=False)

    op.create_table(
        "run_outcomes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("migration", sa.String(length=253), nullable=False),
        sa.Column("migration_uid", sa.String(length=64), nullable=False),
        sa.Column("resource", sa.String(length=253), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=128), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("chunks", sa.Integer(), nullable=False),
        sa.Column("passes", sa.Integer(), nullable=False),
        sa.Column("listed", sa.Integer(), nullable=False),
        sa.Column("rewritten", sa.Integer(), nullable=False),
        sa.Column("unchanged", sa.Integer(), nullable=False),
        sa.Column("gone", sa.Integer(), nullable=False),
        sa.Column("conflicted", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("run_outcomes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_run_outcomes_finished_at"), ["finished_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_run_outcomes_resource"), ["resource"], unique=False)
        batch_op.create_index(batch_op.f("ix_run_outcomes_run_id"), ["run_id"], unique=False)

    op.create_table(
        "state_changes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.String(length=253), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("old_current_hash", sa.String(length=64), nullable=True),
        sa.Column("new_current_hash", sa.String(length=64), nullable=True),
        sa.Column("old_persisted", sa.Text(), nullable=False),
        sa.Column("new_persisted", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("flow_run_id", sa.String(length=36), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("state_changes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_state_changes_recorded_at"), ["recorded_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_state_changes_state"), ["state"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("state_changes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_state_changes_state"))
        batch_op.drop_index(batch_op.f("ix_state_changes_recorded_at"))

    op.drop_table("state_changes")
    with op.batch_alter_table("run_outcomes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_run_outcomes_run_id"))
        batch_op.drop_index(batch_op.f("ix_run_outcomes_resource"))
        batch_op.drop_index(batch_op.f("ix_run_outcomes_finished_at"))

    op.drop_table("run_outcomes")
    with op.batch_alter_table("migration_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_migration_runs_started_at"))
        batch_op.drop_index(batch_op.f("ix_migration_runs_resource"))
        batch_op.drop_index(batch_op.f("ix_migration_runs_migration_uid"))
        batch_op.drop_index(batch_op.f("ix_migration_runs_migration"))

    op.drop_table("migration_runs")
    with op.batch_alter_table("migration_chunks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_migration_chunks_run_id"))
        batch_op.drop_index(batch_op.f("ix_migration_chunks_resource"))

    op.drop_table("migration_chunks")
    with op.batch_alter_table("ledger_gaps", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ledger_gaps_recorded_at"))

    op.drop_table("ledger_gaps")
    with op.batch_alter_table("detection_polls", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_detection_polls_finished_at"))

    op.drop_table("detection_polls")
