"""Detection cost: one `detect-storage-changes` poll over a cluster with 0, 25, 50 and 90 CRDs.

Issue 13, benchmark 5 (goal: < 5 s per poll, API calls O(resources)). kubesim runs in a
child process (its own etcd), a `prefect server start` (devstack.PrefectStack) in another,
and the polls in a third: `detect_storage_changes(start_migrations=False)` against that
server. For each CRD count (CRDs added 5 to a group, like an operator's), a first poll
creates the StorageStates of the new resources, then --polls steady polls (states present,
nothing to change) are measured: wall time of the flow call and kubesim's request counters
before and after, by verb and resource. Baseline: the same poll with no CRDs of ours but
the two of storage-migrator itself, measured in the same run.

    uv run python -m bench.detection_cost [--crds 0,25,50,90] [--polls 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.stand import REPO, KubesimProcess, machine, median_spread
from devstack import PrefectStack
from kubesim.etcd import EtcdProcess

PER_GROUP = 5

POLL_CHILD = """
import json, time
from kubesim.admin import Admin
from flows.detect_storage_changes import detect_storage_changes
admin = Admin.from_kubeconfig({kubeconfig!r})
for i in range({polls} + 1):
    before = admin.counters()["requestsByResource"]
    d0 = admin.counters()["requests"]
    started = time.perf_counter()
    summary = detect_storage_changes(start_migrations=False, kubeconfig={kubeconfig!r})
    seconds = time.perf_counter() - started
    after = admin.counters()["requestsByResource"]
    d1 = admin.counters()["requests"]
    calls = {{k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}}
    verbs = {{k: d1[k] - d0.get(k, 0) for k in d1 if d1[k] != d0.get(k, 0)}}
    print("POLL " + json.dumps({{"first": i == 0, "seconds": seconds, "calls": calls, "verbs": verbs,
                                "done": len(summary.applied.done), "errors": summary.applied.errors}}), flush=True)
"""


def crd(i: int) -> dict[str, Any]:
    group = f"g{i // PER_GROUP}.bench.example.com"
    plural = f"widget{i}s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": f"widget{i}", "kind": f"Widget{i}", "listKind": f"Widget{i}List"},
            "versions": [{"name": "v1", "served": True, "storage": True,
                          "schema": {"openAPIV3Schema": {"type": "object",
                                                         "x-kubernetes-preserve-unknown-fields": True}}}],
        },
    }  # fmt: skip


def add_crds(kubectl: list[str], start: int, stop: int, work: Path) -> None:
    if stop <= start:
        return
    path = work / f"crds-{start}-{stop}.yaml"
    path.write_text(yaml.safe_dump_all([crd(i) for i in range(start, stop)]))
    subprocess.run([*kubectl, "apply", "-f", str(path)], check=True, capture_output=True)
    last = crd(stop - 1)["spec"]
    deadline = time.monotonic() + 60
    while subprocess.run([*kubectl, "get", f"{last['names']['plural']}.{last['group']}"],
                         capture_output=True).returncode != 0:  # fmt: skip
        if time.monotonic() > deadline:
            raise SystemExit(f"CRD {last['names']['plural']}.{last['group']} not served after 60 s")
        time.sleep(0.5)


def polls(stack: PrefectStack, kubeconfig: Path, n: int) -> list[dict[str, Any]]:
    env = {**stack.env, "PYTHONPATH": str(REPO), "PREFECT_LOGGING_LEVEL": "WARNING"}
    done = subprocess.run([sys.executable, "-c", POLL_CHILD.format(kubeconfig=str(kubeconfig), polls=n)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the poll process failed: {done.stdout[-2000:]}{done.stderr[-3000:]}")
    return [json.loads(line[5:]) for line in done.stdout.splitlines() if line.startswith("POLL ")]


def discovered(kubectl: list[str]) -> int:
    out = subprocess.run([*kubectl, "api-resources", "--no-headers"], check=True, capture_output=True, text=True)
    return len(out.stdout.splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--crds", default="0,25,50,90", help="CRD counts, growing (90: 112 resources, above issue 13's ~60 + ~50)"
    )
    parser.add_argument("--polls", type=int, default=3, help="steady polls measured per CRD count")
    args = parser.parse_args()
    counts = [int(c) for c in args.crds.split(",")]
    print(f"machine: {machine()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-detect-"))
    etcd = EtcdProcess().start()
    kubesim = KubesimProcess(work, etcd.url)
    stack = PrefectStack(work / "prefect-home")
    rows = []
    try:
        kubesim.start()
        stack.start_server()
        kubectl = ["kubectl", "--kubeconfig", str(kubesim.kubeconfig)]
        subprocess.run(
            [*kubectl, "apply", "-f", str(REPO / "deployments" / "crds"), "-f", str(REPO / "deployments" / "rbac")],
            check=True,
            capture_output=True,
        )
        have = 0
        for n in counts:
            add_crds(kubectl, have, n, work)
            have = n
            resources = discovered(kubectl)
            measured = polls(stack, Path(kubesim.kubeconfig), args.polls)
            first, steady = measured[0], measured[1:]
            rows.append((n, resources, first, steady))
            print(f"{n} CRDs, {resources} resources: first poll {first['seconds']:.1f} s "
                  f"{sum(first['calls'].values())} calls ({first['done']} actions); steady "
                  f"{[round(p['seconds'], 2) for p in steady]} s, calls {json.dumps(steady[-1]['verbs'])}, "
                  f"by resource {json.dumps(steady[-1]['calls'])}", flush=True)  # fmt: skip
    finally:
        stack.stop()
        kubesim.stop()
        etcd.stop()
        shutil.rmtree(work, ignore_errors=True)

    base = rows[0]
    base_calls = sum(base[3][-1]["verbs"].values())
    base_s = sorted(p["seconds"] for p in base[3])[len(base[3]) // 2]
    print(f"\n{'CRDs':>4} {'resources':>9} {'steady poll s':>20} {'vs base':>7} {'calls':>5} {'vs base':>7} "
          f"{'calls/resource':>14} {'first poll s':>12} {'first calls':>11}")  # fmt: skip
    for n, resources, first, steady in rows:
        secs = [p["seconds"] for p in steady]
        calls = sum(steady[-1]["verbs"].values())
        med = sorted(secs)[len(secs) // 2]
        print(f"{n:>4} {resources:>9} {median_spread(secs, digits=1):>20} {med / base_s:>7.2f} {calls:>5} "
              f"{calls / base_calls:>7.2f} {calls / resources:>14.2f} {first['seconds']:>12.1f} "
              f"{sum(first['verbs'].values()):>11}")  # fmt: skip


if __name__ == "__main__":
    main()
