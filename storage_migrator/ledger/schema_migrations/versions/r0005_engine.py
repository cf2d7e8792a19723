"""Run outcomes record the engine that rewrote the objects, and why it was that one.

Issue 36: a migration is rewritten by this project's chunk loop (``client``) or by
kube-controller-manager's own migrator (``in-tree``), chosen per run by the setting
``engine`` and what the cluster answers (``auto``). The outcome keeps which
(``engine``) and, when the setting alone does not say it (auto's choice, a
fallback because the in-tree controller did not pick the migration up), why
(``engine_note``). Rows written before are NULL: the client engine, the only one then.

Revision ID: r0005
Revises: r0004
Create Date: 2026-11-29 06:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0005"
down_revision = "r0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("run_outcomes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("engine", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("engine_note", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run_outcomes", schema=None) as batch_op:
        batch_op.drop_column("engine_note")
        batch_op.drop_column("engine")
