"""A real PostgreSQL server for the ledger's tests, started lazily once per session.

Issue 12: the ledger is "tested in CI against a real PostgreSQL server that the
test run installs (Debian `postgresql`) and starts itself". scripts/bootstrap.sh
installs the binaries; this starts `initdb` + `postgres` in a directory on
/dev/shm (fast, no fsync), on a free loopback port, as the `postgres` OS user
when we are root (postgres refuses to run as root), and stops it at the end.
Each test gets a database of its own, so every test also checks the Alembic
upgrade from an empty database.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["PostgresServer", "postgres_server", "postgres_url"]


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[4]))
    if not found:
        pytest.fail("PostgreSQL is not installed: run `source scripts/bootstrap.sh` (it installs Debian's postgresql)")
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresServer:
    bin_dir: Path
    data_dir: Path
    port: int
    process: subprocess.Popen[bytes]

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        import psycopg

        name = f"ledger_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return name

    def dump(self, database: str) -> bytes:
        """`pg_dump` of one database: every row it holds, as SQL text."""
        return subprocess.run([str(self.bin_dir / "pg_dump"), "-h", "127.0.0.1", "-p", str(self.port), "-U",
                               "postgres", "--data-only", database], check=True, capture_output=True).stdout  # fmt: skip


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def start_postgres() -> PostgresServer:
    bin_dir = _bin_dir()
    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    data_dir = Path(tempfile.mkdtemp(prefix="ledger-pg-", dir=base))
    if os.geteuid() == 0:
        shutil.chown(data_dir, "postgres", "postgres")
    subprocess.run(_as_postgres([str(bin_dir / "initdb"), "-D", str(data_dir), "-U", "postgres", "-A", "trust",
                                 "-E", "UTF8", "--no-sync"]), check=True, capture_output=True)  # fmt: skip
    port = _free_port()
    process = subprocess.Popen(_as_postgres([
        str(bin_dir / "postgres"), "-D", str(data_dir), "-p", str(port), "-k", str(data_dir),
        "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
        "-c", "full_page_writes=off",
    ]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    server = PostgresServer(bin_dir=bin_dir, data_dir=data_dir, port=port, process=process)
    import psycopg

    deadline = time.monotonic() + 60
    while True:
        try:
            psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres", connect_timeout=2).close()
            return server
        except psycopg.OperationalError:
            if process.poll() is not None or time.monotonic() > deadline:
                stop_postgres(server)
                pytest.fail(f"PostgreSQL did not start on port {port} (exit code {process.poll()})")
            time.sleep(0.1)


def stop_postgres(server: PostgresServer) -> None:
    pid_file = server.data_dir / "postmaster.pid"
    if server.process.poll() is None and pid_file.exists():
        # SIGINT to the postmaster itself (runuser may not pass it on): fast shutdown, which
        # disconnects the pooled connections the tests' engines still hold.
        os.kill(int(pid_file.read_text().split()[0]), signal.SIGINT)
    if server.process.poll() is None:
        try:
            server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
    shutil.rmtree(server.data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The session's PostgreSQL server, started only when a test asks for it."""
    server = start_postgres()
    try:
        yield server
    finally:
        stop_postgres(server)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A fresh, empty database of the session's server (the ledger upgrades it from nothing)."""
    return postgres_server.url(postgres_server.create_database())
