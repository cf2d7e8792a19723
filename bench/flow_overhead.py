"""Overhead of the whole `migrate-resource` flow against a raw loop of the same calls (issue 13, benchmark 2).

The raw loop (the baseline) is what the flow must come close to: the
metadata-only LIST of a page of 500, then the no-op merge patch of every item
with `--concurrency` threads, page after page, no Prefect, no checkpoint. Three
things are measured against it, interleaved, each after a storage version
switch so that every object is re-encoded:

- `chunk loop`: `storage_migrator.migration.chunks.migrate_chunk` page after page, no
  Prefect (what the chunk logic itself costs: retries, tallies, settle checks);
- `flow`: `migrate_resource(resource="configmaps")`, unbudgeted (rate 10^6/s,
  `shared_write_budget` off): one task per chunk, a checkpoint and the seed-001
  agreement check between chunks, the progress artifact, start and finish;
- `flow, empty resource`: the flow over `cronjobs.batch`, with no objects (one empty
  chunk): its fixed cost, so that Prefect's cost *per chunk* is
  (flow - empty flow - chunk loop) / (chunks - 1), and the flow's rate
  "between its first and last chunk" (issue 13) is objects / (flow - empty flow).

kubesim runs in its own process (`python -m kubesim serve`), the Prefect server
in another (the test harness: SQLite in a temporary directory).

The subtraction above charges the flow with everything it does differently,
including kubesim serving the page listed ahead while the chunk writes (on one
Python process that costs the writes what it saves the LIST). So the flow passes
are also timed from inside (`ChunkClock`): Prefect's own cost per chunk is the
task engine's entry and exit around each chunk, plus the time between two
chunks beyond the longer of the two requests made there (the checkpoint and the
seed-001 agreement check, which the design requires and which are not Prefect's).

    uv run python bench/flow_overhead.py [--objects 10000] [--concurrency 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client import ApiClient
from stand import (
    CONFIGMAPS,
    REPO,
    create_configmaps,
    kubesim_process,
    machine,
    median_spread,
    quiet_unbudgeted_flows,
    ratios,
)

from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.listing import list_page
from storage_migrator.kube.writing import rewrite_with_patch
from storage_migrator.migration.chunk_terms import ChunkOptions
from storage_migrator.migration.chunks import migrate_chunk
from storage_migrator.settings import Settings

NAMESPACE = "bench"


def install_crds(api: ApiClient) -> None:
    """`deployments/crds/` (the StorageVersionMigration the flow records its checkpoint in), served, and
    the install's namespace (issue 37: each run holds its request's writer Lease there)."""
    k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name="storage-migrator")))
    ext = k8s.ApiextensionsV1Api(api)
    for path in sorted((REPO / "deployments" / "crds").glob("*.yaml")):
        ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
    custom = k8s.CustomObjectsApi(api)
    for _ in range(300):
        try:
            custom.list_cluster_custom_object("migration.k8s.io", "v1alpha1", "storageversionmigrations")
            return
        except k8s.ApiException:
            time.sleep(0.1)
    raise SystemExit("storageversionmigrations.migration.k8s.io was never served")


def raw_loop(api: ApiClient, pool: ThreadPoolExecutor, limit: int) -> tuple[int, int]:
    """The baseline: LIST a page, patch its items on the pool, next page. (objects, pages)"""
    token: str | None = None
    objects = pages = 0
    while True:
        page = list_page(api, CONFIGMAPS, limit=limit, continue_token=token, metadata_only=True)

        def patch(item: dict[str, Any]) -> None:
            meta = item["metadata"]
            rewrite_with_patch(api, CONFIGMAPS, name=meta["name"], namespace=meta.get("namespace"),
                               resource_version=meta["resourceVersion"])  # fmt: skip

        list(pool.map(patch, page.items))
        objects += len(page.items)
        pages += 1
        token = page.continue_token
        if token is None:
            return objects, pages


def chunk_loop(api: ApiClient, options: ChunkOptions) -> tuple[int, int]:
    token: str | None = None
    objects = chunks = 0
    while True:
        result = migrate_chunk(api, CONFIGMAPS, continue_token=token, options=options)
        if result.failed:
            raise SystemExit(f"chunk loop: {result.failed} objects failed: {result.failures[:3]}")
        objects += result.listed
        chunks += 1
        token = result.token_out
        if token is None:
            return objects, chunks


def run_flow(kubeconfig: str, resource: str, group: str, concurrency: int, limit: int) -> tuple[int, int]:
    from flows.migrate_resource import MigrationSummary, migrate_resource

    summary = migrate_resource(resource=resource, group=group, kubeconfig=kubeconfig, write_rate_per_second=1e6,
                               write_concurrency=concurrency, chunk_size=limit)  # fmt: skip
    if not isinstance(summary, MigrationSummary) or summary.phase != "Succeeded":
        raise SystemExit(f"the flow did not succeed: {summary}")
    return summary.progress.listed, summary.progress.chunks


class ChunkClock:
    """Timestamps around the flow's chunk task, its body and the requests between chunks."""

    def __init__(self) -> None:
        import flows.migrate_resource as flow_module

        self.marks: list[tuple[float, str]] = []
        task = flow_module.migrate_chunk_task
        clock = self

        class Called:
            def __call__(self, *a: Any, **k: Any) -> Any:
                clock.mark("call")
                try:
                    return task(*a, **k)
                finally:
                    clock.mark("return")

        flow_module.migrate_chunk_task = Called()  # type: ignore[assignment]
        for t, name in ((task, "body"), (flow_module.checkpoint, "checkpoint"),
                        (flow_module.check_agreement, "agreement")):  # fmt: skip
            t.fn = self._timed(t.fn, name)

    def _timed(self, fn: Any, name: str) -> Any:
        def timed_fn(*a: Any, **k: Any) -> Any:
            self.mark(f"{name}>")
            try:
                return fn(*a, **k)
            finally:
                self.mark(f"{name}<")

        return timed_fn

    def mark(self, what: str) -> None:
        self.marks.append((time.perf_counter(), what))

    def spans(self, start: str, end: str) -> list[float]:
        out, began = [], None
        for t, what in self.marks:
            if what == start:
                began = t
            elif what == end and began is not None:
                out.append(t - began)
                began = None
        return out

    def per_chunk(self) -> tuple[float, float, float]:
        """(Prefect's cost, bookkeeping between chunks, chunk body) per chunk, seconds, for the marks since reset."""
        engine = [a + b for a, b in zip(self.spans("call", "body>"), self.spans("body<", "return"), strict=True)]
        between = self.spans("return", "call")
        requests = [max(c, a) for c, a in zip(self.spans("checkpoint>", "checkpoint<"),
                                             self.spans("agreement>", "agreement<"), strict=False)]  # fmt: skip
        prefect = statistics.mean(engine) + max(
            0.0, statistics.mean(between) - statistics.mean(requests[: len(between)])
        )
        return prefect, statistics.mean(between), statistics.mean(self.spans("body>", "body<"))


def timed(fn: Any, *args: Any) -> tuple[float, int, int]:
    started = time.perf_counter()
    objects, chunks = fn(*args)
    return time.perf_counter() - started, objects, chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=10_000, help="ConfigMaps to create and migrate")
    parser.add_argument("--concurrency", type=int, default=8, help="writes in flight")
    parser.add_argument("--limit", type=int, default=500, help="objects per LIST page (chunk)")
    parser.add_argument("--size", type=int, default=1024, help="bytes of data per ConfigMap")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved repetitions")
    args = parser.parse_args()
    quiet_unbudgeted_flows()
    from prefect.testing.utilities import prefect_test_harness

    print(f"machine: {machine()}", flush=True)
    samples: dict[str, list[float]] = {"raw": [], "chunks": [], "flow": [], "empty": []}
    chunk_counts: list[int] = []
    clock = ChunkClock()
    inside: list[tuple[float, float, float]] = []
    with kubesim_process() as sim, prefect_test_harness(server_startup_timeout=120):
        settings = Settings(kubeconfig=sim.kubeconfig, write_concurrency=args.concurrency)
        api = api_client_from_settings(settings)
        install_crds(api)
        rate = create_configmaps(api, args.objects, namespace=NAMESPACE, threads=args.concurrency, size=args.size)
        total = args.objects
        print(f"created {total} ConfigMaps at {rate:.0f}/s", flush=True)
        options = ChunkOptions(limit=args.limit, write_concurrency=args.concurrency)
        version = 1
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            for rep in range(args.repeat):
                for label in ("raw", "chunks", "flow", "empty"):
                    if label != "empty":
                        version += 1
                        sim.admin.set_storage_version("configmaps", f"v{version}")
                    if label == "raw":
                        seconds, objects, _ = timed(raw_loop, api, pool, args.limit)
                    elif label == "chunks":
                        seconds, objects, _ = timed(chunk_loop, api, options)
                    elif label == "flow":
                        clock.marks.clear()
                        seconds, objects, chunks = timed(run_flow, sim.kubeconfig, "configmaps", "",
                                                         args.concurrency, args.limit)  # fmt: skip
                        chunk_counts.append(chunks)
                        inside.append(clock.per_chunk())
                    else:
                        seconds, objects, _ = timed(run_flow, sim.kubeconfig, "cronjobs", "batch",
                                                    args.concurrency, args.limit)  # fmt: skip
                    if label != "empty" and objects < total:
                        raise SystemExit(f"{label}: listed {objects} of {total} objects")
                    samples[label].append(seconds)
                    print(f"rep {rep + 1} {label:<7} {seconds:7.2f} s  {objects / seconds if objects else 0:7.0f}/s",
                          flush=True)  # fmt: skip
        api.close()  # type: ignore[no-untyped-call]

    chunks = statistics.median(chunk_counts)
    per_s = {k: [total / s for s in v] for k, v in samples.items() if k != "empty"}
    print(f"\n{total} ConfigMaps of ~{args.size / 1024:.0f} KB, pages of {args.limit} ({chunks:.0f} chunks), "
          f"{args.concurrency} writes in flight, {args.repeat} interleaved repetitions; median (min-max)")  # fmt: skip
    print(f"{'pass':<34} {'objects/s':>18} {'vs raw loop':>18}")
    for key, label in (("raw", "raw loop (baseline)"), ("chunks", "chunk loop, no Prefect"),
                       ("flow", "migrate-resource flow")):  # fmt: skip
        r = ratios(per_s[key], per_s["raw"])
        print(f"{label:<34} {median_spread(per_s[key]):>18} "
              f"{statistics.median(r):>8.2f} ({min(r):.2f}-{max(r):.2f})")  # fmt: skip
    steady = [total / (f - e) for f, e in zip(samples["flow"], samples["empty"], strict=True)]
    r = ratios(steady, per_s["raw"])
    print(
        f"{'flow without its fixed cost':<34} {median_spread(steady):>18} "
        f"{statistics.median(r):>8.2f} ({min(r):.2f}-{max(r):.2f})"
    )
    per_chunk = [(f - e - c) / (chunks - 1) for f, e, c in zip(samples["flow"], samples["empty"], samples["chunks"],
                                                                 strict=True)]  # fmt: skip
    chunk_seconds = [c / chunks for c in samples["chunks"]]
    share = [p / c for p, c in zip(per_chunk, chunk_seconds, strict=True)]
    print(f"flow fixed cost (empty resource): {median_spread([e * 1000 for e in samples['empty']])} ms")
    print(
        f"Prefect cost per chunk: {median_spread([p * 1000 for p in per_chunk])} ms, "
        f"{100 * statistics.median(share):.1f}% ({100 * min(share):.1f}-{100 * max(share):.1f}%) "
        f"of a chunk of {args.limit} in the chunk loop ({1000 * statistics.median(chunk_seconds):.0f} ms)"
    )
    prefect_ms = [1000 * p for p, _, _ in inside]
    body_ms = [1000 * b for _, _, b in inside]
    print(
        f"timed inside the flow: Prefect's own cost per chunk {median_spread(prefect_ms)} ms, "
        f"{100 * statistics.median(p / b for p, b in zip(prefect_ms, body_ms, strict=True)):.1f}% of the chunk "
        f"task's body ({median_spread(body_ms)} ms); between chunks "
        f"{median_spread([1000 * w for _, w, _ in inside])} ms (checkpoint and agreement check included)"
    )
    print(json.dumps({"samples_seconds": samples, "chunks": chunk_counts, "inside_seconds": inside}))


if __name__ == "__main__":
    main()
