"""The embedded default: a simulated cluster with sample data, an upgrade, and a
no-op rewrite of every object, judged by what etcd holds.

What this shows today (issue 2, the foundation): kubesim over a real etcd,
discovery with storage version hashes, a storage version switch and an
encryption key rotation that leave untouched objects behind in etcd, and the
access layer's minimal merge patch re-encoding them. The Prefect flows that do
this for real (chunked, checkpointed, rate limited, detected from discovery)
take the rewrite's place as issues 3 and 4 land.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.codec import ENCRYPTED_PREFIX
from kubesim.etcd import EtcdStore, prefix_end
from storage_migrator.cli import main as storage_migrator_cli
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.errors import Conflict, NotFound
from storage_migrator.kube.listing import iterate_items
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.writing import rewrite_with_patch
from storage_migrator.settings import Settings

WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.demo.example.com"},
    "spec": {
        "group": "demo.example.com",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {"name": "v1", "served": True, "storage": True,
             "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}},
            {"name": "v2", "served": True, "storage": False,
             "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}},
        ],
    },
}  # fmt: skip

RESOURCES = {
    "secrets": ResourceRef(version="v1", resource="secrets"),
    "configmaps": ResourceRef(version="v1", resource="configmaps"),
    "widgets.demo.example.com": ResourceRef(group="demo.example.com", version="v2", resource="widgets"),
}
PREFIXES = {
    "secrets": b"/registry/secrets/",
    "configmaps": b"/registry/configmaps/",
    "widgets.demo.example.com": b"/registry/demo.example.com/widgets/",
}


def stored_forms(etcd: EtcdStore, prefix: bytes) -> Counter[str]:
    """How the values under a prefix are stored: by apiVersion or encryption key."""
    forms: Counter[str] = Counter()
    for kv in etcd.range(prefix, prefix_end(prefix)).kvs:
        if kv.value.startswith(ENCRYPTED_PREFIX):
            forms[kv.value.split(b":")[4].decode().join(["encrypted with ", ""])] += 1
        else:
            forms[f"apiVersion {json.loads(kv.value)['apiVersion']}"] += 1
    return forms


def report(title: str, etcd: EtcdStore) -> None:
    print(f"\n{title}")
    for name, prefix in PREFIXES.items():
        forms = ", ".join(f"{n} {form}" for form, n in sorted(stored_forms(etcd, prefix).items()))
        print(f"  {name:<26} {forms}")


def seed(api: k8s.ApiClient, *, count: int) -> None:
    core = k8s.CoreV1Api(api)
    custom = k8s.CustomObjectsApi(api)
    k8s.ApiextensionsV1Api(api).create_custom_resource_definition(WIDGET_CRD)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name="demo")))
    for i in range(count):
        core.create_namespaced_secret(
            "demo", k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=f"secret-{i:05d}"), string_data={"password": f"p{i}"})
        )
        core.create_namespaced_config_map(
            "demo", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"config-{i:05d}"), data={"key": f"value-{i}"})
        )
    for _ in range(50):  # the CRD is served once it is established
        try:
            custom.list_namespaced_custom_object("demo.example.com", "v1", "demo", "widgets")
            break
        except k8s.ApiException:
            time.sleep(0.1)
    for i in range(count // 2):
        body = {"apiVersion": "demo.example.com/v1", "kind": "Widget", "metadata": {"name": f"widget-{i:05d}"},
                "spec": {"size": i}}  # fmt: skip
        custom.create_namespaced_custom_object("demo.example.com", "v1", "demo", "widgets", body)


def rewrite_all(api: k8s.ApiClient) -> Counter[str]:
    """A no-op merge patch of every object (issue 3's migration flow does this properly)."""
    outcomes: Counter[str] = Counter()
    for name, ref in RESOURCES.items():
        for item in iterate_items(api, ref, limit=500, metadata_only=True):
            meta = item["metadata"]
            try:
                result = rewrite_with_patch(
                    api, ref, name=meta["name"], namespace=meta.get("namespace"),
                    resource_version=meta["resourceVersion"],
                )  # fmt: skip
            except (NotFound, Conflict):
                outcomes[f"{name} skipped"] += 1
                continue
            outcomes[f"{name} {'rewritten' if result.rewritten else 'unchanged'}"] += 1
    return outcomes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=1000, help="Secrets and ConfigMaps each (default 1000)")
    parser.add_argument("--keep", action="store_true", help="keep kubesim running afterwards (Ctrl-C stops it)")
    parser.add_argument("--kubeconfig", type=Path, default=Path(".demo/kubeconfig"))
    args = parser.parse_args()

    with Cluster() as cluster:
        kubeconfig = cluster.write_kubeconfig(args.kubeconfig)
        admin = f"uv run python -m kubesim admin --kubeconfig {kubeconfig}"
        print(f"kubesim: API server {cluster.server.url}, etcd {cluster.etcd_url}, kubeconfig {kubeconfig}")
        api = api_client_from_settings(Settings(kubeconfig=kubeconfig))
        etcd = cluster.etcd()
        seed(api, count=args.objects)
        print("\nDiscovery, as the detection flow will read it:")
        storage_migrator_cli(["--kubeconfig", str(kubeconfig), "discover"])
        report("etcd after install:", etcd)

        print("\nUpgrade: configmaps stored as v2, the Widget CRD stores v2, Secrets get write key key2")
        admin_api = Admin(cluster.server.url)
        admin_api.set_storage_version("configmaps", "v2")
        crd = k8s.ApiextensionsV1Api(api).read_custom_resource_definition("widgets.demo.example.com")
        crd.spec.versions[0].storage, crd.spec.versions[1].storage = False, True
        k8s.ApiextensionsV1Api(api).replace_custom_resource_definition("widgets.demo.example.com", crd)
        admin_api.set_encryption(["key2", "key1"])
        time.sleep(0.5)  # the CRD cache of kubesim refreshes within 0.25 s
        storage_migrator_cli(["--kubeconfig", str(kubeconfig), "discover"])
        report("etcd right after the upgrade (nothing re-written yet):", etcd)

        started = time.monotonic()
        outcomes = rewrite_all(api)
        elapsed = time.monotonic() - started
        print(f"\nNo-op rewrite of every object: {dict(sorted(outcomes.items()))} in {elapsed:.1f} s")
        report("etcd after the rewrite:", etcd)
        again = rewrite_all(api)
        print(f"\nA second rewrite changes nothing: {dict(sorted(again.items()))}")
        etcd.close()
        api.close()
        if args.keep:
            print(f"\nkubesim keeps running. Try:\n  kubectl --kubeconfig {kubeconfig} get secrets -n demo --chunk-size=50"
                  f"\n  {admin} stored /registry/configmaps/demo/\nCtrl-C stops it.")  # fmt: skip
            stop = threading.Event()
            signal.signal(signal.SIGINT, lambda *_: stop.set())
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
