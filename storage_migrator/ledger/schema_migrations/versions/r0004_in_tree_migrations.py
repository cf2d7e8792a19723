"""In-tree migrations made by anyone, one row per object and phase a poll saw it in.

Issue 36: objects of ``storagemigration.k8s.io`` (kube-controller-manager's own
migrator) are created by kubectl, Gardener or a provider's tooling. Detection
records each once per phase (Pending, Running, Succeeded, Failed): the unique
(cluster, uid, phase) is how the ledger knows it has seen one, and a second
poll's row for the same phase is dropped (INSERT ... ON CONFLICT DO NOTHING).

Revision ID: r0004
Revises: r0003
Create Date: 2026-11-29 04:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0004"
down_revision = "r0003"
branch_labels = None
depends_on = None

DEFAULT_CLUSTER = "default"  # storage_migrator.fleet.names.DEFAULT_CLUSTER, frozen as this revision wrote it


def upgrade() -> None:
    op.create_table(
        "in_tree_migrations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster", sa.String(length=253), server_default=DEFAULT_CLUSTER, nullable=False),
        sa.Column("uid", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("api_version", sa.String(length=63), nullable=False),
        sa.Column("resource", sa.String(length=253), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("created_by", sa.String(length=253), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("running_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resource_version", sa.String(length=64), nullable=True),
        sa.Column("reason", sa.String(length=128), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("flow_run_id", sa.String(length=36), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cluster", "uid", "phase", name="uq_in_tree_migrations_cluster_uid_phase"),
    )
    op.create_index("ix_in_tree_migrations_resource", "in_tree_migrations", ["resource"], unique=False)
    op.create_index(
        "ix_in_tree_migrations_cluster_observed_at", "in_tree_migrations", ["cluster", "observed_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_in_tree_migrations_cluster_observed_at", table_name="in_tree_migrations")
    op.drop_index("ix_in_tree_migrations_resource", table_name="in_tree_migrations")
    op.drop_table("in_tree_migrations")
