"""The embedded default: a simulated cluster with sample data, a local Prefect
server with the project's deployments and a worker, an upgrade found by the
detection flow, and the migrations run through the deployments, judged by what
etcd holds.

1. kubesim over a real etcd, with Secrets (encrypted with key1), ConfigMaps and
   objects of a CRD;
2. a Prefect server (UI included) that asks for an auth string made for this demo
   (issue 30: without one, whoever reaches its port reads every cluster's
   credentials), `prefect deploy --all`, a process worker;
3. the first polls of `detect-storage-changes` (the 10-minute schedule's, run
   now by hand): a StorageState per resource, persisted ["Unknown"], a migration
   each, then refined to the current hash;
4. the "upgrade": ConfigMaps stored as v2, the CRD's storage version moved to
   v2 — untouched objects stay as they were;
5. the next polls detect the new hashes, request migrations once the change has
   settled, and refine the StorageStates;
6. a key rotation (Secrets written with key2) is requested by hand, as a
   key-rotation tool would (seed 003): the storage version did not change;
7. a summary a person can check: objects rewritten per resource, the
   StorageStates, and etcd holding only the new version and key;
8-10. with `--clusters 2`, a second cluster on the same Prefect server and a
   fleet key rotation of both (scripts/demo_fleet.py).

`--engine in-tree` (issue 36) tells the same story on the cluster's own engine: kubesim
serves `storagemigration.k8s.io` and runs kube-controller-manager's migrator (its
`StorageVersionMigrator` gate on), the workers run with STORAGE_MIGRATOR_ENGINE=in-tree,
and every migration is an in-tree object named after our request, which stays the
record; the summary says which engine ran each and lists the in-tree objects.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import yaml
from demo_fleet import second_cluster, watch_poll  # scripts/, this script's own folder
from kubernetes import client as k8s

from devstack import REPO, PrefectStack
from devstack.postgres import start_postgres
from devstack.ui import wait_for_ui
from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.codec import ENCRYPTED_PREFIX
from kubesim.etcd import EtcdStore, prefix_end
from storage_migrator.conditions import is_condition_true
from storage_migrator.detection.states import list_states
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.migration.engines import ENGINE_ANNOTATION
from storage_migrator.migration.requests import list_migrations
from storage_migrator.settings import Settings

WIDGETS = "widgets.demo.example.com"
SCHEMA = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": WIDGETS},
    "spec": {
        "group": "demo.example.com",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {"name": "v1", "served": True, "storage": True, "schema": SCHEMA},
            {"name": "v2", "served": True, "storage": False, "schema": SCHEMA},
        ],
    },
}
# seed 004 asks for about a minute; the demo waits a few seconds.
SETTLE_SECONDS = 5
PREFIXES = {
    "secrets": b"/registry/secrets/demo/",
    "configmaps": b"/registry/configmaps/demo/",
    WIDGETS: b"/registry/demo.example.com/widgets/demo/",
}


def stored_forms(etcd: EtcdStore, prefix: bytes) -> Counter[str]:
    """How the values under a prefix are stored: by apiVersion, or by encryption key."""
    forms: Counter[str] = Counter()
    for kv in etcd.range(prefix, prefix_end(prefix)).kvs:
        if kv.value.startswith(ENCRYPTED_PREFIX):
            forms[f"encrypted with {kv.value.split(b':')[4].decode()}"] += 1
        else:
            forms[f"apiVersion {json.loads(kv.value)['apiVersion']}"] += 1
    return forms


def report(title: str, etcd: EtcdStore) -> dict[str, Counter[str]]:
    print(f"\n{title}")
    found = {}
    for name, prefix in PREFIXES.items():
        found[name] = stored_forms(etcd, prefix)
        forms = ", ".join(f"{n} {form}" for form, n in sorted(found[name].items()))
        print(f"  {name:<26} {forms}")
    return found


def seed(api: k8s.ApiClient, *, count: int) -> None:
    core = k8s.CoreV1Api(api)
    ext = k8s.ApiextensionsV1Api(api)
    for path in sorted((REPO / "deployments" / "crds").glob("*.yaml")):
        ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
    ext.create_custom_resource_definition(WIDGET_CRD)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name="demo")))
    # The install's namespace (deployments/rbac/): each migration holds its request's writer Lease there.
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name="storage-migrator")))
    custom = k8s.CustomObjectsApi(api)
    time.sleep(0.5)  # kubesim serves a new CRD within 0.25 s, as an API server takes a moment

    def one(i: int) -> None:
        core.create_namespaced_secret(
            "demo", k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=f"secret-{i:05d}"), string_data={"password": f"p{i}"})
        )
        core.create_namespaced_config_map(
            "demo", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"config-{i:05d}"), data={"key": f"value-{i}"})
        )
        if i % 2 == 0:
            body = {"apiVersion": "demo.example.com/v1", "kind": "Widget",
                    "metadata": {"name": f"widget-{i:05d}"}, "spec": {"size": i}}  # fmt: skip
            custom.create_namespaced_custom_object("demo.example.com", "v1", "demo", "widgets", body)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))


def upgrade(api: k8s.ApiClient, admin: Admin) -> None:
    admin.set_storage_version("configmaps", "v2")
    ext = k8s.ApiextensionsV1Api(api)
    crd = ext.read_custom_resource_definition(WIDGETS)
    crd.spec.versions[0].storage, crd.spec.versions[1].storage = False, True
    ext.replace_custom_resource_definition(WIDGETS, crd)


def wait_for_migrations(api: Any, *, timeout: float) -> list[Any]:
    deadline = time.monotonic() + timeout
    while True:
        migrations = list_migrations(api)
        done = [
            m for m in migrations if any(is_condition_true(m.status.conditions, c) for c in ("Succeeded", "Failed"))
        ]
        if migrations and len(done) == len(migrations):
            return migrations
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: {len(migrations) - len(done)} migrations still pending after {timeout:.0f} s")
        time.sleep(1)


#: kube-controller-manager's own migrations (the in-tree API of the same plural as ours).
IN_TREE = ("storagemigration.k8s.io", "v1", "storageversionmigrations")  # the in-tree API


def in_tree_lines(api: Any) -> list[str]:
    """kube-controller-manager's migrations as `kubectl get` would list them: name, resource, its phase."""
    items = k8s.CustomObjectsApi(api).list_cluster_custom_object(*IN_TREE)["items"]
    lines = [f"{'NAME':<56} {'RESOURCE':<50} PHASE"]
    for item in sorted(items, key=lambda i: i["metadata"]["creationTimestamp"]):
        res = item["spec"]["resource"]
        true = [c["type"] for c in item.get("status", {}).get("conditions", []) if c["status"] == "True"]
        phase = next((t for t in ("Succeeded", "Failed", "Running") if t in true), "Pending")
        name = f"{res['resource']}.{res['group']}" if res["group"] else res["resource"]
        lines.append(f"{item['metadata']['name']:<56} {name:<50} {phase}")
    return lines


def poll(stack: PrefectStack) -> None:
    """One run of the detection deployment, waited for (what the schedule does every 10 minutes)."""
    watch_poll(stack, "detect-storage-changes/detect-storage-changes")


def print_states(api: Any) -> None:
    print(f"   {'STORAGESTATE':<46} {'CURRENT':<14} PERSISTED")
    for state in sorted(list_states(api), key=lambda s: s.metadata.name or ""):
        st = state.status
        print(f"   {state.metadata.name or '':<46} {st.current_storage_version_hash or '':<14} "
              f"{st.persisted_storage_version_hashes}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=1000,
                        help="Secrets and ConfigMaps each, and half as many Widgets (default 1000)")  # fmt: skip
    parser.add_argument(
        "--write-rate",
        type=float,
        default=250.0,
        help="writes per second shared by all migrations (default 250; production default 10)",
    )
    parser.add_argument("--clusters", type=int, choices=[1, 2], default=1,
                        help="2: a second cluster on the same Prefect server, and a fleet key rotation of both")  # fmt: skip
    parser.add_argument("--engine", choices=["client", "in-tree", "auto"], default="client",
                        help="the engine of the migrations (STORAGE_MIGRATOR_ENGINE): client (ours, the default), "
                             "in-tree (kube-controller-manager's migrator, which kubesim runs with its "
                             "StorageVersionMigrator gate on) or auto")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep everything running afterwards (Ctrl-C stops it)")
    parser.add_argument("--prefect-db", choices=["sqlite", "postgres"], default="sqlite",
                        help="the Prefect server's database: sqlite (Prefect's default) or postgres (Debian's "
                             "postgresql started for the demo; the documented choice for a shared server)")  # fmt: skip
    args = parser.parse_args()
    postgres = start_postgres() if args.prefect_db == "postgres" else None
    workdir = REPO / ".demo"
    kubeconfig = workdir / "kubeconfig"
    stack = PrefectStack(
        workdir / "prefect",
        server_env={"PREFECT_API_DATABASE_CONNECTION_URL": postgres.url} if postgres else None,
        worker_env={
            "STORAGE_MIGRATOR_KUBECONFIG": str(kubeconfig),
            "STORAGE_MIGRATOR_WRITE_RATE_PER_SECOND": str(args.write_rate),
            "STORAGE_MIGRATOR_MAX_PARALLEL_MIGRATIONS": "4",
            "STORAGE_MIGRATOR_SETTLE_SECONDS": str(SETTLE_SECONDS),
            "STORAGE_MIGRATOR_ENGINE": args.engine,
        },
    )
    in_tree = args.engine != "client"
    gates = {"StorageVersionMigrator": True} if in_tree else None
    if args.engine == "in-tree":  # what kcm cannot migrate (its garbage collector ignores events), as rbac says
        stack.worker_env["STORAGE_MIGRATOR_EXCLUDE_RESOURCES"] = "events"
    stack.wipe()
    started_at = datetime.now(UTC)
    with Cluster(feature_gates=gates) as cluster:
        cluster.write_kubeconfig(kubeconfig)
        admin = Admin(cluster.server.url)
        api = api_client_from_settings(Settings(kubeconfig=kubeconfig))
        etcd = cluster.etcd()
        try:
            print(f"1. kubesim on {cluster.server.url} (etcd {cluster.etcd_url}), kubeconfig {kubeconfig}")
            if in_tree:
                print(f"   engine {args.engine}: kubesim serves storagemigration.k8s.io and runs kube-controller-"
                      "manager's migrator; our requests stay the record, the writes are the controller's"
                      + ("; events left out of detection (kcm's garbage collector ignores them)"
                         if args.engine == "in-tree" else ""))  # fmt: skip
            seed(api, count=args.objects)
            report("   etcd after install:", etcd)
            print(f"\n2. A Prefect server (home {stack.home}); deploying prefect.yaml; a worker")
            stack.start_server()  # returns once the UI answers and its /ui-settings names this API (devstack.ui)
            print(f"   Prefect UI: {stack.ui_url} (its API: {stack.api_url})")
            print(f"   It asks for the auth string {stack.auth_string} (made for this demo only; "
                  "PREFECT_API_AUTH_STRING for the CLI and workers)")  # fmt: skip
            stack.deploy()
            stack.start_worker()
            print("\n3. First polls of detect-storage-changes: StorageStates created, a migration per resource")
            poll(stack)
            migrations = wait_for_migrations(api, timeout=900)
            poll(stack)  # refines persisted to [current] now that the migrations succeeded
            print_states(api)
            print("\n4. Upgrade: ConfigMaps stored as v2, the Widget CRD stores v2")
            upgrade(api, admin)
            report("   etcd right after the upgrade (nothing re-written yet):", etcd)
            print("\n5. The next polls see the new hashes, request migrations once settled, refine")
            started = time.monotonic()
            poll(stack)  # sees the change: current hash set, appended to persisted
            print_states(api)
            time.sleep(SETTLE_SECONDS + 1)
            poll(stack)  # the change has settled: migrations requested and started
            wait_for_migrations(api, timeout=900)
            poll(stack)  # refined
            print(f"   detected, migrated and refined in {time.monotonic() - started:.0f} s")
            print_states(api)
            print("\n6. Key rotation: Secrets get write key key2; a migration requested by hand (seed 003)")
            admin.set_encryption(["key2", "key1"])
            stack.run("deployment", "run", "migrate-resource/migrate-resource", "--param", "resource=secrets",
                      "--watch")  # fmt: skip
            migrations = wait_for_migrations(api, timeout=900)
            print("\n7. Summary: the last migration of each resource")
            print(f"   {'RESOURCE':<46} {'PHASE':<10} {'ENGINE':<8} {'LISTED':>7} {'REWRITTEN':>9} {'UNCHANGED':>9}")
            latest = {(m.spec.resource.group, m.spec.resource.resource): m
                      for m in sorted(migrations, key=lambda m: m.metadata.creation_timestamp or started_at)}  # fmt: skip
            for _, m in sorted(latest.items()):
                r, p = m.spec.resource, m.status.progress
                name = f"{r.resource}.{r.group}" if r.group else r.resource
                engine = (m.metadata.annotations or {}).get(ENGINE_ANNOTATION, "client")
                print(f"   {name:<46} {m.status.phase or '':<10} {engine:<8} {p.listed if p else 0:>7} "
                      f"{p.rewritten if p else 0:>9} {p.unchanged if p else 0:>9}")  # fmt: skip
            if in_tree:
                print("\n   kube-controller-manager's migrations, one per request of ours (named after it):")
                print("   " + "\n   ".join(in_tree_lines(api)))
            after = report("   etcd after the migrations:", etcd)
            expected = {"secrets": "encrypted with key2", "configmaps": "apiVersion v2",
                        WIDGETS: "apiVersion demo.example.com/v2"}  # fmt: skip
            ok = all(set(after[n]) == {form} for n, form in expected.items())
            print(f"\n   etcd holds only the new version and key: {'yes' if ok else 'NO'}")
            if args.clusters == 2:
                ok = second_cluster(stack, workdir, objects=max(1, args.objects // 2), first_admin=admin,
                                    first_etcd=etcd, seed=lambda a, n: seed(a, count=n),
                                    wait_for_migrations=wait_for_migrations, report=report,
                                    engine=args.engine) and ok  # fmt: skip
            wait_for_ui(stack.ui_url, stack.api_url)
            print(f"\n   The Prefect UI answers at {stack.ui_url}. Open the Runs page first: {stack.ui_url}/v2/runs "
                  "(one migrate-<resource>-<version>-<uid> run per migration, tagged resource:<resource>; "
                  "detect-storage-changes and run-migrations). A run's Artifacts tab has its progress and its table "
                  "of outcomes; Deployments shows detect-storage-changes every 10 minutes. Where to look for "
                  "what: docs/ui.md.")  # fmt: skip
            print(f"   The UI asks for the auth string first: {stack.auth_string} (made for this demo only). "
                  f"The CLI and `prefect` commands need it too: export PREFECT_API_URL={stack.api_url} "
                  f"PREFECT_API_AUTH_STRING='{stack.auth_string}'")  # fmt: skip
            print(
                f"   kubectl --kubeconfig {kubeconfig} get storageversionmigrations.migration.k8s.io,storagestates.migration.k8s.io"
            )
            if in_tree:
                print(f"   kubectl --kubeconfig {kubeconfig} get storageversionmigrations.storagemigration.k8s.io")
            if args.keep:
                print("\nEverything keeps running; Ctrl-C stops it.")
                stop = threading.Event()
                signal.signal(signal.SIGINT, lambda *_: stop.set())
                signal.signal(signal.SIGTERM, lambda *_: stop.set())
                stop.wait()
            return 0 if ok else 1
        finally:
            stack.stop()
            if postgres:
                postgres.stop()
            etcd.close()
            api.close()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
