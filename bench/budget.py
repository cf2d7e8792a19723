"""Budget adherence (issue 13, benchmark 1): does the shared write budget hold?

For each Prefect database (SQLite, PostgreSQL), each budget (writes/s) and each
number of migrations sharing it (1, 3), this runs whole `migrate-resource` flows
(one process each, the shared budget on) against kubesim (its own process, over
etcd on /dev/shm) and a real `prefect server start` (devstack). The judge is
kubesim's count of
PATCH requests to the migrated resources, not the flow's own report: the
times kubesim saw them, per tenth of a second of its own clock
(`Admin.timeline`), not counters sampled by a client whose reads may lag:

- run ratio: writes / (budget x seconds) from the first write to the last
  (goal 0.95-1.00);
- max 10 s ratio: the most writes in any 100 consecutive tenths of a second,
  over the budget's 10 s worth (goal never above 1.00).

The baseline is the budget itself, the same in every run. Each migration gets
`budget x seconds / migrations` objects, so a case writes for about `--seconds`.

    uv run python bench/budget.py [--rates 10 50 200] [--migrations 1 3]
        [--databases sqlite postgres] [--seconds 30]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from devstack import REPO, PrefectStack
from devstack.postgres import start_postgres
from kubesim.admin import Admin
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.writing import create_object
from storage_migrator.settings import Settings

RESOURCES = ["configmaps", "secrets", "serviceaccounts"]
KINDS = {"configmaps": "ConfigMap", "secrets": "Secret", "serviceaccounts": "ServiceAccount"}
NAMESPACE = "bench"
BUDGET_LIMIT = "storage-migrator-writes"


@dataclass(frozen=True)
class Case:
    database: str
    rate: float
    migrations: int
    writes: int
    run_ratio: float
    max_window_ratio: float
    seconds: float


def start_kubesim(tmp: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """kubesim in its own process (issue 13: the client's CPU is not the server's)."""
    kubeconfig = tmp / "kubeconfig"
    log = open(tmp / "kubesim.log", "wb")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen([sys.executable, "-m", "kubesim", "serve", "--kubeconfig", str(kubeconfig)],
                            cwd=REPO, stdout=log, stderr=log)  # fmt: skip
    deadline = time.monotonic() + 60
    while not kubeconfig.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"kubesim did not start; see {tmp / 'kubesim.log'}")
        time.sleep(0.2)
    time.sleep(0.5)
    return proc, kubeconfig


def prepared(kubeconfig: Path) -> Admin:
    """The bench's namespace and our CRDs in the cluster; its admin client."""
    subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "create", "namespace", NAMESPACE],
                   check=True, capture_output=True)  # fmt: skip
    subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "apply", "-f", str(REPO / "deployments" / "crds")],
                   check=True, capture_output=True)  # fmt: skip
    time.sleep(2)  # the CRDs get served
    return Admin.from_kubeconfig(kubeconfig)


def create(kubeconfig: Path, resource: str, n: int, start: int) -> None:
    api = api_client_from_settings(Settings(kubeconfig=kubeconfig, write_concurrency=8))
    ref = ResourceRef(version="v1", resource=resource)

    def one(i: int) -> None:
        body: dict[str, object] = {"apiVersion": "v1", "kind": KINDS[resource], "metadata": {"name": f"b-{i:07d}"}}
        if resource != "serviceaccounts":
            body["data"] = {"k": "eA==" if resource == "secrets" else "x"}
        create_object(api, ref, body, namespace=NAMESPACE)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, range(start, start + n)))
    api.close()  # type: ignore[no-untyped-call]


def run_case(stack: PrefectStack, kubeconfig: Path, admin: Admin, rate: float, n: int, seconds: float) -> Case:
    resources = RESOURCES[:n]
    per = max(1, round(rate * seconds / n))
    for r in resources:  # fresh objects each case: delete what an earlier case left
        subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "-n", NAMESPACE, "delete", r, "--all",
                        "--wait=false"], capture_output=True, timeout=300)  # fmt: skip
        create(kubeconfig, r, per, 0)
    # the operator's budget, set for everyone (the runs read it; DESIGN 4.5)
    stack.run("gcl", "update", BUDGET_LIMIT, "--slot-decay-per-second", str(rate), "--limit", str(max(1, int(rate))))
    began = int(time.time() * 10)
    env = {**stack.env, "STORAGE_MIGRATOR_KUBECONFIG": str(kubeconfig), "STORAGE_MIGRATOR_SHARED_WRITE_BUDGET": "true",
           "STORAGE_MIGRATOR_WRITE_RATE_PER_SECOND": str(rate)}  # fmt: skip
    code = "import sys; from flows.migrate_resource import migrate_resource; migrate_resource(resource=sys.argv[1])"
    procs = [subprocess.Popen([sys.executable, "-c", code, r], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=open(stack.home / f"flow-{r}.log", "wb"))  # noqa: SIM115
             for r in resources]  # fmt: skip
    for p in procs:
        p.wait(timeout=seconds * 10 + 300)
    if any(p.returncode for p in procs):
        raise SystemExit(f"a migration failed; see {stack.home}/flow-*.log")
    return summarize(stack_db(stack), rate, n, writes_per_tenth(admin, resources, since=began))


def writes_per_tenth(admin: Admin, resources: list[str], *, since: int) -> list[int]:
    """The PATCHes kubesim saw, per tenth of a second, from the first to the last (its own clock)."""
    per: dict[int, int] = {}
    for key, rows in admin.timeline().items():
        verb, resource = key.split(" ", 1)
        if verb == "patch" and resource in resources:
            for tenth, n in rows:
                if tenth >= since:
                    per[tenth] = per.get(tenth, 0) + n
    if not per:
        return []
    first, last = min(per), max(per)
    return [per.get(t, 0) for t in range(first, last + 1)]


def stack_db(stack: PrefectStack) -> str:
    return "postgres" if "PREFECT_API_DATABASE_CONNECTION_URL" in stack.server_env else "sqlite"


def summarize(database: str, rate: float, n: int, tenths: list[int]) -> Case:
    """Run ratio: writes over budget x the time from the first write to the last; max 10 s:
    the most writes in any 100 consecutive tenths, over the budget's 10 s worth."""
    writes = sum(tenths)
    span = len(tenths) / 10
    run_ratio = writes / (rate * span) if span > 0 else float("nan")
    window = sum(tenths[:100])
    best = window
    for i in range(100, len(tenths)):
        window += tenths[i] - tenths[i - 100]
        best = max(best, window)
    return Case(database, rate, n, writes, run_ratio, best / (rate * 10), span)


def machine() -> str:
    free = subprocess.run(["free", "-h"], capture_output=True, text=True).stdout.split("\n")[1].split()[1]
    load = os.getloadavg()
    return (f"{os.cpu_count()} cores, {free} RAM, Python {platform.python_version()}, "
            f"load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}")  # fmt: skip


def bench_database(database: str, args: argparse.Namespace, kubeconfig: Path, admin: Admin) -> list[Case]:
    pg = start_postgres() if database == "postgres" else None
    server_env = {"PREFECT_API_DATABASE_CONNECTION_URL": pg.url} if pg else {}
    stack = PrefectStack(Path(tempfile.mkdtemp(prefix=f"bench-budget-{database}-")), server_env=server_env)
    cases: list[Case] = []
    try:
        stack.start_server()
        stack.run("gcl", "create", BUDGET_LIMIT, "--limit", "10", "--slot-decay-per-second", "10")
        for _ in range(args.repeat):
            for rate in args.rates:
                for n in args.migrations:
                    case = run_case(stack, kubeconfig, admin, rate, n, args.seconds)
                    print(f"{case.database:<8} {case.rate:>6.0f} {case.migrations:>3} {case.writes:>7} "
                          f"{case.seconds:>6.1f} {case.run_ratio:>9.3f} {case.max_window_ratio:>10.3f}", flush=True)  # fmt: skip
                    cases.append(case)
    finally:
        stack.stop()
        stack.wipe()
        if pg:
            pg.stop()
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=float, nargs="+", default=[10, 50, 200], help="budgets, writes/s")
    parser.add_argument("--migrations", type=int, nargs="+", default=[1, 3], choices=[1, 2, 3])
    parser.add_argument("--databases", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"])
    parser.add_argument("--seconds", type=float, default=30, help="seconds of writes per case")
    parser.add_argument("--repeat", type=int, default=1, help="runs of every case")
    args = parser.parse_args()
    print(f"bench/budget.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {machine()}")
    print(f"{'database':<8} {'budget':>6} {'n':>3} {'writes':>7} {'secs':>6} {'run ratio':>9} {'max 10 s':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        kubesim, kubeconfig = start_kubesim(Path(tmp))
        try:
            admin = prepared(kubeconfig)
            cases = [c for db in args.databases for c in bench_database(db, args, kubeconfig, admin)]
        finally:
            kubesim.terminate()
            kubesim.wait(timeout=30)
    groups: dict[tuple[str, float, int], list[Case]] = {}
    for c in cases:
        groups.setdefault((c.database, c.rate, c.migrations), []).append(c)
    print("summary (median, min-max over --repeat runs)")
    for (db, rate, n), cs in groups.items():
        runs = [c.run_ratio for c in cs]
        wins = [c.max_window_ratio for c in cs]
        print(f"{db:<8} {rate:>6.0f} {n:>3}  run {statistics.median(runs):.3f} ({min(runs):.3f}-{max(runs):.3f})"
              f"  max 10 s {statistics.median(wins):.3f} ({min(wins):.3f}-{max(wins):.3f})")  # fmt: skip
    print(json.dumps([c.__dict__ for c in cases]))
    print(f"end: {machine()}")


if __name__ == "__main__":
    main()
