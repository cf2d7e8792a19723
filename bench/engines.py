"""The two engines side by side (issue 36): our client engine and kube-controller-manager's in-tree migrator.

One `migrate-resource` run per pass over the same ConfigMaps, after a storage version switch
(so every object is re-encoded), on kubesim over TLS in a process of its own, which also runs
kube-controller-manager's migrator for the in-tree API (sim/kubesim/svm_controller.py: one
no-op patch per object through the API server, paced by kcm's client limits). Each pass is
timed by wall clock and by this process's user+system CPU (`time.process_time()`: the flow and
its tasks; kubesim, its controller and etcd run in kubesim's process). Passes:

- `client, unpaced` (the baseline): our chunk loop, no write budget (as the issue's 725/s);
- `in-tree, kcm defaults`: the in-tree engine with kubesim's controller at its defaults
  (`--kube-api-qps` 50, burst 100: the ~50 objects/s measured on a real v1.36.2);
- `in-tree, qps 5000`: the same, kcm's client limits lifted, to show what the controller
  itself reaches on kubesim (one worker per migration, one patch at a time).

Every pass is checked: the flow Completed, its count listed every object, and kubesim
received exactly one patch per object (its request counters), from our process or from
the controller. Interleaved, `--repeat` times; medians (min-max) and ratios against the
client pass of the same repetition.

    uv run python -m bench.engines [--objects 10000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.client_cpu import install_crds
from bench.stand import create_configmaps, kubesim_process, machine, median_spread, quiet_unbudgeted_flows
from kubesim.admin import Admin
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.settings import Settings

PASSES: dict[str, dict[str, Any]] = {
    "client": {"engine": "client", "qps": None},
    "in-tree": {"engine": "in-tree", "qps": 50.0},
    "in-tree-fast": {"engine": "in-tree", "qps": 5000.0},
}
LABELS = {"client": "client, unpaced (baseline)", "in-tree": "in-tree, kcm defaults (qps 50)",
          "in-tree-fast": "in-tree, kcm qps 5000"}  # fmt: skip


@dataclass
class Sample:
    objects: int
    seconds: float
    cpu: float

    @property
    def rate(self) -> float:
        return self.objects / self.seconds

    @property
    def cpu_ms_per_object(self) -> float:
        return 1000 * self.cpu / self.objects


def one_pass(kubeconfig: str, admin: Admin, *, engine: str, objects: int) -> Sample:
    """One migration of every ConfigMap with `engine`, checked by kubesim's counters."""
    from flows.migrate_resource import migrate_resource

    before = admin.counters()["requestsByResource"].get("patch configmaps", 0)
    wall, cpu = time.perf_counter(), time.process_time()
    state = migrate_resource(resource="configmaps", kubeconfig=kubeconfig, engine=engine,  # type: ignore[arg-type]
                             write_rate_per_second=1e6, write_concurrency=8, return_state=True)  # fmt: skip
    seconds, spent = time.perf_counter() - wall, time.process_time() - cpu
    if not state.is_completed():
        raise SystemExit(f"{engine}: the migration did not complete: {state.message}")
    listed = state.result().progress.listed
    patches = admin.counters()["requestsByResource"].get("patch configmaps", 0) - before
    if listed < objects or patches != listed:
        raise SystemExit(f"{engine}: listed {listed}, {patches} patches for {objects} objects")
    return Sample(objects=listed, seconds=seconds, cpu=spent)


def run(kubeconfig: str, admin: Admin, args: argparse.Namespace) -> dict[str, list[Sample]]:
    samples: dict[str, list[Sample]] = {p: [] for p in PASSES}
    version = 1
    for rep in range(args.repeat):
        for key, how in PASSES.items():
            version += 1
            admin.set_storage_version("configmaps", f"v{version}")
            if how["qps"] is not None:
                admin.set_svm_controller(enabled=True, qps=how["qps"], burst=max(100, int(how["qps"] * 2)))
            sample = one_pass(kubeconfig, admin, engine=how["engine"], objects=args.objects)
            samples[key].append(sample)
            print(f"rep {rep + 1} {LABELS[key]:<32} {sample.seconds:8.2f} s {sample.rate:8.1f}/s "
                  f"CPU {sample.cpu_ms_per_object:.4f} ms/object", flush=True)  # fmt: skip
    return samples


def report(samples: dict[str, list[Sample]], args: argparse.Namespace) -> None:
    base = samples["client"]
    print(f"\nkubesim over TLS (its own process, with kube-controller-manager's migrator): {base[0].objects} "
          f"ConfigMaps of ~{args.size} B, {args.repeat} interleaved repetitions; median (min-max)")  # fmt: skip
    print(f"{'engine':<34} {'objects/s':>20} {'vs client':>18} {'our CPU ms/object':>22} {'vs client':>18}")
    for key in PASSES:
        got = samples[key]
        rate_r = [s.rate / b.rate for s, b in zip(got, base, strict=True)]
        cpu_r = [s.cpu_ms_per_object / b.cpu_ms_per_object for s, b in zip(got, base, strict=True)]
        print(f"{LABELS[key]:<34} {median_spread([s.rate for s in got], digits=1):>20} "
              f"{median_spread(rate_r, digits=2):>18} {median_spread([s.cpu_ms_per_object for s in got], digits=4):>22} "
              f"{median_spread(cpu_r, digits=3):>18}")  # fmt: skip
    print(json.dumps({k: [vars(s) for s in v] for k, v in samples.items()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=10_000, help="ConfigMaps to create and migrate")
    parser.add_argument("--size", type=int, default=1024, help="bytes of data per ConfigMap")
    parser.add_argument("--repeat", type=int, default=2, help="interleaved repetitions")
    args = parser.parse_args()
    quiet_unbudgeted_flows()  # the in-tree runs poll every in_tree_poll_seconds, the default: what we spend waiting
    from prefect.testing.utilities import prefect_test_harness

    print(f"machine: {machine()}", flush=True)
    with kubesim_process() as sim, prefect_test_harness(server_startup_timeout=120):
        admin = sim.admin
        admin.set_feature_gates({"StorageVersionMigrator": True})  # the in-tree API served, its controller on
        api = api_client_from_settings(Settings(kubeconfig=Path(sim.kubeconfig)))
        try:
            install_crds(sim.kubeconfig, api)
            rate = create_configmaps(api, args.objects, namespace=f"bench-{uuid.uuid4().hex[:6]}", threads=8,
                                     size=args.size)  # fmt: skip
            print(f"created {args.objects} ConfigMaps at {rate:.0f}/s; kcm's controller: {admin.svm_controller()}",
                  flush=True)  # fmt: skip
            samples = run(sim.kubeconfig, admin, args)
        finally:
            api.close()  # type: ignore[no-untyped-call]
    report(samples, args)


if __name__ == "__main__":
    main()
