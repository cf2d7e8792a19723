"""A throw-away PostgreSQL for a Prefect server: the documented choice for a shared
server (issue 13), started by the demo, the e2e tests and bench/budget.py alike.

Debian's `postgresql` (scripts/bootstrap.sh installs it), run as the `postgres`
OS user (postgres refuses to run as root), data on /dev/shm when there is one,
a free loopback port, trust authentication on loopback only: a local stack, not
an installation. `start_postgres(dir).url` is what
`PREFECT_API_DATABASE_CONNECTION_URL` takes. The ledger's tests start theirs with it too.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from devstack import free_port

__all__ = ["Postgres", "postgres_bin", "start_postgres"]


def postgres_bin() -> Path:
    """Debian's versioned bin directory (/usr/lib/postgresql/<major>/bin), newest first."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parent.parent.name))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql (scripts/bootstrap.sh does)")
    return found[-1].parent


def _as_postgres(args: list[str]) -> list[str]:
    return args if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--", *args]


@dataclass
class Postgres:
    """A running server; `stop()` ends it and removes its data."""

    directory: Path
    port: int
    database: str
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """For Prefect's server (asyncpg)."""
        return self.sqlalchemy_url(self.database, driver="asyncpg")

    def sqlalchemy_url(self, database: str, *, driver: str) -> str:
        """A database of this server for SQLAlchemy with `driver` (asyncpg, psycopg)."""
        return f"postgresql+{driver}://postgres@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        pid_file = self.directory / "data" / "postmaster.pid"
        if self._proc is not None and self._proc.poll() is None and pid_file.exists():
            # SIGINT to the postmaster itself (runuser may not pass a signal on): a fast
            # shutdown, which also disconnects the pooled connections clients still hold.
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGINT)
        if self._proc is not None and self._proc.poll() is None:
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        shutil.rmtree(self.directory, ignore_errors=True)


def start_postgres(directory: Path | None = None, *, database: str = "prefect", timeout: float = 60) -> Postgres:
    """initdb + postgres on a free port + createdb; returns when it accepts connections."""
    bindir = postgres_bin()
    if directory is None:
        base = "/dev/shm" if Path("/dev/shm").is_dir() else None
        directory = Path(tempfile.mkdtemp(prefix="storage-migrator-pg-", dir=base))
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / "data"
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(directory, user.pw_uid, user.pw_gid)
    init = subprocess.run(
        _as_postgres([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                      "--no-sync"]),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if init.returncode != 0:
        raise RuntimeError(f"initdb failed: {init.stdout[-1500:]}{init.stderr[-1500:]}")
    port = free_port()
    log = os.open(directory / "postgres.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    if os.geteuid() == 0:
        os.chown(directory / "postgres.log", user.pw_uid, user.pw_gid)
    proc = subprocess.Popen(
        _as_postgres([str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(directory),
                      "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
                      "-c", "full_page_writes=off", "-c", "max_connections=200"]),
        stdout=log, stderr=log,
    )  # fmt: skip
    os.close(log)
    server = Postgres(directory=directory, port=port, database=database, _proc=proc)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"postgres exited; see {directory / 'postgres.log'}")
        ready = subprocess.run([str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)], capture_output=True)
        if ready.returncode == 0:
            break
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"postgres not ready after {timeout}s; see {directory / 'postgres.log'}")
        time.sleep(0.2)
    made = subprocess.run(
        _as_postgres([str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", database]),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if made.returncode != 0:
        server.stop()
        raise RuntimeError(f"createdb {database} failed: {made.stderr[-1500:]}")
    return server
