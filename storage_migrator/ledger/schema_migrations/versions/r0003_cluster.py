"""Every row that belongs to one cluster says which: a fleet shares one ledger.

Issue 20: a cluster is a KubernetesClusterConfig block's name, or ``default``
for the environment's. Runs, outcomes, chunks, StorageState changes and polls
each happen on one cluster, so each gets a non-null ``cluster``; the rows
already there were written by a single-cluster install, so the server default
``default`` is what they are. Gap rows list the clusters of the rows they lost
(a writer serves every cluster of its process), ``["default"]`` before. The
queries filter by cluster first, then by time (or group chunks by resource),
so the cluster leads each new index.

Revision ID: r0003
Revises: r0002
Create Date: 2026-11-26 19:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0003"
down_revision = "r0002"
branch_labels = None
depends_on = None

DEFAULT_CLUSTER = "default"  # storage_migrator.fleet.names.DEFAULT_CLUSTER, frozen as this revision wrote it
#: table -> the column the queries order or group by after the cluster.
PER_CLUSTER = {
    "migration_runs": "started_at",
    "run_outcomes": "finished_at",
    "migration_chunks": "resource",
    "state_changes": "recorded_at",
    "detection_polls": "finished_at",
}


def upgrade() -> None:
    for table, then in PER_CLUSTER.items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(
                sa.Column("cluster", sa.String(length=253), server_default=DEFAULT_CLUSTER, nullable=False)
            )
            batch_op.create_index(f"ix_{table}_cluster_{then}", ["cluster", then], unique=False)
    with op.batch_alter_table("ledger_gaps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("clusters", sa.Text(), server_default=f'["{DEFAULT_CLUSTER}"]', nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("ledger_gaps", schema=None) as batch_op:
        batch_op.drop_column("clusters")
    for table, then in reversed(PER_CLUSTER.items()):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_index(f"ix_{table}_cluster_{then}")
            batch_op.drop_column("cluster")
