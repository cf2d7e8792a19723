"""Connecting to the ledger: one engine per URL per process, the schema brought up to date on first use.

Design decision (issue 12): nobody runs a schema tool by hand. The first use of
a URL in a process checks the Alembic revision stored in the database and, when
it is behind, runs `alembic.command.upgrade` programmatically with the
revisions shipped in this package. SQLite gets WAL (readers never block the
writer: `history` and `metrics` read while migrations write) and a busy timeout
(several workers on one file wait for each other instead of failing).
"""

from __future__ import annotations

import threading
from functools import cache
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError

__all__ = [
    "LedgerConfigError",
    "display_url",
    "engine_for",
    "ensure_schema",
    "head_revision",
    "ledger_engine",
    "schema_revision",
]

MIGRATIONS_DIR = Path(__file__).parent / "schema_migrations"
VERSION_TABLE = "ledger_schema_version"
SQLITE_BUSY_TIMEOUT_SECONDS = 30.0
CONNECT_TIMEOUT_SECONDS = 5

_lock = threading.Lock()
_ready: set[str] = set()


class LedgerConfigError(ValueError):
    """The ledger URL cannot be used (says which setting to fix)."""


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_SECONDS * 1000)}")
    cursor.close()


def display_url(url: str) -> str:
    """The URL as messages may show it: never its password (a PostgreSQL URL carries one)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # ValueError: a port that is no number
        return "(not a SQLAlchemy URL)"


@cache
def engine_for(url: str) -> Engine:
    """The process's engine for `url` (not connected yet: an unreachable database fails on first use)."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise LedgerConfigError(
            "STORAGE_MIGRATOR_DATABASE_URL is not a SQLAlchemy URL: use sqlite:///PATH "
            "or postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB"
        ) from exc
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if parsed.get_backend_name() == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")  # the driver we ship
        return create_engine(parsed, pool_pre_ping=True, connect_args={"connect_timeout": CONNECT_TIMEOUT_SECONDS})
    raise LedgerConfigError(
        f"STORAGE_MIGRATOR_DATABASE_URL {parsed.render_as_string(hide_password=True)!r}: the ledger supports "
        "SQLite (sqlite:///PATH) and PostgreSQL (postgresql+psycopg://...) only"
    )


def _alembic_config(connection: Connection) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


@cache
def head_revision() -> str:
    """The newest schema revision this code knows."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    assert head is not None, "no schema revision shipped"
    return head


@cache
def known_revisions() -> frozenset[str]:
    from alembic.script import ScriptDirectory

    return frozenset(script.revision for script in ScriptDirectory(str(MIGRATIONS_DIR)).walk_revisions())


def schema_revision(connection: Connection) -> str | None:
    """The revision the database is at (None: empty)."""
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()


def ensure_schema(engine: Engine) -> None:
    """Upgrade the database to this code's head revision if it is behind (idempotent, once per process)."""
    key = engine.url.render_as_string(hide_password=False)
    if key in _ready:
        return
    from alembic import command

    with _lock:
        if key in _ready:
            return
        with engine.connect() as connection:
            current = schema_revision(connection)
        if current is not None and current not in known_revisions():
            raise LedgerConfigError(
                f"the ledger at {engine.url.render_as_string(hide_password=True)!r} is at schema revision "
                f"{current!r}, which this storage-migrator does not know (it knows up to {head_revision()!r}): "
                "a newer version wrote it; upgrade storage-migrator, or point STORAGE_MIGRATOR_DATABASE_URL elsewhere"
            )
        if current != head_revision():
            try:
                with engine.begin() as connection:
                    command.upgrade(_alembic_config(connection), "head")
            except Exception:
                # Another worker may have upgraded it meanwhile (both saw it behind): fine if it is at head now.
                with engine.connect() as connection:
                    if schema_revision(connection) != head_revision():
                        raise
        _ready.add(key)


def ledger_engine(url: str) -> Engine:
    """The engine for `url` with the schema up to date: what readers and the writer use."""
    engine = engine_for(url)
    ensure_schema(engine)
    return engine
