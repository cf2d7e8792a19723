"""Budget independence across clusters (issue 20): two clusters migrating at once on one Prefect server.

Issue 20: "Two kubesim clusters, each with its own etcd, on one Prefect server. Both
migrate at once with the shared budget on, at 100 writes/s each. Judged by each kubesim's
timeline: each cluster gets 0.95-1.00 of its own budget, and no 10 s window goes over."

Two kubesim processes (`stand.KubesimProcess`), each over an etcd of its own on /dev/shm;
one `prefect server start` (devstack, SQLite); a KubernetesClusterConfig block per
cluster; `budget x --seconds` ConfigMaps in each. Every case runs whole
`migrate-resource` flows with the shared budget on (but `ceiling`) and
`write_rate_per_second=budget`, one process per run (as a worker runs them), released
together once each has loaded, after a storage version switch (every object
re-encoded). The judge is each kubesim's own record of the PATCHes it received, per
tenth of a second of its clock (`GET /_kubesim/timeline`), not the flows' reports:

- overlap: from the later run's first write to the earlier run's last, in seconds;
- overlap ratio: a cluster's writes in the overlap / (budget x overlap) (goal 0.95-1.00);
- run ratio: writes / (budget x its first to last write);
- max 10 s: the most writes in any 100 consecutive tenths / (budget x 10) (goal: never above 1.00).

The cases:

- alone (baseline): cluster A alone, its block named: what one cluster gets;
- fleet: A and B at once, each its block (each cluster's writer Leases are its own, issue 37);
- ceiling (what the machine allows): A and B at once, each its block, no budget (the
  shared budget off and `write_rate_per_second=10^6`): the objects/s two clusters at once
  reach on this machine, as a ratio to the budget; above 1.00 by far, the machine is not
  what keeps the fleet under its budget;
- one budget (`--no-control` skips it): A and B at once as the environment's cluster
  (`STORAGE_MIGRATOR_KUBECONFIG`, no block): two installs without cluster names. Before issue
  37 both shared the Prefect server's `storage-migrator-writes` and got about 0.5 each (the
  control of a budget that is NOT independent); since, the budget is counted by Leases in
  each cluster, and each gets its whole budget as in "fleet".

    uv run python -m bench.fleet_budget [--rate 100] [--seconds 60] [--repeat 1] [--no-control]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kubernetes import config as k8s_config

from bench.stand import REPO, KubesimProcess, create_configmaps, machine, median_spread
from devstack import PrefectStack
from kubesim.admin import Admin

CLUSTERS = ("a", "b")
BLOCKS = {"a": "fleet-bench-a", "b": "fleet-bench-b"}
NAMESPACE = "bench"
WINDOW = 100  # tenths of a second: the promise's 10 s
UNBUDGETED = 1e6  # writes/s of the ceiling case: no pacing to speak of

#: One flow run in a process of its own; it waits for the go file, so that loading Prefect
#: and the flows (seconds on a loaded machine) does not keep the runs apart.
CHILD = """
import sys, time
from pathlib import Path
from flows.migrate_resource import migrate_resource
ready, go, rate, cluster = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), sys.argv[4] or None
ready.touch()
while not go.exists():
    time.sleep(0.01)
state = migrate_resource(resource="configmaps", cluster=cluster, write_rate_per_second=rate, return_state=True)
sys.exit(0 if state.is_completed() else 1)
"""


@dataclass(frozen=True)
class Side:
    """One cluster's figures in one case, from its kubesim's timeline."""

    case: str
    cluster: str
    writes: int
    seconds: float
    run_ratio: float
    max_window_ratio: float
    overlap_ratio: float | None


def patches_per_tenth(admin: Admin, *, since: int) -> dict[int, int]:
    """The PATCHes of ConfigMaps this kubesim received, per tenth of a second of its own clock."""
    return {t: n for t, n in admin.timeline().get("patch configmaps", []) if t >= since}


def most_in_a_window(per: dict[int, int], first: int, last: int) -> int:
    """The most writes in any WINDOW consecutive tenths from `first` on, ending by `last` (or one window)."""
    window = sum(per.get(t, 0) for t in range(first, first + WINDOW))
    best = window
    for start in range(first + 1, last - WINDOW + 2):
        window += per.get(start + WINDOW - 1, 0) - per.get(start - 1, 0)
        best = max(best, window)
    return best


def judge(case: str, rate: float, per: dict[str, dict[int, int]]) -> tuple[float | None, list[Side]]:
    """Each cluster's figures, and the overlap of their writes in seconds (None: one cluster)."""
    spans = {c: (min(p), max(p)) for c, p in per.items()}
    first, last = max(s[0] for s in spans.values()), min(s[1] for s in spans.values())
    overlap = (last - first + 1) / 10 if len(per) > 1 and last >= first else None
    sides = []
    for c, p in per.items():
        lo, hi = spans[c]
        seconds = (hi - lo + 1) / 10
        writes = sum(p.values())
        shared = sum(n for t, n in p.items() if first <= t <= last)
        sides.append(Side(case=case, cluster=c, writes=writes, seconds=seconds, run_ratio=writes / (rate * seconds),
                          max_window_ratio=most_in_a_window(p, lo, hi) / (rate * WINDOW / 10),
                          overlap_ratio=shared / (rate * overlap) if overlap else None))  # fmt: skip
    return overlap, sides


def run_case(stack: PrefectStack, sims: dict[str, KubesimProcess], case: str, rate: float, version: str) -> tuple[float | None, list[Side]]:  # fmt: skip
    """One case's flows, released together; SystemExit if one fails."""
    members = ["a"] if case == "alone" else list(CLUSTERS)
    for sim in sims.values():
        sim.admin.set_storage_version("configmaps", version)  # every object has a write to make
    run = stack.home / f"{case.replace(' ', '-')}-{version}-{time.time_ns()}"
    run.mkdir()
    go = run / "go"
    procs = {}
    for c in members:
        shared = "false" if case == "ceiling" else "true"
        env = {**stack.env, "STORAGE_MIGRATOR_SHARED_WRITE_BUDGET": shared, "KUBECONFIG": str(run / "absent"),
               "STORAGE_MIGRATOR_DATABASE_URL": f"sqlite:///{stack.home / f'ledger-{c}.db'}"}  # fmt: skip
        env.pop("STORAGE_MIGRATOR_KUBECONFIG", None)
        cluster = BLOCKS[c]
        if case == "one budget":  # the environment's cluster: before issue 37, the server's one limit
            env["STORAGE_MIGRATOR_KUBECONFIG"], cluster = sims[c].kubeconfig, ""
        with open(run / f"flow-{c}.log", "wb") as log:
            pace = UNBUDGETED if case == "ceiling" else rate
            procs[c] = subprocess.Popen([sys.executable, "-c", CHILD, str(run / f"ready-{c}"), str(go), str(pace),
                                         cluster], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log)  # fmt: skip
    try:
        while not all((run / f"ready-{c}").exists() for c in members):
            if any(p.poll() is not None for p in procs.values()):
                raise SystemExit(f"a flow process exited before its run; see {run}/flow-*.log")
            time.sleep(0.05)
        since = int(time.time() * 10)
        go.touch()
        for p in procs.values():
            p.wait(timeout=3600)
        if any(p.returncode for p in procs.values()):
            raise SystemExit(f"a migration failed; see {run}/flow-*.log")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return judge(case, rate, {c: patches_per_tenth(sims[c].admin, since=since) for c in members})


def install_crds(kubeconfig: str) -> None:
    """Our CRDs (the migrations' requests), served before returning."""
    kubectl = ["kubectl", "--kubeconfig", kubeconfig]
    subprocess.run(
        [*kubectl, "apply", "-f", str(REPO / "deployments" / "crds"), "-f", str(REPO / "deployments" / "rbac")],
        check=True,
        capture_output=True,
    )
    deadline = time.monotonic() + 60
    while subprocess.run([*kubectl, "get", "storageversionmigrations"], capture_output=True).returncode:
        if time.monotonic() > deadline:
            raise SystemExit("the CRDs were not served within 60 s")
        time.sleep(0.5)


def save_blocks(stack: PrefectStack, sims: dict[str, KubesimProcess]) -> None:
    """A KubernetesClusterConfig block per cluster, on the stack's server."""
    from prefect_kubernetes.credentials import KubernetesClusterConfig

    with stack.settings():
        for c, sim in sims.items():
            KubernetesClusterConfig.from_file(Path(sim.kubeconfig)).save(BLOCKS[c], overwrite=True)


def row(side: Side, overlap: float | None) -> str:
    ov = f"{overlap:>7.1f}" if overlap else f"{'-':>7}"
    ratio = f"{side.overlap_ratio:>9.3f}" if side.overlap_ratio is not None else f"{'-':>9}"
    return (f"{side.case:<10} {side.cluster:>2} {side.writes:>7} {side.seconds:>6.1f} {ov} {ratio} "
            f"{side.run_ratio:>9.3f} {side.max_window_ratio:>8.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=100, help="each cluster's budget, writes/s")
    parser.add_argument("--seconds", type=float, default=60, help="seconds of writes per cluster at its budget")
    parser.add_argument("--repeat", type=int, default=1, help="runs of every case, interleaved")
    parser.add_argument("--no-control", dest="control", action="store_false", help="skip the one-budget control")
    args = parser.parse_args()
    objects = round(args.rate * args.seconds)
    cases = ["alone", "fleet", "ceiling", *(["one budget"] if args.control else [])]
    print(f"bench/fleet_budget.py: {machine()}")
    print(f"{objects} ConfigMaps per cluster, budget {args.rate:g} writes/s per cluster, cases {cases}")
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        sims = {c: KubesimProcess(Path(tmp) / c) for c in CLUSTERS}
        stack = PrefectStack(Path(tmp) / "prefect")
        results: list[tuple[float | None, list[Side]]] = []
        try:
            for c, sim in sims.items():
                (Path(tmp) / c).mkdir()
                sim.start()
                api = k8s_config.new_client_from_config(config_file=sim.kubeconfig)
                rate = create_configmaps(api, objects, namespace=NAMESPACE, threads=8, size=200)
                api.close()
                install_crds(sim.kubeconfig)
                print(f"cluster {c}: {sim.url}, its own etcd; {objects} ConfigMaps created at {rate:.0f}/s")
            stack.start_server()
            save_blocks(stack, sims)
            print(f"{'case':<10} {'cl':>2} {'writes':>7} {'secs':>6} {'overlap':>7} {'ovl ratio':>9} "
                  f"{'run ratio':>9} {'max 10 s':>8}", flush=True)  # fmt: skip
            version = "v1"
            for _ in range(args.repeat):
                for case in cases:
                    version = "v2" if version == "v1" else "v1"
                    overlap, sides = run_case(stack, sims, case, args.rate, version)
                    results.append((overlap, sides))
                    for side in sides:
                        print(row(side, overlap), flush=True)
        finally:
            stack.stop()
            for sim in sims.values():
                sim.stop()
    print("summary (median, min-max over --repeat runs)")
    for case in cases:
        overlaps = [o for o, sides in results if sides[0].case == case and o is not None]
        if overlaps:
            print(f"{case}: overlap {median_spread(overlaps, digits=1)} s")
        for c in CLUSTERS:
            mine = [s for _, sides in results for s in sides if s.case == case and s.cluster == c]
            if not mine:
                continue
            ovl = [s.overlap_ratio for s in mine if s.overlap_ratio is not None]
            print(f"  {case} {c}: run {median_spread([s.run_ratio for s in mine], digits=3)}"
                  + (f"  overlap {median_spread(ovl, digits=3)}" if ovl else "")
                  + f"  max 10 s {median_spread([s.max_window_ratio for s in mine], digits=3)}")  # fmt: skip
    print(json.dumps([{"overlap": o, "sides": [asdict(s) for s in sides]} for o, sides in results]))
    print(f"end: {machine()}")


if __name__ == "__main__":
    main()
