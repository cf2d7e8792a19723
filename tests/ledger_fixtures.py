"""A real PostgreSQL server for the ledger's tests, started lazily once per session.

Issue 12: the ledger is "tested in CI against a real PostgreSQL server that the
test run installs (Debian `postgresql`) and starts itself". scripts/bootstrap.sh
installs the binaries; devstack.postgres starts it (the same throw-away server the
demo and the e2e tests run Prefect on). Each test gets a database of its own, so
every test also checks the Alembic upgrade from an empty database. And what a SQLite
ledger holds on disk, for the tests that search it for a value that must not be there.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devstack.postgres import Postgres, postgres_bin, start_postgres

__all__ = ["PostgresServer", "postgres_server", "postgres_url", "sqlite_ledger_bytes"]


@dataclass
class PostgresServer:
    """The session's server, as the ledger's tests use it (psycopg URLs, a database each, dumps)."""

    server: Postgres

    def url(self, database: str = "postgres") -> str:
        return self.server.sqlalchemy_url(database, driver="psycopg")

    def create_database(self, *, prefix: str = "ledger") -> str:
        import psycopg

        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        dsn = f"host=127.0.0.1 port={self.server.port} user=postgres dbname=postgres"
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return name

    def dump(self, database: str) -> bytes:
        """`pg_dump` of one database: every row it holds, as SQL text."""
        return subprocess.run([str(postgres_bin() / "pg_dump"), "-h", "127.0.0.1", "-p", str(self.server.port),
                               "-U", "postgres", "--data-only", database], check=True, capture_output=True).stdout  # fmt: skip


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The session's PostgreSQL server, started only when a test asks for it."""
    server = start_postgres(database="ledger")
    try:
        yield PostgresServer(server)
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A fresh, empty database of the session's server (the ledger upgrades it from nothing)."""
    return postgres_server.url(postgres_server.create_database())


def sqlite_ledger_bytes(url: str) -> bytes:
    """Every byte a SQLite ledger at `url` holds on disk (the file, its WAL and shared memory),
    once the rows queued for it are written.

    Read by another process (`cat`), never opened here: this process holds the ledger writer's
    connection, and closing any descriptor of a database file drops every POSIX lock the process
    holds on it (SQLite's "How To Corrupt An SQLite Database File", on POSIX advisory locks). The
    next process to close its connection then believes it is the last, and deletes the WAL and
    shared memory under the writer: "disk I/O error" and "database disk image is malformed" for the
    rest of the session (a CI failure of the in-tree history test, later on the same xdist worker)."""
    from storage_migrator.ledger.writer import writer_for

    assert writer_for(url).flush(30)
    path = Path(url.removeprefix("sqlite:///"))
    files = [str(p) for p in sorted(path.parent.glob(path.name + "*"))]
    return subprocess.run(["cat", *files], check=True, capture_output=True, timeout=60).stdout
