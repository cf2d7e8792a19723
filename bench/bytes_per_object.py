"""Bytes per object: metadata-only LIST + merge patch against full LIST + PUT (issue 13, benchmark 3).

DESIGN 4.5 chose the metadata-only LIST and the no-op merge patch, answered as
PartialObjectMetadata, because it "moves a few hundred bytes per object
instead of the whole object twice, which matters for Secrets and ConfigMaps of
hundreds of KB". Goal: at most 0.3 of PUT's bytes at 16 KB, 0.05 at 256 KB.

For each object size (ConfigMaps of about 1 KB, 16 KB and 256 KB, each size
in a kubesim of its own, started in another process), the objects are migrated
once with `migrate_chunk` in PUT mode (the baseline: full LIST, PUT of each
object as listed) and once in patch mode, each after a storage version switch
so that every object is re-encoded. Bytes are request + answer bodies counted
by kubesim (`bytesIn` + `bytesOut`; HTTP headers not counted), per object.

    uv run python bench/bytes_per_object.py [--objects 100] [--sizes 1024,16384,262144]
"""

from __future__ import annotations

import argparse

from migrate_patch_vs_put import NAMESPACE, Pass, migrate
from stand import create_configmaps, kubesim_process, machine

from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.migration.chunk_terms import ChunkOptions
from storage_migrator.settings import Settings


def measure(size: int, objects: int, concurrency: int, limit: int) -> tuple[Pass, Pass]:
    """(PUT, patch) passes over `objects` ConfigMaps of about `size` bytes."""
    with kubesim_process() as sim:
        api = api_client_from_settings(Settings(kubeconfig=sim.kubeconfig, write_concurrency=concurrency))
        try:
            create_configmaps(api, objects, namespace=NAMESPACE, threads=concurrency, size=size)
            sim.admin.set_storage_version("configmaps", "v2")
            put = migrate(api, sim.admin, "full LIST + PUT", ChunkOptions(limit=limit, write_mode="put"))
            sim.admin.set_storage_version("configmaps", "v3")
            patch = migrate(api, sim.admin, "metadata LIST + patch", ChunkOptions(limit=limit, write_mode="patch"))
        finally:
            api.close()  # type: ignore[no-untyped-call]
    for p in (put, patch):
        if p.objects != objects or p.rewritten != objects:
            raise SystemExit(f"{size} B, {p.label}: listed {p.objects}, rewrote {p.rewritten} of {objects}")
    return put, patch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=100, help="ConfigMaps per size")
    parser.add_argument("--sizes", default="1024,16384,262144", help="bytes of data per ConfigMap, comma-separated")
    parser.add_argument("--concurrency", type=int, default=8, help="writes in flight")
    parser.add_argument("--limit", type=int, default=100, help="objects per LIST page")
    args = parser.parse_args()
    print(f"machine: {machine()}", flush=True)
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        # kubesim reads a page from etcd in one gRPC answer (at most 4 MiB): smaller pages for big objects
        put, patch = measure(size, args.objects, args.concurrency, max(1, min(args.limit, 2_000_000 // size)))
        rows.append((size, put, patch))
        print(f"measured {size} B", flush=True)
    print(f"\n{args.objects} ConfigMaps per size, LIST pages of <= {args.limit}; bytes per object (bodies, kubesim)")
    print(f"{'object':>8} {'mode':<22} {'sent':>9} {'received':>9} {'total':>9} {'vs PUT':>7}")
    for size, put, patch in rows:
        for p in (put, patch):
            print(
                f"{size / 1024:>6.0f} K {p.label:<22} {p.in_per_object:>9.0f} {p.out_per_object:>9.0f} "
                f"{p.wire_per_object:>9.0f} {p.wire_per_object / put.wire_per_object:>7.3f}"
            )


if __name__ == "__main__":
    main()
