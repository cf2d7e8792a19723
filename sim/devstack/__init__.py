"""The local stack a newcomer, the e2e tests and the benchmarks run on one machine:
a Prefect server on a free port with its own home (its UI pointed at that port:
devstack.ui), the project's deployments from `prefect.yaml`, and process workers
pointed at a cluster (one, or several on the same pool to show scale-out; one can
be killed as a machine dies).

The server asks for an auth string (issue 30: Prefect's basic auth), one made for each
stack: without it whoever reaches the port reads every cluster's credentials from the
block documents. The server gets it as PREFECT_SERVER_API_AUTH_STRING; every client this
stack starts (workers, `prefect deploy`, flow runs, the CLI) as PREFECT_API_AUTH_STRING,
through `env`; tests and benchmarks call the API through `api`, `client` and `settings`.
`/api/health` stays open (the start waits on it).

Not product code (the product runs against whatever Prefect server and cluster
the operator has); it drives the same `prefect` commands an operator types.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devstack.ui import ui_server_settings, wait_for_ui

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient

#: The project's root (prefect.yaml, flows/): devstack lives in sim/devstack/ of it, installed
#: editable by the dev group, so its file is still in the checkout.
REPO = Path(__file__).resolve().parents[2]
POOL = "storage-migrator-local"
#: The user of the auth strings a stack makes (Prefect's basic auth string is `user:password`).
AUTH_USER = "admin"
#: The settings of Prefect's basic auth: the server's, and every client's.
SERVER_AUTH_SETTING = "PREFECT_SERVER_API_AUTH_STRING"
CLIENT_AUTH_SETTING = "PREFECT_API_AUTH_STRING"


def new_auth_string() -> str:
    """`admin:<32 random URL-safe characters>`: for one stack's server, never reused."""
    return f"{AUTH_USER}:{secrets.token_urlsafe(24)}"


def basic_auth_header(auth_string: str) -> dict[str, str]:
    """The header Prefect's client sends for PREFECT_API_AUTH_STRING (prefect.client.orchestration:
    `Basic` and the string in base64, user and password as one)."""
    return {"Authorization": "Basic " + base64.b64encode(auth_string.encode()).decode()}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def descendants(pid: int) -> list[int]:
    """Every process whose chain of parents leads to `pid` (Linux /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _end(pids: list[int], *, grace: float = 10) -> None:
    """SIGTERM to each process still there, SIGKILL to those left after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
        alive = []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                alive.append(pid)
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [pid for pid in alive if _running(pid)]
        pids = alive


def _running(pid: int) -> bool:
    """Alive and not a zombie (an ended process whose parent has not reaped it yet)."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _storage_migrator() -> list[str]:
    exe = Path(sys.executable).with_name("storage-migrator")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "storage_migrator.cli"]


def _prefect() -> list[str]:
    exe = Path(sys.executable).with_name("prefect")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "prefect"]


class PrefectStack:
    """`prefect server start` + work pool + `prefect deploy --all` + `storage-migrator worker`.

    `auth_string`: the server's basic auth string (`user:password`); by default one made for
    this stack (`new_auth_string`). `auth=False` starts a server that asks no one for anything,
    as Prefect does by default; nothing of ours needs one (issue 30).
    """

    def __init__(
        self,
        home: Path,
        *,
        port: int | None = None,
        worker_env: dict[str, str] | None = None,
        server_env: dict[str, str] | None = None,
        auth_string: str | None = None,
        auth: bool = True,
    ) -> None:
        self.home = home
        self.port = port or free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.ui_url = f"http://127.0.0.1:{self.port}"
        self.worker_env = worker_env or {}
        self.server_env = server_env or {}
        if auth_string is not None and ":" not in auth_string:
            raise ValueError("an auth string is user:password")
        self.auth_string: str | None = (auth_string or new_auth_string()) if auth else None
        self._server: subprocess.Popen[bytes] | None = None
        self._workers: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def env(self) -> dict[str, str]:
        """The environment of every client process of this stack: its API and its auth string
        (none from the caller's environment: this stack's, or none when its server asks for none)."""
        env = {
            **os.environ,
            "PREFECT_HOME": str(self.home),
            "PREFECT_API_URL": self.api_url,
            "DO_NOT_TRACK": "1",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_TASKS_DEFAULT_NO_CACHE": "true",
        }
        env.pop(SERVER_AUTH_SETTING, None)
        env.pop(CLIENT_AUTH_SETTING, None)
        if self.auth_string:
            env[CLIENT_AUTH_SETTING] = self.auth_string
        return env

    @property
    def auth_header(self) -> dict[str, str]:
        """The `Authorization` header of this stack's API (none when its server asks for none)."""
        return basic_auth_header(self.auth_string) if self.auth_string else {}

    def api(self, path: str, body: Any = None, *, method: str | None = None, timeout: float = 30) -> Any:
        """One call of this stack's API with its auth string: GET `path` (under /api), or POST `body`
        as JSON; the answer decoded (None when empty). An error status raises urllib's HTTPError."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.api_url}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json", **self.auth_header})  # fmt: skip
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read() or b"null")

    def client(self) -> SyncPrefectClient:
        """Prefect's synchronous client of this stack's API, with its auth string (use it in `with`)."""
        from prefect.client.orchestration import SyncPrefectClient

        return SyncPrefectClient(api=self.api_url, auth_string=self.auth_string)

    @contextlib.contextmanager
    def settings(self) -> Iterator[None]:
        """This process's Prefect settings pointed at this stack (API and auth string) inside the block:
        for code that reaches Prefect through `get_client()` or runs flows in this process."""
        from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

        auth = {PREFECT_API_AUTH_STRING: self.auth_string} if self.auth_string else {}
        with temporary_settings(updates={PREFECT_API_URL: self.api_url, **auth},
                                restore_defaults=[] if auth else [PREFECT_API_AUTH_STRING]):  # fmt: skip
            yield

    def _log(self, name: str) -> int:
        self.home.mkdir(parents=True, exist_ok=True)
        return os.open(self.home / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def run(self, *args: str) -> str:
        done = subprocess.run([*_prefect(), *args], cwd=REPO, env=self.env, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"prefect {' '.join(args)} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        return done.stdout

    def start_server(self, *, timeout: float = 120) -> None:
        """`prefect server start` on this stack's port, asking for this stack's auth string;
        returns once its API is healthy (`/api/health` asks for nothing) and its UI answers
        with this API's address (devstack.ui: issue 23)."""
        log = self._log("server")
        server_env = {**self.env, **ui_server_settings(host="127.0.0.1", port=self.port), **self.server_env}
        server_env.pop("PREFECT_API_URL")
        if self.auth_string:
            server_env[SERVER_AUTH_SETTING] = self.auth_string
        self._server = subprocess.Popen(
            [*_prefect(), "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=REPO, env=server_env, stdout=log, stderr=log,
        )  # fmt: skip
        os.close(log)
        deadline = time.monotonic() + timeout
        while True:
            if self._server.poll() is not None:
                raise RuntimeError(f"prefect server exited; see {self.home / 'server.log'}")
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prefect server not healthy after {timeout}s; see {self.home / 'server.log'}")
            time.sleep(0.5)
        wait_for_ui(self.ui_url, self.api_url, timeout=max(10.0, deadline - time.monotonic()))

    @property
    def server_running(self) -> bool:
        return self._server is not None and self._server.poll() is None

    def kill_server(self) -> None:
        """SIGKILL the server and every process under it, as when its node dies (issue 31);
        `start_server` starts it again on the same port and database."""
        server = self._server
        if server is None:
            return
        for pid in [server.pid, *descendants(server.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        server.wait()
        self._server = None

    def deploy(self, prefect_file: Path | None = None) -> None:
        self.run("work-pool", "create", POOL, "--type", "process", "--overwrite")
        extra = ["--prefect-file", str(prefect_file)] if prefect_file else []
        self.run("--no-prompt", "deploy", "--all", *extra)

    def start_worker(
        self,
        name: str = "worker",
        *,
        limit: int = 8,
        queues: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        pool: str = POOL,
    ) -> None:
        """`storage-migrator worker --pool POOL --name NAME --limit LIMIT [--work-queue Q]...`; its log is `<home>/<name>.log`.

        Our worker (issue 35), as the operator guide starts one: each run is `storage-migrator-run`
        (our flows only), whatever the pool's template or the job variables say.

        `limit` is how many flow runs it runs at once; a worker that is full
        leaves the pool's other runs to the other workers. `queues`: only these
        of the pool's queues (none: every queue). `pool`: the project's process pool, or
        a cluster's own (pull mode, issue 30).
        """
        if name in self._workers:
            raise ValueError(f"a worker named {name!r} is already running")
        log = self._log(name)
        # The worker runs in this interpreter's environment, as `uv run storage-migrator worker` does.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        self._workers[name] = subprocess.Popen(
            [*_storage_migrator(), "worker", "--pool", pool, "--name", name, "--limit", str(limit),
             *(arg for queue in queues for arg in ("--work-queue", queue))],
            # Poll for new runs every 2 s instead of 10: runs start sooner on a laptop.
            cwd=REPO, env={**self.env, "PATH": path, "PREFECT_WORKER_QUERY_SECONDS": "2", **self.worker_env,
                           **(env or {})},
            stdout=log, stderr=log,
        )  # fmt: skip
        os.close(log)

    @property
    def workers(self) -> list[str]:
        """The names of the workers this stack started and has not killed."""
        return list(self._workers)

    def worker_log(self, name: str = "worker") -> str:
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def worker_pid(self, name: str = "worker") -> int:
        return self._workers[name].pid

    def kill_worker(self, name: str) -> list[int]:
        """SIGKILL a worker and every process under it, as when its machine dies; the pids killed.

        A process worker starts each flow run in a session of its own, so killing
        the worker's process group would leave its runs going: walk /proc instead.
        """
        proc = self._workers.pop(name)
        killed: list[int] = []
        # Freeze the tree first (SIGSTOP, until no new process appears), so that nothing it
        # starts between the scan and the kill escapes as an orphan.
        tree = [proc.pid]
        while True:
            for pid in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            found = [proc.pid, *descendants(proc.pid)]
            if set(found) <= set(tree):
                break
            tree = found
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        proc.wait()
        return killed

    def stop(self) -> None:
        """Stop the workers, the flow runs they started, and the server.

        A flow run's process is in a session of its own and outlives its worker (a paused
        run would wait for its form for a day): the processes under each worker are
        ended too, found by their parents before the worker goes. All are asked to end at
        once and given one grace period together (issue 29: one after the other took 30 s).
        """
        runs = [pid for proc in self._workers.values() if proc.poll() is None for pid in descendants(proc.pid)]
        procs = [proc for proc in (*self._workers.values(), self._server) if proc is not None and proc.poll() is None]
        _end([*runs, *(proc.pid for proc in procs)], grace=20)
        for proc in procs:
            proc.wait()
        self._workers = {}
        self._server = None

    def wipe(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)
