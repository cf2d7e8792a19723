"""A writer of the write budget in a process of its own, lean on CPU: the product's request Lease
and pacer (storage_migrator/migration/request_lease.py, what a migrate-resource run's chunks use),
driving no-op merge patches of one namespace's ConfigMaps, without Prefect (issue 37's tests of
the budget, which kubesim's timeline judges; a flow process costs seconds of CPU to start).

    python tests/lease_writer.py KUBECONFIG REQUEST NAMESPACE RATE SECONDS [THREADS]
    python tests/lease_writer.py --fork LOG_DIR     (then one JSON line per writer on stdin)

Takes REQUEST's Lease, joins the writers at RATE, writes for SECONDS (0: until killed), then
leaves and gives the Lease back. Prints one JSON line when it writes its first object, and one
at the end: {"first": wall time, "writes": n}.

With --fork, a writer per stdin line {"kubeconfig", "request", "namespace", "rate", "seconds"}
runs in a fork of this process, which imported everything once (a writer that joins costs no
second of imports, which on a loaded 2-core machine slowed the others' writes at every join);
each writes to LOG_DIR/<request>.log. It prints {"ready": true} once its imports are done, and
at the end of stdin {request: exit code}.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from uuid import uuid4

from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.errors import Conflict, NotFound
from storage_migrator.kube.listing import iterate_items
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.writing import rewrite_with_patch
from storage_migrator.migration.request_lease import RequestLease
from storage_migrator.settings import Settings

CONFIGMAPS = ResourceRef(version="v1", resource="configmaps")


def main(kubeconfig: str, request: str, namespace: str, rate: float, seconds: float, threads: int = 8) -> None:
    settings = Settings(kubeconfig=kubeconfig)
    api = api_client_from_settings(settings)
    objects = [(o["metadata"]["name"], o["metadata"]["resourceVersion"])
               for o in iterate_items(api, CONFIGMAPS, namespace=namespace, metadata_only=True)]  # fmt: skip
    versions = dict(objects)
    names = [name for name, _ in objects]
    lease = RequestLease.take(lambda: api_client_from_settings(settings), namespace="storage-migrator",
                              request=request, holder=f"lease-writer/{uuid4().hex[:8]}")  # fmt: skip
    lease.join(rate)
    pacer = lease.pacer()
    stop = threading.Event()
    lock = threading.Lock()
    state = {"next": 0, "writes": 0, "first": 0.0}

    def write() -> None:
        while not stop.is_set():
            pacer.before_write()
            with lock:
                name = names[state["next"] % len(names)]
                state["next"] += 1
                if not state["first"]:
                    state["first"] = time.time()
                    print(json.dumps({"first": state["first"]}), flush=True)
            try:
                done = rewrite_with_patch(api, CONFIGMAPS, name=name, namespace=namespace,
                                          resource_version=versions[name])  # fmt: skip
                versions[name] = done.new_resource_version
            except (Conflict, NotFound):
                pass
            finally:
                pacer.after_write()
            with lock:
                state["writes"] += 1

    workers = [threading.Thread(target=write, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + seconds if seconds > 0 else float("inf")
    while time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    for worker in workers:
        worker.join()
    lease.leave()  # a leaver stops writing before its Lease stops saying it writes
    lease.release()
    print(json.dumps({"first": state["first"], "writes": state["writes"]}), flush=True)


def fork_writers(logs: str) -> None:
    """The --fork mode (see the module docstring). The parent starts no thread, so a fork holds no lock."""
    children: dict[int, str] = {}
    print(json.dumps({"ready": True}), flush=True)  # imports done: the caller's schedule starts now
    for line in sys.stdin:
        spec = json.loads(line)
        pid = os.fork()
        if pid == 0:
            log = os.open(os.path.join(logs, f"{spec['request']}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            try:
                main(spec["kubeconfig"], spec["request"], spec["namespace"], float(spec["rate"]),
                     float(spec["seconds"]))  # fmt: skip
            except BaseException:  # noqa: BLE001 - the fork's exit code says it failed; its log says why
                traceback.print_exc()
                os._exit(1)
            sys.stdout.flush()
            os._exit(0)
        children[pid] = spec["request"]
    codes = {}
    while children:
        pid, status = os.wait()
        codes[children.pop(pid)] = os.waitstatus_to_exitcode(status)
    print(json.dumps(codes), flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[0] == "--fork":
        fork_writers(args[1])
    else:
        main(args[0], args[1], args[2], float(args[3]), float(args[4]), *(int(a) for a in args[5:]))
