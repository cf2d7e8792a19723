"""A whole migration of 10,000 ConfigMaps: no-op merge patch against PUT as read.

DESIGN 4.5 chose the metadata-only LIST and the minimal merge patch
`{"metadata":{"resourceVersion": RV}}` (answered as PartialObjectMetadata) over
the full LIST and PUT of the object as read, because it "moves a few hundred
bytes per object instead of the whole object twice". This measures both modes
of `storage_migrator.migration.chunks.migrate_chunk` on the same objects, in the same run:

1. create the objects (ConfigMaps of about 1 KB, several threads);
2. switch the storage version and migrate every object in patch mode;
3. switch it again and migrate every object in PUT mode (the baseline);
4. migrate again in patch mode: nothing to re-encode (the "every answer
   unchanged" pass that proves completion, DESIGN 4.5).

For each pass it prints objects per second, HTTP body bytes per object in each
direction (kubesim's bytesIn/bytesOut counters: request and answer bodies,
headers not counted) and etcd writes, with ratios against PUT. The write
budget is off (`NoPacing`): this measures the protocol, not seed 002's 10
writes per second.

    uv run python bench/migrate_patch_vs_put.py [--objects 10000] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kubernetes.client import ApiClient
from stand import create_configmaps

from kubesim.admin import Admin
from kubesim.cluster import Cluster
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.migration.chunk_terms import ChunkOptions, WriteMode
from storage_migrator.migration.chunks import migrate_chunk
from storage_migrator.settings import Settings

CONFIGMAPS = ResourceRef(version="v1", resource="configmaps")
NAMESPACE = "bench"


@dataclass(frozen=True)
class Pass:
    label: str
    objects: int
    seconds: float
    bytes_in: int
    bytes_out: int
    etcd_writes: int
    rewritten: int
    unchanged: int
    chunks: int

    @property
    def per_second(self) -> float:
        return self.objects / self.seconds

    @property
    def in_per_object(self) -> float:
        return self.bytes_in / self.objects

    @property
    def out_per_object(self) -> float:
        return self.bytes_out / self.objects

    @property
    def wire_per_object(self) -> float:
        return (self.bytes_in + self.bytes_out) / self.objects


def migrate(api: ApiClient, admin: Admin, label: str, options: ChunkOptions) -> Pass:
    before = admin.counters()
    started = time.perf_counter()
    token: str | None = None
    listed = rewritten = unchanged = chunks = 0
    while True:
        result = migrate_chunk(api, CONFIGMAPS, continue_token=token, options=options)
        if result.failed:
            raise SystemExit(f"{label}: {result.failed} objects failed: {result.failures[:3]}")
        listed += result.listed
        rewritten += result.rewritten
        unchanged += result.unchanged
        chunks += 1
        token = result.token_out
        if token is None:
            break
    seconds = time.perf_counter() - started
    after = admin.counters()
    return Pass(
        label=label,
        objects=listed,
        seconds=seconds,
        bytes_in=after["bytesIn"] - before["bytesIn"],
        bytes_out=after["bytesOut"] - before["bytesOut"],
        etcd_writes=after["etcdWrites"] - before["etcdWrites"],
        rewritten=rewritten,
        unchanged=unchanged,
        chunks=chunks,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=10_000, help="ConfigMaps to create and migrate")
    parser.add_argument("--concurrency", type=int, default=8, help="writes in flight (and creating threads)")
    parser.add_argument("--limit", type=int, default=500, help="objects per LIST page")
    parser.add_argument("--size", type=int, default=1024, help="bytes of data per ConfigMap")
    args = parser.parse_args()

    with Cluster() as cluster, tempfile.TemporaryDirectory() as tmp:
        kubeconfig = cluster.write_kubeconfig(Path(tmp) / "kubeconfig")
        # the pool is sized to the write concurrency (one connection per write in flight)
        api = api_client_from_settings(Settings(kubeconfig=kubeconfig, write_concurrency=args.concurrency))
        admin = Admin(cluster.server.url)
        create_rate = create_configmaps(
            api, args.objects, namespace=NAMESPACE, threads=args.concurrency, size=args.size
        )

        def options(mode: WriteMode) -> ChunkOptions:
            return ChunkOptions(limit=args.limit, write_mode=mode, write_concurrency=args.concurrency)

        admin.set_storage_version("configmaps", "v2")
        patch = migrate(api, admin, "no-op merge patch", options("patch"))
        admin.set_storage_version("configmaps", "v3")
        put = migrate(api, admin, "PUT as read (baseline)", options("put"))
        again = migrate(api, admin, "merge patch, nothing to do", options("patch"))
        api.close()  # type: ignore[no-untyped-call]

    print(
        f"kubesim, {args.objects} ConfigMaps of ~{args.size / 1024:.0f} KB, LIST pages of {args.limit}, "
        f"{args.concurrency} writes in flight (created at {create_rate:.0f}/s)"
    )
    header = (
        f"{'pass':<28} {'objects/s':>9} {'vs PUT':>6} {'B/obj in':>9} {'B/obj out':>9} "
        f"{'B/obj wire':>10} {'vs PUT':>6} {'etcd writes':>11}"
    )
    print(header)
    for p in (put, patch, again):
        print(
            f"{p.label:<28} {p.per_second:>9.0f} {p.per_second / put.per_second:>6.2f} {p.in_per_object:>9.0f} "
            f"{p.out_per_object:>9.0f} {p.wire_per_object:>10.0f} {p.wire_per_object / put.wire_per_object:>6.2f} "
            f"{p.etcd_writes:>11}"
        )
    print(
        json.dumps(
            {
                p.label: {
                    "objects": p.objects,
                    "chunks": p.chunks,
                    "rewritten": p.rewritten,
                    "unchanged": p.unchanged,
                    "seconds": round(p.seconds, 2),
                    "bytesIn": p.bytes_in,
                    "bytesOut": p.bytes_out,
                    "etcdWrites": p.etcd_writes,
                }
                for p in (put, patch, again)
            }
        )
    )


if __name__ == "__main__":
    main()
