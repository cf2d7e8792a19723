"""How far apart a fleet rotation's clusters start, SQLite vs PostgreSQL (issue 30, item 4).

Issue 30: "Run the fleet rotation's test on a PostgreSQL Prefect server, and record in
docs/benchmarks.md how far apart the clusters' rotations start (on SQLite: 13-16 s)."
docs/key-rotation.md says why they may start apart: the clusters' runs are subflows that
start together in one process, each a few writes to the server (create the run, set it
Running, tag it); on SQLite those writes meet on the file's one writer, the server answers
503 ("database is locked") and Prefect's client waits 2, 4, then 8 s before it tries again.

For each database, a real `prefect server start` (devstack; PostgreSQL from
devstack.postgres, as bench/budget.py starts it). Each repetition makes three kubesim
clusters (kubesim.cluster.Cluster, in this process, each over an etcd of its own) as
tests/integration/test_fleet_rotation.py's `fleet` fixture does: Secrets stored under key1,
then key2 made the write key; a KubernetesClusterConfig block per cluster saved on the
server (a process of its own). Then ONE fleet rotation runs in a process of its own, as
the test calls it:

    rotate_encryption_key(key="key2", resources=["secrets"], clusters=[a, b, c],
                          max_parallel_clusters=3, write_rate_per_second=5000,
                          write_concurrency=4, chunk_size=100)

The clusters have no deployments of their own, so each cluster's rotation is a subflow of
the parent, started by a thread of its own (flows/fleet_runs.py). The figures are read from
the server afterwards, from the three child runs (flow `rotate-encryption-key`, tagged
`cluster:<name>`):

- start spread: the last child's start (the time Prefect set it Running) minus the first's;
- created spread: the same for the times the child runs were created on the server;
- first start: from the parent's start to the first child's;
- 503 retries: the rotation process's client retries after a 503 (Prefect's client logs each
  at DEBUG with its wait; a filter on `prefect.client` records them): all of them, and those
  from the parent's start to the last child's start, with the seconds they waited;
- the server's side: the retryable errors it logged during the rotation (it answers them 503;
  PREFECT_SERVER_LOG_RETRYABLE_ERRORS is on here), and how many of them say "database is locked".

A repetition counts only if the rotation ended Completed and every cluster's Secrets are
stored under key2 in its etcd (read back here); otherwise it is reported and not measured.
Every process started here (servers, postgres, etcd, the rotation) is ended in `finally`.

    uv run python -m bench.fleet_rotation_start [--databases sqlite postgres] [--repeat 3]
        [--secrets 20] [--logs DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.stand import REPO, machine
from devstack import PrefectStack
from devstack.postgres import start_postgres
from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.etcd import prefix_end
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.settings import Settings

KEY = "key2"
NAMESPACE = "default"
RETRY_503 = "retryable status code 503"
#: "... Another attempt will be made in 2.13s. ..." (prefect/client/base.py)
RETRY_WAIT = re.compile(r"made in ([0-9.]+)s")


@dataclass
class Child:
    """One cluster's rotation run, as the server recorded it (seconds since the epoch)."""

    cluster: str
    state: str
    created: float
    start: float | None


@dataclass
class Rotation:
    """One fleet rotation of three clusters, and what each etcd held afterwards."""

    database: str
    repetition: int
    state: str
    seconds: float  # the rotation process, from its start to its exit
    parent_start: float | None
    children: list[Child]
    retries_503: list[tuple[float, float]]  # (when, seconds waited) of each retry after a 503
    under_key2: dict[str, bool]  # every Secret of the cluster stored under key2
    load: float
    server_retryable: int = 0  # retryable errors the server logged (answered 503)
    server_locked: int = 0  # of them, "database is locked"
    problems: list[str] = field(default_factory=list)

    @property
    def measured(self) -> bool:
        return not self.problems

    @property
    def start_spread(self) -> float:
        starts = [c.start for c in self.children if c.start is not None]
        return max(starts) - min(starts)

    @property
    def created_spread(self) -> float:
        return max(c.created for c in self.children) - min(c.created for c in self.children)

    @property
    def first_start(self) -> float:
        starts = [c.start for c in self.children if c.start is not None]
        return min(starts) - (self.parent_start or float("nan"))

    def retries_before_last_start(self) -> list[float]:
        """The waits of the 503 retries from the parent's start to the last child's start."""
        starts = [c.start for c in self.children if c.start is not None]
        first, last = self.parent_start or min(starts), max(starts)
        return [wait for t, wait in self.retries_503 if first <= t <= last]

    def starts_after_first(self) -> list[float]:
        """Each child's start after the first child's, in order."""
        starts = sorted(c.start for c in self.children if c.start is not None)
        return [s - starts[0] for s in starts]


# --- in a process of its own, with the stack's environment --------------------------------------


def child_save_blocks(pairs: Sequence[str]) -> None:
    """`name=kubeconfig` each: a KubernetesClusterConfig block per cluster, on the stack's server."""
    from prefect_kubernetes.credentials import KubernetesClusterConfig

    for pair in pairs:
        name, kubeconfig = pair.split("=", 1)
        KubernetesClusterConfig.from_file(Path(kubeconfig)).save(name, overwrite=True)


class _Count503(logging.Filter):
    """Records the client's retries after a 503 (logged at DEBUG): when, and the wait; lets only
    INFO and above on."""

    def __init__(self) -> None:
        super().__init__()
        self.retries: list[tuple[float, float]] = []

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if RETRY_503 in message:
            wait = RETRY_WAIT.search(message)
            self.retries.append((record.created, float(wait.group(1)) if wait else float("nan")))
        return record.levelno >= logging.INFO


def child_rotate(clusters: Sequence[str]) -> None:
    """The fleet rotation, as tests/integration/test_fleet_rotation.py calls it; then its runs, as JSON."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterTags

    from flows.rotate_encryption_key import rotate_encryption_key

    # After Prefect's import, which sets its loggers' levels up (INFO).
    client_log = logging.getLogger("prefect.client")
    counter = _Count503()
    client_log.addFilter(counter)
    client_log.setLevel(logging.DEBUG)

    state: Any = rotate_encryption_key(key=KEY, resources=["secrets"], clusters=list(clusters),
                                       max_parallel_clusters=3, write_rate_per_second=5000, write_concurrency=4,
                                       chunk_size=100, return_state=True)  # fmt: skip
    children = []
    with get_client(sync_client=True) as client:
        parent = client.read_flow_run(state.state_details.flow_run_id)
        for c in clusters:
            runs = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["rotate-encryption-key"])),
                flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"cluster:{c}"])),
            )
            for run in runs:
                children.append({"cluster": c, "state": run.state_name or "",
                                 "created": run.created.timestamp() if run.created else float("nan"),
                                 "start": run.start_time.timestamp() if run.start_time else None})  # fmt: skip
    print(json.dumps({"state": state.name, "message": state.message or "", "retries_503": counter.retries,
                      "parent_start": parent.start_time.timestamp() if parent.start_time else None,
                      "children": children}), flush=True)  # fmt: skip


# --- the bench -----------------------------------------------------------------------------------


def encrypted_with(cluster: Cluster) -> dict[str, str]:
    """The key each Secret of `default` is stored under, read from the cluster's etcd."""
    prefix = f"/registry/secrets/{NAMESPACE}/".encode()
    etcd = cluster.etcd()
    try:
        values = {bytes(kv.key).decode().rsplit("/", 1)[1]: bytes(kv.value)
                  for kv in etcd.range(prefix, prefix_end(prefix)).kvs}  # fmt: skip
    finally:
        etcd.close()
    return {name: v.split(b":")[4].decode() if v.startswith(b"k8s:enc:") else "plaintext" for name, v in values.items()}


def install_crds(kubeconfig: Path) -> None:
    """Our CRDs (the migrations' requests), served before returning."""
    kubectl = ["kubectl", "--kubeconfig", str(kubeconfig)]
    subprocess.run(
        [*kubectl, "apply", "-f", str(REPO / "deployments" / "crds"), "-f", str(REPO / "deployments" / "rbac")],
        check=True,
        capture_output=True,
    )
    deadline = time.monotonic() + 60
    while subprocess.run([*kubectl, "get", "storageversionmigrations"], capture_output=True).returncode:
        if time.monotonic() > deadline:
            raise SystemExit("the CRDs were not served within 60 s")
        time.sleep(0.2)


def seed(cluster: Cluster, kubeconfig: Path, secrets: int) -> None:
    """The `fleet` fixture's order (seed 003): Secrets written under key1, then key2 the write key."""
    from kubernetes import client as k8s

    admin = Admin.from_kubeconfig(kubeconfig)
    admin.set_encryption(["key1"], resources=["secrets"])
    api = api_client_from_settings(Settings(kubeconfig=kubeconfig))
    try:
        core = k8s.CoreV1Api(api)
        for i in range(secrets):
            core.create_namespaced_secret(NAMESPACE, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=f"s-{i:04d}"),
                                                                  string_data={"v": str(i)}))  # fmt: skip
    finally:
        api.close()  # type: ignore[no-untyped-call]
    admin.set_encryption(["key1", "key2"], resources=["secrets"])
    admin.set_encryption(["key2", "key1"], resources=["secrets"])
    if set(encrypted_with(cluster).values()) != {"key1"}:
        raise SystemExit("the seeded Secrets are not all under key1")


@contextmanager
def three_clusters(tmp: Path, secrets: int) -> Iterator[dict[str, tuple[Cluster, Path]]]:
    """Clusters a, b and c (names unique to this repetition), each over an etcd of its own."""
    suffix = uuid.uuid4().hex[:6]
    with ExitStack() as stack:
        clusters = {}
        for letter in "abc":
            name = f"rot-{letter}-{suffix}"
            cluster = stack.enter_context(Cluster())
            kubeconfig = cluster.write_kubeconfig(tmp / f"{name}.kubeconfig")
            install_crds(kubeconfig)
            seed(cluster, kubeconfig, secrets)
            clusters[name] = (cluster, kubeconfig)
        yield clusters


def child_env(stack: PrefectStack, tmp: Path) -> dict[str, str]:
    """The stack's environment (its API and whatever it needs to reach it), and no cluster of the
    environment's: each cluster's block is its credentials, as in the test."""
    env = {**stack.env, "KUBECONFIG": str(tmp / "absent")}
    for name in [n for n in env if n.startswith("STORAGE_MIGRATOR_")]:
        env.pop(name)
    return env


def run_child(args: list[str], env: dict[str, str], log: Path, *, timeout: float) -> str:
    """`python -m bench.fleet_rotation_start --child ...`; its stdout (its stderr to `log`)."""
    with open(log, "ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "bench.fleet_rotation_start", "--child", *args], cwd=REPO,
                                env=env, stdout=subprocess.PIPE, stderr=err)  # fmt: skip
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"{args[0]} took more than {timeout:.0f} s; see {log}") from None
        finally:
            if proc.poll() is None:  # timed out, or this process interrupted
                proc.kill()
                proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{args[0]} exited {proc.returncode}; see {log}:\n{log.read_text(errors='replace')[-3000:]}")
    return out.decode()


def one_rotation(stack: PrefectStack, database: str, repetition: int, args: argparse.Namespace,
                 logs: Path) -> Rotation:  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-rotation-start-") as tmp_dir:
        tmp = Path(tmp_dir)
        with three_clusters(tmp, args.secrets) as clusters:
            env = child_env(stack, tmp)
            log = logs / f"rotation-{database}-{repetition}.log"
            run_child(["blocks", *(f"{n}={k}" for n, (_, k) in clusters.items())], env, log, timeout=300)
            load = os.getloadavg()[0]
            began = time.time()
            out = run_child(["rotate", *clusters], env, log, timeout=600)
            seconds = time.time() - began
            report = json.loads(out.strip().splitlines()[-1])
            under = {n: set(encrypted_with(c).values()) == {KEY} for n, (c, _) in clusters.items()}
    children = [Child(**c) for c in report["children"]]
    rotation = Rotation(database=database, repetition=repetition, state=report["state"], seconds=seconds,
                        parent_start=report["parent_start"], children=children,
                        retries_503=[(t, w) for t, w in report["retries_503"]], under_key2=under, load=load)  # fmt: skip
    if report["state"] != "Completed":
        rotation.problems.append(f"the rotation ended {report['state']}: {report['message'][:500]}")
    if sorted(c.cluster for c in children) != sorted(clusters) or any(c.start is None for c in children):
        rotation.problems.append(f"not one started child run per cluster: {[asdict(c) for c in children]}")
    if not all(under.values()):
        rotation.problems.append(f"Secrets not all under {KEY}: {under}")
    return rotation


def server_log_size(stack: PrefectStack) -> int:
    log = stack.home / "server.log"
    return log.stat().st_size if log.exists() else 0


def server_errors(stack: PrefectStack, since: int) -> tuple[int, int]:
    """Retryable errors the server logged after byte `since` of its log, and those saying 'database is locked'."""
    with open(stack.home / "server.log", "rb") as log:
        log.seek(since)
        text = log.read().decode(errors="replace")
    blocks = text.split("Encountered retryable exception in request")[1:]
    return len(blocks), sum("database is locked" in b for b in blocks)


def bench_database(database: str, args: argparse.Namespace, logs: Path) -> list[Rotation]:
    pg = start_postgres() if database == "postgres" else None
    # Each 503's cause in the server's log (Prefect logs none by default).
    server_env = {"PREFECT_SERVER_LOG_RETRYABLE_ERRORS": "true"}
    if pg:
        server_env["PREFECT_API_DATABASE_CONNECTION_URL"] = pg.url
    stack = PrefectStack(Path(tempfile.mkdtemp(prefix=f"bench-rotation-start-{database}-")), server_env=server_env)
    rotations: list[Rotation] = []
    try:
        stack.start_server()
        for i in range(1, args.repeat + 1):
            since = server_log_size(stack)
            r = one_rotation(stack, database, i, args, logs)
            r.server_retryable, r.server_locked = server_errors(stack, since)
            rotations.append(r)
            if r.measured:
                waits = r.retries_before_last_start()
                print(f"{database:<8} {i:>3} {r.state:<10} {r.seconds:>6.1f} {r.start_spread:>7.2f} "
                      f"{r.created_spread:>8.2f} {r.first_start:>6.2f} {len(r.retries_503):>5} "
                      f"{len(waits):>3} ({sum(waits):>5.1f} s) {r.server_retryable:>6} {r.server_locked:>6}  "
                      f"[{', '.join(f'{s:.2f}' for s in r.starts_after_first())}] load {r.load:.1f}", flush=True)  # fmt: skip
            else:
                print(f"{database:<8} {i:>3} {r.state:<10} {r.seconds:>6.1f} not measured", flush=True)
            for problem in r.problems:
                print(f"  NOT MEASURED: {problem}", flush=True)
    finally:
        stack.stop()
        server_log = stack.home / "server.log"
        if server_log.exists():
            (logs / f"server-{database}.log").write_bytes(server_log.read_bytes())
        stack.wipe()
        if pg:
            pg.stop()
    return rotations


def summary(rotations: list[Rotation]) -> None:
    print(
        "\ndatabase  measured  start spread s median (min-max)  created spread s     first start s     "
        "503 retries before the last start"
    )
    for database in dict.fromkeys(r.database for r in rotations):
        ok = [r for r in rotations if r.database == database and r.measured]
        if not ok:
            print(f"{database:<9} 0 of {sum(r.database == database for r in rotations)}")
            continue

        def mm(values: list[float]) -> str:
            return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

        print(f"{database:<9} {len(ok)} of {sum(r.database == database for r in rotations):<4} "
              f"{mm([r.start_spread for r in ok]):<33} {mm([r.created_spread for r in ok]):<20} "
              f"{mm([r.first_start for r in ok]):<17} "
              f"{mm([float(len(r.retries_before_last_start())) for r in ok])}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--databases", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"])
    parser.add_argument("--repeat", type=int, default=3, help="fleet rotations per database")
    parser.add_argument("--secrets", type=int, default=20, help="Secrets per cluster")
    parser.add_argument("--logs", type=Path, help="keep the rotations' and servers' logs in this directory")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        what, rest = args.child[0], args.child[1:]
        if what == "blocks":
            child_save_blocks(rest)
        else:
            child_rotate(rest)
        return
    print(f"bench/fleet_rotation_start.py; {machine()}", flush=True)
    print(f"three clusters, {args.secrets} Secrets each, one fleet rotation to {KEY} per repetition "
          "(max_parallel_clusters=3)", flush=True)  # fmt: skip
    print(f"{'database':<8} {'rep':>3} {'state':<10} {'secs':>6} {'spread':>7} {'created':>8} {'first':>6} "
          f"{'503s':>5} {'to last start':<13} {'server':>6} {'locked':>6}  [each child's start after the first's, s]",
          flush=True)  # fmt: skip
    rotations: list[Rotation] = []
    with tempfile.TemporaryDirectory(prefix="bench-rotation-start-logs-") as tmp:
        logs = args.logs or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        for database in args.databases:
            rotations += bench_database(database, args, logs)
    summary(rotations)
    print(json.dumps([{**asdict(r), "start_spread": r.start_spread if r.measured else None} for r in rotations]))
    print(f"end: {machine()}")


if __name__ == "__main__":
    main()
