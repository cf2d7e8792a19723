"""Alembic's environment and the ledger's schema revisions, shipped inside the package.

`storage_migrator.ledger.database` runs them programmatically on first use; nobody
runs the `alembic` command by hand (there is no alembic.ini).
"""
