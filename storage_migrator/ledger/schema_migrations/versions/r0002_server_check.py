"""Run outcomes record the encryption configuration a key's migration ran under, and whether the check was overridden.

Issue 19: a run that names an encryption key writes only while every API server
reports one configuration hash; the outcome keeps that hash (what the proof holds
under) and ``server_check`` (``agreed``, or ``overridden`` when an operator
accepted the risk). Rows written before are NULL: no check was made then.

Revision ID: r0002
Revises: r0001
Create Date: 2026-11-26 09:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0002"
down_revision = "r0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("run_outcomes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("encryption_config_hash", sa.String(length=71), nullable=True))
        batch_op.add_column(sa.Column("server_check", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run_outcomes", schema=None) as batch_op:
        batch_op.drop_column("server_check")
        batch_op.drop_column("encryption_config_hash")
