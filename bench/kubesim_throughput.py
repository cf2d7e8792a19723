"""How fast kubesim answers the requests a migration makes, against a GET baseline.

Prints requests per second and the ratio to GET (measured in the same run) for:
a GET of one object (baseline), a no-op merge patch that finds nothing to do
(the "unchanged" answer: no etcd write), a no-op merge patch that re-encodes
the object (after a storage version switch: one etcd write), a PUT of the object
as read, and a metadata-only LIST page of 500. One client, sequential: the
figures bound what a benchmark of the migrator on kubesim can show.

    uv run python bench/kubesim_throughput.py [--objects 2000]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from kubernetes import client as k8s

from kubesim.admin import Admin
from kubesim.cluster import Cluster
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.listing import list_page
from storage_migrator.kube.reading import read_object_bytes
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.writing import rewrite_with_patch, rewrite_with_put
from storage_migrator.settings import Settings

CONFIGMAPS = ResourceRef(version="v1", resource="configmaps")
NAMESPACE = "bench"


def timed(n: int, fn: Callable[[int], object]) -> float:
    started = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=2000)
    args = parser.parse_args()
    n = args.objects
    with Cluster() as cluster:
        kubeconfig = cluster.write_kubeconfig("/tmp/kubesim-bench.kubeconfig")
        api = api_client_from_settings(Settings(kubeconfig=kubeconfig))
        core = k8s.CoreV1Api(api)
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NAMESPACE)))
        names = [f"cm-{i:06d}" for i in range(n)]
        create_rate = timed(n, lambda i: core.create_namespaced_config_map(
            NAMESPACE, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=names[i]), data={"k": "v" * 512})))  # fmt: skip
        rvs = {
            item["metadata"]["name"]: item["metadata"]["resourceVersion"]
            for item in list_page(api, CONFIGMAPS, namespace=NAMESPACE, limit=n, metadata_only=True).items
        }

        def get(i: int) -> object:
            return read_object_bytes(api, CONFIGMAPS, name=names[i], namespace=NAMESPACE)

        def patch(i: int) -> object:
            return rewrite_with_patch(
                api, CONFIGMAPS, name=names[i], namespace=NAMESPACE, resource_version=rvs[names[i]]
            )

        def put(i: int) -> object:
            return rewrite_with_put(
                api, CONFIGMAPS, body=read_object_bytes(api, CONFIGMAPS, name=names[i], namespace=NAMESPACE)
            )

        get_rate = timed(n, get)
        unchanged_rate = timed(n, patch)
        writes_before = cluster.server.registry.etcd.writes
        Admin(cluster.server.url).set_storage_version("configmaps", "v2")
        rewrite_rate = timed(n, patch)
        rewrites = cluster.server.registry.etcd.writes - writes_before
        Admin(cluster.server.url).set_storage_version("configmaps", "v3")
        put_rate = timed(n, put)  # GET + PUT per object: what the PUT fallback costs
        pages = max(1, n // 500)
        list_rate = timed(pages, lambda i: list_page(api, CONFIGMAPS, namespace=NAMESPACE, limit=500,
                                                     metadata_only=True))  # fmt: skip
        api.close()  # type: ignore[no-untyped-call]

    rows = [
        ("GET one object (baseline)", get_rate),
        ("create", create_rate),
        ("no-op PATCH, unchanged", unchanged_rate),
        ("no-op PATCH, re-encoded", rewrite_rate),
        ("GET + PUT as read, re-encoded", put_rate),
        ("metadata-only LIST page of 500", list_rate),
    ]
    print(f"kubesim, {n} ConfigMaps of ~0.6 KB, one sequential client")
    print(f"{'request':<34} {'per second':>10} {'vs GET':>7}")
    for label, rate in rows:
        print(f"{label:<34} {rate:>10.0f} {rate / get_rate:>7.2f}")
    print(json.dumps({"etcd_writes_during_reencode": rewrites, "objects": n}))


if __name__ == "__main__":
    main()
