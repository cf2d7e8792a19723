"""Scale: one resource of N ConfigMaps (10^4, 10^5, 10^6) migrated by the `migrate-resource`
flow, unbudgeted, against `kubectl get -o json | kubectl replace -f -` (the baseline).

Issue 13, benchmark 4. Per run:
1. etcd (quota raised to 16 GB) and `python -m kubesim serve` in child processes; our CRDs
   applied with kubectl; a `prefect server start` on SQLite (devstack.PrefectStack) in a
   fresh home;
2. N ConfigMaps written straight into etcd in kube-apiserver's layout
   (`/registry/configmaps/<ns>/<name>`, JSON in storage version v1, as kubesim stores them),
   1,000 puts per etcd transaction;
3. per round: switch the storage version, run the flow in a child process
   (`migrate_resource(resource="configmaps")` against that server, with
   STORAGE_MIGRATOR_SHARED_WRITE_BUDGET=false and a write rate of 10^6/s), then switch again
   and run the kubectl pipe (up to --kubectl-max objects); after each, read every key
   from etcd and count the values not in the new storage version (must be 0).

Printed: wall time, objects/s and the ratio flow/kubectl, peak RSS of the flow process
(ru_maxrss from wait4) with RSS samples over the run, LIST and PATCH requests (chunks),
and the size of the Prefect database afterwards.

    uv run python bench/scale.py --objects 10000 --rounds 3
    uv run python bench/scale.py --objects 1000000 --rounds 1 --kubectl-max 0   # ~40 min
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from bench.stand import REPO, KubesimProcess, machine, median_spread, start_etcd
from devstack import PrefectStack
from kubesim.admin import Admin
from kubesim.codec import canonical_json
from kubesim.etcd import EtcdStore, prefix_end
from kubesim.managed_fields import managed_fields_entry, now_rfc3339

NAMESPACE = "bench"
PREFIX = f"/registry/configmaps/{NAMESPACE}/".encode()
BATCH = 1000

FLOW_CHILD = """
import json
from flows.migrate_resource import migrate_resource
r = migrate_resource(resource="configmaps", write_rate_per_second=1e6, chunk_size={chunk})
print("RESULT " + json.dumps(r.model_dump() if hasattr(r, "model_dump") else {{"state": repr(r)}}))
"""


def seeded(i: int, size: int) -> tuple[str, dict[str, str]]:
    """The name and `data` of the i-th seeded ConfigMap (what a chaos verdict expects back)."""
    return f"cm-{i:07d}", {"payload": f"{i:07d}".ljust(size, "x")}


def seed(store: EtcdStore, n: int, size: int, threads: int = 4) -> float:
    """Write n ConfigMaps into etcd as kubesim's create would store them (version v1)."""
    created = now_rfc3339()
    template = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"payload": ""},
                "metadata": {"labels": {"bench": "scale"}}}  # fmt: skip
    managed = [managed_fields_entry(template, manager="kubectl-create", api_version="v1")]

    def batch(start: int) -> None:
        items = []
        for i in range(start, min(start + BATCH, n)):
            name, data = seeded(i, size)
            obj = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": NAMESPACE, "uid": str(uuid.uuid4()),
                             "creationTimestamp": created, "labels": {"bench": "scale"}, "managedFields": managed},
                "data": data,
            }  # fmt: skip
            items.append((PREFIX + name.encode(), canonical_json(obj)))
        store.put_many(items)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(batch, range(0, n, BATCH)))
    return n / (time.perf_counter() - started)


def stale_values(store: EtcdStore, version: str) -> tuple[int, int]:
    """(objects read, objects not stored in `version`), read from etcd page by page."""
    want = f'{{"apiVersion":"{version}",'.encode()
    start, end = PREFIX, prefix_end(PREFIX)
    seen = stale = 0
    while True:
        page = store.range(start, end, limit=2_000)  # a gRPC answer is at most 4 MB
        for kv in page.kvs:
            seen += 1
            stale += not kv.value.startswith(want)
        if not page.more:
            return seen, stale
        start = page.kvs[-1].key + b"\0"


@dataclass
class FlowRun:
    seconds: float
    peak_rss_mb: float
    rss_samples_mb: list[float] = field(default_factory=list)
    result: dict[str, object] = field(default_factory=dict)


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run_flow(stack: PrefectStack, kubeconfig: Path, chunk: int, log: Path) -> FlowRun:
    env = {**stack.env, "STORAGE_MIGRATOR_KUBECONFIG": str(kubeconfig),
           "STORAGE_MIGRATOR_SHARED_WRITE_BUDGET": "false", "PYTHONPATH": str(REPO)}  # fmt: skip
    samples: list[float] = []
    started = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", FLOW_CHILD.format(chunk=chunk)], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    done = threading.Event()

    def sample() -> None:
        # also to a file as it goes: a long run can be followed (tail -f) or cut short
        with open(log.with_suffix(".rss"), "w") as trace:
            while not done.wait(2.0):
                rss = _rss_mb(proc.pid)
                if rss is not None:
                    samples.append(rss)
                    print(f"{time.perf_counter() - started:.0f} s  {rss:.0f} MB", file=trace, flush=True)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    text = log.read_text(errors="replace")
    if proc.returncode != 0 or "RESULT " not in text:
        raise SystemExit(f"the flow process failed ({proc.returncode}): {text[-3000:]}")
    result = json.loads(text.rsplit("RESULT ", 1)[1].splitlines()[0])
    result["flow_run_seconds"] = flow_seconds(text)
    return FlowRun(seconds=seconds, peak_rss_mb=usage.ru_maxrss / 1024, rss_samples_mb=samples, result=result)


def flow_seconds(log_text: str) -> float | None:
    """Seconds from "Beginning flow run" to the flow's final state in its log: the wall time
    without the process start (imports, client set-up), which does not grow with N."""
    stamps = [line[:12] for line in log_text.splitlines()
              if "Flow run" in line and ("Beginning flow run" in line or "Finished in state" in line)]  # fmt: skip
    if len(stamps) < 2:
        return None
    first, last = (datetime.strptime(s, "%H:%M:%S.%f") for s in (stamps[0], stamps[-1]))
    return (last - first).total_seconds() % 86400


def run_kubectl(kubeconfig: Path, timeout: float) -> float | None:
    """The documented manual method; None when it did not finish within `timeout`."""
    k = f"kubectl --kubeconfig {kubeconfig}"
    started = time.perf_counter()
    try:
        subprocess.run(f"{k} get configmaps -A -o json | {k} replace -f - > /dev/null", shell=True, check=True,
                       timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return None
    return time.perf_counter() - started


def db_size_mb(home: Path) -> float:
    return sum(p.stat().st_size for p in home.glob("prefect.db*")) / 1024**2


def configmap_requests(admin: Admin) -> dict[str, int]:
    by = admin.counters()["requestsByResource"]
    return {k: v for k, v in by.items() if k.endswith(" configmaps")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3, help="flow and kubectl passes, interleaved")
    parser.add_argument("--size", type=int, default=256, help="bytes of data per ConfigMap")
    parser.add_argument("--chunk", type=int, default=500, help="LIST page (chunk) size of the flow")
    parser.add_argument("--kubectl-max", type=int, default=100_000, help="skip kubectl above this many objects")
    parser.add_argument("--kubectl-timeout", type=float, default=1800, help="seconds before kubectl counts as DNF")
    parser.add_argument("--workdir", help="keep logs and the Prefect home here (default: a temporary directory)")
    args = parser.parse_args()
    print(f"machine: {machine()}", flush=True)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    etcd = start_etcd()
    kubesim = KubesimProcess(work, etcd.url)
    stack = PrefectStack(work / "prefect-home")
    store = EtcdStore(etcd.url, timeout=120)
    try:
        kubesim.start()
        stack.start_server()
        k = ["kubectl", "--kubeconfig", str(kubesim.kubeconfig)]
        subprocess.run(
            [*k, "apply", "-f", str(REPO / "deployments" / "crds"), "-f", str(REPO / "deployments" / "rbac")],
            check=True,
            capture_output=True,
        )
        subprocess.run([*k, "create", "namespace", NAMESPACE], check=True, capture_output=True)
        admin = Admin.from_kubeconfig(kubesim.kubeconfig)
        rate = seed(store, args.objects, args.size)
        print(f"seeded {args.objects} ConfigMaps of ~{args.size} B data into etcd at {rate:.0f}/s", flush=True)
        db_before = db_size_mb(stack.home)
        version = 1
        flows: list[FlowRun] = []
        kubectls: list[float | None] = []
        for r in range(args.rounds):
            version += 1
            admin.set_storage_version("configmaps", f"v{version}")
            before = configmap_requests(admin)
            run = run_flow(stack, Path(kubesim.kubeconfig), args.chunk, work / f"flow-{r}.log")
            after = configmap_requests(admin)
            seen, stale = stale_values(store, f"v{version}")
            run.result["requests"] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            run.result["etcd"] = {"objects": seen, "not re-encoded": stale}
            flows.append(run)
            print(f"round {r} flow v{version}: {run.seconds:.1f} s, peak RSS {run.peak_rss_mb:.0f} MB, "
                  f"{json.dumps(run.result)}", flush=True)  # fmt: skip
            if args.objects > args.kubectl_max:
                continue
            version += 1
            admin.set_storage_version("configmaps", f"v{version}")
            seconds = run_kubectl(kubesim.kubeconfig, args.kubectl_timeout)
            seen, stale = stale_values(store, f"v{version}")
            kubectls.append(seconds)
            print(f"round {r} kubectl v{version}: {seconds} s, etcd: {seen} objects, {stale} not re-encoded",
                  flush=True)  # fmt: skip
        db_after = db_size_mb(stack.home)
    finally:
        store.close()
        stack.stop()
        kubesim.stop()
        etcd.stop()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    n = args.objects
    flow_s = [f.seconds for f in flows]
    print(f"\n{n} ConfigMaps, chunks of {args.chunk}, {args.rounds} round(s)")
    print(f"flow wall s: {median_spread(flow_s, digits=1)}; "
          f"objects/s: {median_spread([n / s for s in flow_s], digits=1)}")  # fmt: skip
    inner = [float(f.result["flow_run_seconds"]) for f in flows if f.result.get("flow_run_seconds")]  # type: ignore[arg-type]
    if inner:
        print(f"flow run alone (log: begin to final state) s: {median_spread(inner, digits=1)}; "
              f"objects/s: {median_spread([n / s for s in inner], digits=1)}")  # fmt: skip
    print(f"flow peak RSS MB: {median_spread([f.peak_rss_mb for f in flows], digits=1)}")
    for f in flows:
        q = f.rss_samples_mb
        marks = [q[int(len(q) * p)] for p in (0.1, 0.25, 0.5, 0.75)] + [q[-1]] if q else []
        print(f"  RSS samples MB at 10/25/50/75/100% of the run: {[round(m) for m in marks]}")
    print(f"Prefect DB MB: {db_before:.1f} before, {db_after:.1f} after {len(flows)} flow run(s)")
    done = [s for s in kubectls if s is not None]
    if done:
        print(f"kubectl wall s: {median_spread(done, digits=1)}; "
              f"objects/s: {median_spread([n / s for s in done], digits=1)}")  # fmt: skip
        print(f"flow speed vs kubectl (median wall kubectl / median wall flow): "
              f"{statistics.median(done) / statistics.median(flow_s):.2f}")  # fmt: skip
    elif kubectls:
        print(f"kubectl: did not finish within {args.kubectl_timeout:.0f} s")
    else:
        print("kubectl: not run (above --kubectl-max)")


if __name__ == "__main__":
    main()
