"""The migrating process's CPU per object, over TLS (issue 22).

Against a real kube-apiserver over TLS the flow reached only 0.55-0.60 of a raw
loop's rate, spending ~1.0 ms of client CPU per object against the raw loop's
0.23 ms. This measures where that goes. Four passes over the same ConfigMaps,
interleaved, each timed by wall clock and by the process's user+system CPU
(`time.process_time()`: every thread of this process; kubesim, etcd and the
Prefect server run in processes of their own):

- `raw loop` (the baseline): the least a client can do: `http.client` over the
  same TLS (the kubeconfig's CA, token or client certificate, loaded once),
  `--concurrency` threads each keeping its connection alive, the metadata-only
  LIST of a page, then the no-op merge patch of every item (its answer decoded
  for the resourceVersion, as a tally needs), page after page;
- `chunk loop`: `storage_migrator.migration.chunks.migrate_chunk` page after
  page, with the page asked for ahead as the flow's task does, no Prefect;
- `flow`: `migrate_resource(resource="configmaps")`, unbudgeted, start to end;
- `flow, first to last chunk`: the same run, from the moment its first chunk
  task is called to the moment its last one returns (what the flow costs per
  object once started: chunks, checkpoints, agreement checks, Prefect's task
  engine).

Against kubesim (started here, `python -m kubesim serve`, HTTPS) each pass
follows a storage version switch, so every object is re-encoded; against the
API server of `--kubeconfig` (e.g. a real cluster) the objects are created in
a namespace of their own (deleted afterwards) and every pass is a no-op pass
(the answers say "unchanged"), as the issue measured.

    uv run python -m bench.client_cpu [--objects 10000] [--repeat 3] [--kubeconfig PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.pyspy import sampled, summary
from bench.raw_tls_loop import RawLoop
from bench.stand import REPO, create_configmaps, kubesim_process, machine, median_spread, quiet_unbudgeted_flows
from kubesim.admin import Admin
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.errors import KubeError
from storage_migrator.kube.listing import list_page
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.writing import delete_object
from storage_migrator.migration.chunks import ChunkOptions, migrate_chunk
from storage_migrator.migration.lookahead import PageAhead
from storage_migrator.settings import Settings

CONFIGMAPS = ResourceRef(version="v1", resource="configmaps")
NAMESPACES = ResourceRef(version="v1", resource="namespaces")
PASSES = ("raw", "chunks", "flow", "between")
LABELS = {"raw": "raw loop (baseline)", "chunks": "chunk loop, no Prefect", "flow": "flow, whole",
          "between": "flow, first to last chunk"}  # fmt: skip


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
        """CPU seconds per 1,000 objects, i.e. CPU milliseconds per object."""
        return 1000 * self.cpu / self.objects


def measured(fn: Callable[[], int]) -> Sample:
    wall, cpu = time.perf_counter(), time.process_time()
    objects = fn()
    return Sample(objects=objects, seconds=time.perf_counter() - wall, cpu=time.process_time() - cpu)


def chunk_loop(settings: Settings, options: ChunkOptions) -> int:
    """`migrate_chunk` page after page, with the LIST ahead (as tasks/migrating.py), one client."""
    api = api_client_from_settings(settings)
    ahead = PageAhead(connect=lambda: api_client_from_settings(settings))
    token: str | None = None
    objects = 0
    try:
        while True:
            result = migrate_chunk(api, CONFIGMAPS, continue_token=token, options=options, ahead=ahead)
            if result.failed:
                raise SystemExit(f"chunk loop: {result.failed} objects failed: {result.failures[:3]}")
            objects += result.listed
            token = result.token_out
            if token is None:
                return objects
    finally:
        api.close()  # type: ignore[no-untyped-call]


class ChunkMarks:
    """Wall clock and process CPU when the flow calls its chunk task and when it returns."""

    def __init__(self) -> None:
        import flows.migrate_resource as flow_module

        self.calls: list[tuple[float, float]] = []
        self.returns: list[tuple[float, float, int]] = []
        task = flow_module.migrate_chunk_task
        marks = self

        class Marked:
            def __call__(self, *a: Any, **k: Any) -> Any:
                marks.calls.append((time.perf_counter(), time.process_time()))
                result = task(*a, **k)
                marks.returns.append((time.perf_counter(), time.process_time(), int(result.listed)))
                return result

        flow_module.migrate_chunk_task = Marked()  # type: ignore[assignment]

    def between(self) -> Sample:
        """From the first chunk's call to the last one's return."""
        (wall0, cpu0), (wall1, cpu1, _) = self.calls[0], self.returns[-1]
        return Sample(objects=sum(n for _, _, n in self.returns), seconds=wall1 - wall0, cpu=cpu1 - cpu0)


def run_flow(kubeconfig: str, concurrency: int, limit: int) -> int:
    from flows.migrate_resource import MigrationSummary, migrate_resource

    summary = migrate_resource(resource="configmaps", kubeconfig=kubeconfig, write_rate_per_second=1e6,
                               write_concurrency=concurrency, chunk_size=limit)  # fmt: skip
    if not isinstance(summary, MigrationSummary) or summary.phase != "Succeeded":
        raise SystemExit(f"the flow did not succeed: {summary}")
    return int(summary.progress.listed)


@contextmanager
def cluster(args: argparse.Namespace) -> Iterator[tuple[str, Admin | None]]:
    """(kubeconfig, kubesim's admin client) of kubesim started here, or of `--kubeconfig` (admin None)."""
    if args.kubeconfig is None:
        with kubesim_process() as sim:
            yield sim.kubeconfig, sim.admin
        return
    yield args.kubeconfig, None


def install_crds(kubeconfig: str, api: Any) -> None:
    """`deployments/crds/` (the flow checkpoints in a StorageVersionMigration), applied and served."""
    subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "apply", "-f", str(REPO / "deployments" / "crds"), "-f", str(REPO / "deployments" / "rbac")],
                   check=True, capture_output=True)  # fmt: skip
    migrations = ResourceRef(group="migration.k8s.io", version="v1alpha1", resource="storageversionmigrations")
    for _ in range(300):
        try:
            list_page(api, migrations, limit=1)
            return
        except KubeError:
            time.sleep(0.1)
    raise SystemExit("storageversionmigrations.migration.k8s.io was never served")


@contextmanager
def objects_in(kubeconfig: str, args: argparse.Namespace) -> Iterator[int]:
    """`--objects` ConfigMaps in a namespace of their own (deleted afterwards); their creations per second."""
    settings = Settings(kubeconfig=Path(kubeconfig), write_concurrency=args.concurrency)
    api = api_client_from_settings(settings)
    namespace = f"bench-cpu-{uuid.uuid4().hex[:6]}"
    try:
        install_crds(kubeconfig, api)
        rate = create_configmaps(api, args.objects, namespace=namespace, threads=args.concurrency, size=args.size)
        print(f"created {args.objects} ConfigMaps in {namespace} at {rate:.0f}/s", flush=True)
        yield args.objects
    finally:
        if args.kubeconfig is not None:
            delete_object(api, NAMESPACES, name=namespace)
        api.close()  # type: ignore[no-untyped-call]


def passes(kubeconfig: str, admin: Admin | None, args: argparse.Namespace) -> dict[str, list[Sample]]:
    """The four passes, `--repeat` times, interleaved."""
    settings = Settings(kubeconfig=Path(kubeconfig), write_concurrency=args.concurrency)
    options = ChunkOptions(limit=args.limit, write_concurrency=args.concurrency)
    raw = RawLoop.from_kubeconfig(kubeconfig, threads=args.concurrency)
    marks = ChunkMarks()
    samples: dict[str, list[Sample]] = {p: [] for p in PASSES}
    version = 1
    try:
        for rep in range(args.repeat):
            for label in PASSES[:3]:
                if admin is not None:
                    version += 1
                    admin.set_storage_version("configmaps", f"v{version}")
                profiling = sampled(args.profile_out) if label == args.profile else contextlib.nullcontext()
                with profiling:
                    if label == "raw":
                        sample = measured(lambda: raw.run(CONFIGMAPS.collection_path(), limit=args.limit))
                    elif label == "chunks":
                        sample = measured(lambda: chunk_loop(settings, options))
                    else:
                        marks.calls.clear()
                        marks.returns.clear()
                        sample = measured(lambda: run_flow(kubeconfig, args.concurrency, args.limit))
                        samples["between"].append(marks.between())
                samples[label].append(sample)
                print(f"rep {rep + 1} {label:<7} {sample.seconds:7.2f} s {sample.rate:7.0f}/s "
                      f"CPU {sample.cpu_ms_per_object:.3f} ms/object", flush=True)  # fmt: skip
    finally:
        raw.close()
    return samples


def report(samples: dict[str, list[Sample]], args: argparse.Namespace, where: str) -> None:
    raw = samples["raw"]
    print(f"\n{where}: {raw[0].objects} ConfigMaps of ~{args.size} B (all of the cluster's, LISTed cluster-wide), "
          f"pages of {args.limit}, {args.concurrency} writes in flight, {args.repeat} interleaved repetitions; "
          "median (min-max)")  # fmt: skip
    print(f"{'pass':<28} {'objects/s':>18} {'rate vs raw':>18} {'CPU ms/object':>22} {'CPU vs raw':>18}")
    for key in PASSES:
        got = samples[key]
        rate_r = [s.rate / b.rate for s, b in zip(got, raw, strict=True)]
        cpu_r = [s.cpu_ms_per_object / b.cpu_ms_per_object for s, b in zip(got, raw, strict=True)]
        print(f"{LABELS[key]:<28} {median_spread([s.rate for s in got]):>18} {median_spread(rate_r, digits=2):>18} "
              f"{median_spread([s.cpu_ms_per_object for s in got], digits=3):>22} "
              f"{median_spread(cpu_r, digits=2):>18}")  # fmt: skip
    print(json.dumps({k: [vars(s) for s in v] for k, v in samples.items()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=10_000, help="ConfigMaps to create and migrate")
    parser.add_argument("--concurrency", type=int, default=8, help="writes in flight (threads of the raw loop)")
    parser.add_argument("--limit", type=int, default=500, help="objects per LIST page (chunk)")
    parser.add_argument("--size", type=int, default=1024, help="bytes of data per ConfigMap")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved repetitions")
    parser.add_argument("--profile", choices=PASSES[:3], help="sample this pass (every repetition) with py-spy "
                        "and print where the CPU went (bench/pyspy.py; figures of a sampled run are not comparable)")  # fmt: skip
    parser.add_argument("--profile-out", type=Path, default=Path("/tmp/client_cpu_profile.txt"),
                        help="py-spy's collapsed stacks (default %(default)s)")  # fmt: skip
    parser.add_argument("--kubeconfig", help="an API server to measure against instead of kubesim (its current "
                        "context; objects are created in a namespace of their own, deleted afterwards)")  # fmt: skip
    args = parser.parse_args()
    quiet_unbudgeted_flows()
    from prefect.testing.utilities import prefect_test_harness

    print(f"machine: {machine()}", flush=True)
    with (
        cluster(args) as (kubeconfig, admin),
        prefect_test_harness(server_startup_timeout=120),
        objects_in(kubeconfig, args),
    ):
        samples = passes(kubeconfig, admin, args)
    where = "kubesim over TLS (its own process)" if args.kubeconfig is None else f"the API server of {args.kubeconfig}"
    report(samples, args, where)
    if args.profile:
        print(f"\nprofile of the {LABELS[args.profile]} passes ({args.profile_out}):\n{summary(args.profile_out)}")


if __name__ == "__main__":
    main()
