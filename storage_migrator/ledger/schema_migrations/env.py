"""Alembic's environment: always online, on the connection the caller hands over.

`storage_migrator.ledger.database.ensure_schema` puts an open connection in
`config.attributes["connection"]`; there is no URL in any file.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from storage_migrator.ledger.schema import Base


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, Connection):
        raise RuntimeError("the ledger's schema migrations run through storage_migrator.ledger.database only")
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        version_table="ledger_schema_version",
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()
