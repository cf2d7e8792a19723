"""How fast kubesim answers the requests a migration and the test suite make, and what
each answer costs kubesim's own CPU, against a GET baseline.

kubesim runs in a process of its own (`python -m kubesim serve`, HTTPS, its etcd on
/dev/shm; bench/stand.py), so its CPU per answer is read from /proc alone: user +
system time of the kubesim process (etcd is another process) over a row, divided by
the answers. One sequential client. Rows:

- a GET of one object (baseline); a create; a no-op merge patch that finds nothing
  to do (no etcd write); one that re-encodes the object (after a storage version
  switch: one etcd write); a GET and a PUT of the object as read; a metadata-only
  LIST page of 500: all through the access layer of `storage_migrator/kube/`, on one
  kept-alive connection, as the chunk loop sends them;
- a GET on a new client each time: `api_client_from_settings` and a new TLS
  connection per request, what a task of the product pays once (a new `ApiClient`
  per task, storage_migrator/kube/connection.py);
- a GET on a new TLS connection each time that resumes the TLS session of the one
  before (`http.client` with the `ssl` session passed on): what session reuse saves;
- the admin API setting a storage version to the one it has: what tests/conftest.py's
  `kubesim` fixture does for every built-in after every test;
- `kubectl get configmap NAME -o name` (discovery cached after the first call): a
  process and a TLS connection per call, what the kubectl tests pay per command.

Issue 29: kubesim serves over TLS (issue 22) in the test process; its rate at 10^5
objects fell from 616 to 319 objects/s when TLS went on. Run it on two trees (the
tree's own kubesim is the one measured) to compare a change: docs/benchmarks.md.

    uv run python -m bench.kubesim_throughput [--objects 2000]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from kubernetes import client as k8s

from bench.stand import kubesim_process, machine
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.listing import list_page
from storage_migrator.kube.reading import read_object_bytes
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.writing import rewrite_with_patch, rewrite_with_put
from storage_migrator.settings import Settings

CONFIGMAPS = ResourceRef(version="v1", resource="configmaps")
NAMESPACE = "bench"
_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of one process (its threads; not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


class Row:
    """One request kind: answers per second and kubesim's CPU ms per answer."""

    def __init__(self, label: str, rate: float, cpu_ms: float) -> None:
        self.label, self.rate, self.cpu_ms = label, rate, cpu_ms


def measured(label: str, pid: int, n: int, fn: Callable[[int], object]) -> Row:
    cpu, started = process_cpu(pid), time.perf_counter()
    for i in range(n):
        fn(i)
    elapsed, used = time.perf_counter() - started, process_cpu(pid) - cpu
    return Row(label, n / elapsed, 1000 * used / n)


def resuming_get(host: str, port: int, context: ssl.SSLContext, path: str, token: str) -> Callable[[int], object]:
    """A GET on a new TLS connection each call, offering the previous connection's session."""
    session: list[ssl.SSLSession | None] = [None]

    def get(_: int) -> object:
        conn = http.client.HTTPSConnection(host, port, context=context)
        conn.sock = context.wrap_socket(socket.create_connection((host, port)), server_hostname=host,
                                        session=session[0])  # fmt: skip
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
        body = conn.getresponse().read()
        session[0] = conn.sock.session
        conn.close()
        return body

    return get


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=2000)
    parser.add_argument(
        "--kubectl", default=shutil.which("kubectl"), help="kubectl to time (none: the row is left out)"
    )
    args = parser.parse_args()
    n = args.objects
    small = max(50, n // 8)  # rows that pay a connection or a process per request
    rows: list[Row] = []
    with kubesim_process() as sim, tempfile.TemporaryDirectory(prefix="bench-kubectl-") as home:
        pid = sim._proc.pid if sim._proc is not None else 0
        settings = Settings(kubeconfig=sim.kubeconfig)
        api = api_client_from_settings(settings)
        core = k8s.CoreV1Api(api)
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NAMESPACE)))
        names = [f"cm-{i:06d}" for i in range(n)]
        create = measured("create", pid, n, lambda i: core.create_namespaced_config_map(
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

        def new_client_get(i: int) -> object:
            fresh = api_client_from_settings(settings)
            try:
                return read_object_bytes(fresh, CONFIGMAPS, name=names[i], namespace=NAMESPACE)
            finally:
                fresh.close()  # type: ignore[no-untyped-call]

        admin = sim.admin
        rows.append(measured("GET one object (baseline)", pid, n, get))
        rows.append(create)
        rows.append(measured("no-op PATCH, unchanged", pid, n, patch))
        writes_before = admin.counters()["etcdWrites"]
        admin.set_storage_version("configmaps", "v2")
        rows.append(measured("no-op PATCH, re-encoded", pid, n, patch))
        rewrites = admin.counters()["etcdWrites"] - writes_before
        admin.set_storage_version("configmaps", "v3")
        rows.append(measured("GET + PUT as read, re-encoded", pid, n, put))  # what the PUT fallback costs
        rows.append(measured("metadata-only LIST page of 500", pid, max(10, n // 100), lambda i: list_page(
            api, CONFIGMAPS, namespace=NAMESPACE, limit=500, metadata_only=True)))  # fmt: skip
        rows.append(measured("GET, a new ApiClient each", pid, small, new_client_get))
        cluster = yaml.safe_load(Path(sim.kubeconfig).read_text())["clusters"][0]["cluster"]
        context = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        host, port = "127.0.0.1", int(sim.url.rsplit(":", 1)[1])
        path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{names[0]}"
        token = str(api.configuration.api_key.get("authorization", "Bearer kubesim")).split(" ")[-1]
        rows.append(measured("GET, new TLS connection, resumed", pid, small, resuming_get(host, port, context,
                                                                                         path, token)))  # fmt: skip
        rows.append(measured("admin: storage version, unchanged", pid, small,
                             lambda i: admin.set_storage_version("secrets", "v1")))  # fmt: skip
        if args.kubectl:
            argv = [args.kubectl, "--kubeconfig", sim.kubeconfig, "get", "configmap", names[0], "-n", NAMESPACE,
                    "-o", "name"]  # fmt: skip
            env = {"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            subprocess.run(argv, check=True, capture_output=True, env=env)  # discovery cached from here on
            rows.append(measured("kubectl get (a process each)", pid, max(20, n // 50),
                                 lambda i: subprocess.run(argv, check=True, capture_output=True, env=env)))  # fmt: skip
        api.close()  # type: ignore[no-untyped-call]

    baseline = rows[0].rate
    print(f"kubesim over TLS in its own process, {n} ConfigMaps of ~0.6 KB, one sequential client")
    print(machine())
    print(f"{'request':<36} {'per second':>10} {'vs GET':>7} {'kubesim CPU ms':>15}")
    for row in rows:
        print(f"{row.label:<36} {row.rate:>10.0f} {row.rate / baseline:>7.2f} {row.cpu_ms:>15.3f}")
    print(json.dumps({"etcd_writes_during_reencode": rewrites, "objects": n}))


if __name__ == "__main__":
    main()
