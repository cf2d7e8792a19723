"""Write budget adherence (issues 13, 37): 1, 2, 4 and 8 writers sharing one cluster's budget.

Issue 37: "`bench/budget.py` and `bench/budget_restarts.py` give the adherence table again:
1, 2, 4 and 8 writers". The budget is counted in the cluster (each writing run's Lease,
storage_migrator/migration/write_budget.py), so the Prefect server's database no longer
matters to it: one `prefect server start` (devstack, SQLite) serves the flows.

For each budget (writes/s) and each number of writers n, n whole `migrate-resource` flows run
at once, each on a resource of its own (a CRD `things.b<i>.bench.example.com`, so that each
run is one request and one Lease), each in a process forked from one that loaded Prefect and
the flows once and released together (a start costs none of the others' CPU), against kubesim
in its own process (etcd on /dev/shm). Each writer gets `budget x seconds / n` objects,
created in the CRD's storage version, which is then switched, so every object is re-encoded.
The judge is kubesim's record of the PATCHes it received per tenth of a second
(`Admin.timeline`), never the flows' reports; the baseline is the budget itself:

- run ratio: writes / (budget x seconds) from the first write to the last (goal 0.95-1.00);
- max 10 s: the most writes in any 100 consecutive tenths / (budget x 10) (goal: never above 1.00).

    uv run python -m bench.budget [--rates 10 50] [--writers 1 2 4 8] [--seconds 30] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from bench.stand import REPO, machine
from devstack import PrefectStack
from kubesim.admin import Admin
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.settings import Settings

NAMESPACE = "bench"
#: The most writers a case may have: one CRD each.
MOST = 8
WINDOW = 100  # tenths of a second: the promise's 10 s


def group(i: int) -> str:
    return f"b{i}.bench.example.com"


def resource(i: int) -> str:
    """The group-resource of writer i, as kubesim's timeline names it."""
    return f"things.{group(i)}"


def thing_crd(i: int) -> dict[str, Any]:
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"things.{group(i)}"},
            "spec": {"group": group(i), "scope": "Namespaced",
                     "names": {"plural": "things", "singular": "thing", "kind": "Thing"},
                     "versions": [{"name": v, "served": True, "storage": v == "v1", "schema": schema}
                                  for v in ("v1", "v2")]}}  # fmt: skip


def start_kubesim(tmp: Path, *, servers: int = 1) -> tuple[subprocess.Popen[bytes], Path]:
    """kubesim in its own process (issue 13: the client's CPU is not the server's); `servers`
    API servers over its etcd, contexts kubesim-0, kubesim-1, ... (each with its own timeline)."""
    kubeconfig = tmp / "kubeconfig"
    log = open(tmp / "kubesim.log", "wb")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen([sys.executable, "-m", "kubesim", "serve", "--kubeconfig", str(kubeconfig),
                             "--servers", str(servers)], cwd=REPO, stdout=log, stderr=log)  # fmt: skip
    deadline = time.monotonic() + 60
    while not kubeconfig.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"kubesim did not start; see {tmp / 'kubesim.log'}")
        time.sleep(0.2)
    time.sleep(0.5)
    return proc, kubeconfig


def prepared(kubeconfig: Path) -> Admin:
    """The install (our CRDs, deployments/rbac/: the namespace of the writer Leases), the bench's
    namespace and its CRDs; the admin client."""
    kubectl = ["kubectl", "--kubeconfig", str(kubeconfig)]
    subprocess.run([*kubectl, "apply", "-f", str(REPO / "deployments" / "crds"), "-f", str(REPO / "deployments" / "rbac")],
                   check=True, capture_output=True)  # fmt: skip
    subprocess.run([*kubectl, "create", "namespace", NAMESPACE], check=True, capture_output=True)
    api = api_client_from_settings(Settings(kubeconfig=kubeconfig))
    ext = k8s.ApiextensionsV1Api(api)
    for i in range(MOST):
        ext.create_custom_resource_definition(thing_crd(i))
    api.close()  # type: ignore[no-untyped-call]
    time.sleep(2)  # the CRDs get served
    return Admin.from_kubeconfig(kubeconfig)


def fill(kubeconfig: Path, i: int, n: int) -> None:
    """Writer i's CRD holds `n` fresh objects, stored in one version; then the other version is
    made the storage version (an upgrade): every object has a write to make."""
    api = api_client_from_settings(Settings(kubeconfig=kubeconfig))
    custom, ext = k8s.CustomObjectsApi(api), k8s.ApiextensionsV1Api(api)
    custom.delete_collection_namespaced_custom_object(group(i), "v1", NAMESPACE, "things")

    def one(j: int) -> None:
        custom.create_namespaced_custom_object(group(i), "v1", NAMESPACE, "things", {
            "apiVersion": f"{group(i)}/v1", "kind": "Thing", "metadata": {"name": f"t-{j:06d}"}, "spec": {"j": j}})  # fmt: skip

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, range(n)))
    crd = ext.read_custom_resource_definition(f"things.{group(i)}")
    for version in crd.spec.versions:
        version.storage = not version.storage
    ext.replace_custom_resource_definition(f"things.{group(i)}", crd)
    api.close()  # type: ignore[no-untyped-call]


#: A process that loads Prefect and the flows once, then forks one child per run of argv[2] (a JSON
#: list of {"params", "env", "log"}); each child waits for the go file argv[1], runs
#: `migrate_resource(**params)` and exits 0 if it Completed; the parent prints
#: {"pids": [...]} at once, and {"codes": [...]} once every child ended. It starts no thread.
FORKER = """
import json, os, sys, time
from pathlib import Path
import alembic.command, alembic.config, alembic.runtime.migration, alembic.script, sqlite3
import fastapi.encoders, prefect.flow_engine, prefect.task_engine
from flows.migrate_resource import migrate_resource
go, runs = Path(sys.argv[1]), json.loads(sys.argv[2])
pids = []
for run in runs:
    pid = os.fork()
    if pid == 0:
        log = os.open(run["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.update(run["env"])
        while not go.exists():
            time.sleep(0.01)
        state = migrate_resource(**run["params"], return_state=True)
        print("final state:", state.type.value, state.message, flush=True)
        sys.exit(0 if state.is_completed() else 1)
    pids.append(pid)
print(json.dumps({"pids": pids}), flush=True)
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
print(json.dumps({"codes": codes}), flush=True)
"""


class Forked:
    """The runs of FORKER: released by `go()`, ended by `wait()`."""

    def __init__(self, stack: PrefectStack, runs: list[dict[str, Any]], work: Path) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.go_file = work / "go"
        self.proc = subprocess.Popen([sys.executable, "-c", FORKER, str(self.go_file), json.dumps(runs)], cwd=REPO,
                                     env=stack.env, stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert self.proc.stdout is not None
        self.pids: list[int] = json.loads(self.proc.stdout.readline())["pids"]

    def go(self) -> float:
        self.go_file.touch()
        return time.time()

    def wait(self, timeout: float) -> list[int]:
        out, _ = self.proc.communicate(timeout=timeout)
        return list(json.loads(out)["codes"])


def per_tenth(admin: Admin, resources: list[str], *, since: int, until: int | None = None) -> dict[int, int]:
    """The PATCHes of `resources` kubesim saw, per tenth of a second of its clock, in [since, until)."""
    per: dict[int, int] = {}
    for key, rows in admin.timeline().items():
        verb, what = key.split(" ", 1)
        if verb == "patch" and what in resources:
            for tenth, n in rows:
                if tenth >= since and (until is None or tenth < until):
                    per[tenth] = per.get(tenth, 0) + n
    return per


def max_window(per: dict[int, int]) -> int:
    """The most writes in any WINDOW consecutive tenths."""
    if not per:
        return 0
    first, last = min(per), max(per)
    return max(
        sum(per.get(t, 0) for t in range(s, s + WINDOW)) for s in range(first, max(first, last - WINDOW + 1) + 1)
    )


@dataclass(frozen=True)
class Case:
    rate: float
    writers: int
    writes: int
    seconds: float
    run_ratio: float
    max_window_ratio: float


def judge(rate: float, writers: int, per: dict[int, int]) -> Case:
    span = (max(per) + 1 - min(per)) / 10
    writes = sum(per.values())
    return Case(rate, writers, writes, span, writes / (rate * span), max_window(per) / (rate * WINDOW / 10))


def run_case(stack: PrefectStack, kubeconfig: Path, admin: Admin, rate: float, n: int, seconds: float,
             work: Path) -> Case:  # fmt: skip
    each = max(1, round(rate * seconds / n))
    for i in range(n):
        fill(kubeconfig, i, each)
    runs = [{"params": {"resource": "things", "group": group(i), "write_rate_per_second": rate},
             "env": {"STORAGE_MIGRATOR_KUBECONFIG": str(kubeconfig), "STORAGE_MIGRATOR_SHARED_WRITE_BUDGET": "true",
                     "PREFECT_LOGGING_LEVEL": "WARNING"},
             "log": str(work / f"flow-{i}.log")} for i in range(n)]  # fmt: skip
    forked = Forked(stack, runs, work)
    time.sleep(3)  # the forks are ready (they load nothing more)
    since = int(forked.go() * 10)
    codes = forked.wait(timeout=seconds * 10 + 300)
    if any(codes):
        raise SystemExit(f"a migration did not complete ({codes}); see {work}/flow-*.log")
    return judge(rate, n, per_tenth(admin, [resource(i) for i in range(n)], since=since))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=float, nargs="+", default=[10, 50], help="budgets, writes/s")
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 2, 4, 8], choices=range(1, MOST + 1))
    parser.add_argument("--seconds", type=float, default=30, help="seconds of writes per case, at the budget")
    parser.add_argument("--repeat", type=int, default=1, help="runs of every case")
    args = parser.parse_args()
    print(f"bench/budget.py: {machine()}", flush=True)
    print(f"{'budget':>6} {'n':>3} {'writes':>7} {'secs':>6} {'run ratio':>9} {'max 10 s':>8}", flush=True)
    cases: list[Case] = []
    with tempfile.TemporaryDirectory(prefix="bench-budget-") as tmp:
        kubesim, kubeconfig = start_kubesim(Path(tmp))
        stack = PrefectStack(Path(tmp) / "prefect")
        try:
            admin = prepared(kubeconfig)
            stack.start_server()
            for repeat in range(args.repeat):
                for rate in args.rates:
                    for n in args.writers:
                        case = run_case(stack, kubeconfig, admin, rate, n, args.seconds,
                                        Path(tmp) / f"case-{repeat}-{rate:g}-{n}")  # fmt: skip
                        cases.append(case)
                        print(f"{case.rate:>6.0f} {case.writers:>3} {case.writes:>7} {case.seconds:>6.1f} "
                              f"{case.run_ratio:>9.3f} {case.max_window_ratio:>8.3f}", flush=True)  # fmt: skip
        finally:
            stack.stop()
            kubesim.terminate()
            kubesim.wait(timeout=30)
    print("summary (median, min-max over --repeat runs)")
    groups: dict[tuple[float, int], list[Case]] = {}
    for c in cases:
        groups.setdefault((c.rate, c.writers), []).append(c)
    for (rate, n), cs in groups.items():
        runs, wins = [c.run_ratio for c in cs], [c.max_window_ratio for c in cs]
        print(f"{rate:>6.0f} {n:>3}  run {statistics.median(runs):.3f} ({min(runs):.3f}-{max(runs):.3f})"
              f"  max 10 s {statistics.median(wins):.3f} ({min(wins):.3f}-{max(wins):.3f})")  # fmt: skip
    print(json.dumps([c.__dict__ for c in cases]))
    print(f"end: {machine()}")


if __name__ == "__main__":
    main()
