"""The ledger: an append-only history of migration runs, chunks, StorageState changes and polls (DESIGN 4.9).

Kubernetes objects stay the source of truth for *state*; the ledger is the
source of truth for *history*: `storage-migrator history`, the metrics, and
"when was this resource last fully migrated, and to which version". SQLite by
default, PostgreSQL by URL (`STORAGE_MIGRATOR_DATABASE_URL`); the schema is
brought up to date on first use. No Prefect here: the flows record through
`RunRecorder` and `LedgerWriter`, in-process, with no task runs of their own.

    schema.py              the tables (typed ORM)
    schema_migrations/     Alembic's environment and revisions, run by database.py
    database.py            one engine per URL, the schema upgraded on first use
    records.py             the rows the migrator hands over (pydantic)
    writer.py              the background writer: retries, never raises, records gaps
    recorder.py            one run's rows; who asked for it
    queries.py             history, gaps, last full migration, metrics aggregates
    in_tree.py             the in-tree migrations anyone made: a row once per object and phase (issue 36)
    in_tree_history.py     which of them the ledger has seen, and their history
"""
