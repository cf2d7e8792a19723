"""kubesim runs kube-controller-manager's storage version migrator for the in-tree API (issue 36,
item 6), judged by what etcd holds.

The behaviours are those of `pkg/controller/storageversionmigrator/` (sim/kubesim/svm_controller.py
cites the files); where a recording covers an outcome (reference/svm-succeeded.json,
svm-unknown-resource.json), the migration's status is compared with it. Small data, the
garbage collector's delay a fifth of a second.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import Kubectl, Kubesim, crd_manifest, wait_until
from kube_http import Http
from recorded import REFERENCE

from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.etcd import prefix_end
from kubesim.svm_controller import ControllerSettings

pytestmark = pytest.mark.integration

GROUP = "storagemigration.k8s.io"
V1 = f"/apis/{GROUP}/v1/storageversionmigrations"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
FAST = {"gc_delay": 0.2, "missing_resource_grace": 0.5}


@pytest.fixture
def in_tree(kubesim: Kubesim) -> Iterator[Http]:
    """The API served and its controller on, fast; afterwards no in-tree migration is left (a later
    test turning the gate on would see it run) and the controller's settings are put back."""
    before = kubesim.admin.svm_controller()
    kubesim.admin.set_feature_gates({"StorageVersionMigrator": True})
    kubesim.admin.set_svm_controller(enabled=True, **FAST)
    http = Http(kubesim.url, plain_text_errors=True)
    try:
        yield http
    finally:
        kubesim.admin.set_svm_controller(enabled=False)
        http.ok("DELETE", V1)
        kubesim.admin.set_svm_controller(
            enabled=before["enabled"], gc_delay=before["gcDelaySeconds"],
            missing_resource_grace=before["missingResourceGraceSeconds"], qps=before["kubeAPIQPS"],
            burst=before["kubeAPIBurst"],
        )  # fmt: skip


def migrate(http: Http, resource: str, group: str = "", name: str | None = None) -> str:
    name = name or f"m-{uuid.uuid4().hex[:8]}"
    body = {"metadata": {"name": name}, "spec": {"resource": {"group": group, "resource": resource}}}
    http.ok("POST", V1, body)
    return name


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in obj["status"].get("conditions") or [] if c["type"] == kind), None)


def is_true(obj: dict[str, Any], kind: str) -> bool:
    found = condition(obj, kind)
    return found is not None and found["status"] == "True"


def finished(http: Http, name: str) -> dict[str, Any]:
    """The migration once terminal and no longer Running (the runner's last write)."""

    def done() -> dict[str, Any] | None:
        obj = http.ok("GET", f"{V1}/{name}")
        terminal = is_true(obj, "Succeeded") or is_true(obj, "Failed")
        return obj if terminal and condition(obj, "Running") is not None and not is_true(obj, "Running") else None

    return dict(wait_until(done, what=f"in-tree migration {name} to end", timeout=120))


def shape(obj: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return [(c["type"], c["status"], c["reason"], c["message"]) for c in obj["status"]["conditions"]]


def recorded_shape(name: str) -> list[tuple[str, str, str, str]]:
    return shape(json.loads((REFERENCE / name).read_text()))


def stored(kubesim: Kubesim, prefix: str) -> dict[str, bytes]:
    raw = prefix.encode()
    return {kv.key.decode(): kv.value for kv in kubesim.etcd.range(raw, prefix_end(raw)).kvs}


@pytest.fixture
def widgets(in_tree: Http, namespace: str) -> Iterator[Callable[[int], str]]:
    """A CRD of a group of its own (so counters and etcd hold only this test's objects): call it with
    a number of objects; it answers the group, the objects stored as v1, then the storage moved to v2."""
    group = f"svm{uuid.uuid4().hex[:8]}.example.com"
    http = in_tree
    http.ok("POST", CRDS, crd_manifest(group))
    path = f"/apis/{group}/v1/namespaces/{namespace}/widgets"
    wait_until(lambda: http(method="GET", path=path)[0] == 200, what="the CRD served")

    def make(count: int) -> str:
        for i in range(count):
            http.ok("POST", path, {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": f"w{i:03d}"}})
        crd = http.ok("GET", f"{CRDS}/widgets.{group}")
        for version in crd["spec"]["versions"]:
            version["storage"] = version["name"] == "v2"
        flipped = http.ok("PUT", f"{CRDS}/widgets.{group}", crd)
        assert flipped["status"]["storedVersions"] == ["v1", "v2"]
        wait_until(lambda: http.ok("GET", f"/apis/{group}/v2")["resources"][0]["storageVersionHash"]
                   == http.ok("GET", f"/apis/{group}/v1")["resources"][0]["storageVersionHash"], what="the flip")  # fmt: skip
        return group

    try:
        yield make
    finally:
        http("DELETE", f"{CRDS}/widgets.{group}")


def versions_in_etcd(kubesim: Kubesim, group: str, namespace: str) -> dict[str, str]:
    values = stored(kubesim, f"/registry/{group}/widgets/{namespace}/")
    return {key.rsplit("/", 1)[1]: json.loads(value)["apiVersion"] for key, value in values.items()}


# ----- what it migrates ------------------------------------------------------------------
def test_a_crd_storage_flip_is_migrated_and_its_stored_versions_trimmed(
    in_tree: Http, kubesim: Kubesim, widgets: Callable[[int], str], namespace: str
) -> None:
    group = widgets(12)
    assert set(versions_in_etcd(kubesim, group, namespace).values()) == {f"{group}/v1"}
    written = kubesim.etcd.revision()
    kubesim.admin.reset_counters()
    obj = finished(in_tree, migrate(in_tree, "widgets", group))
    assert shape(obj) == recorded_shape("svm-succeeded.json")
    # The resourceVersion it migrated up to (a LIST with limit 1) covers every object written before.
    assert int(obj["status"]["resourceVersion"]) > written
    assert set(versions_in_etcd(kubesim, group, namespace).values()) == {f"{group}/v2"}
    # One no-op patch per object, sent through the API server: counted, and on its write timeline.
    counters = kubesim.admin.counters()["requestsByResource"]
    assert counters[f"patch widgets.{group}"] == 12
    assert sum(n for _, n in kubesim.admin.timeline()[f"patch widgets.{group}"]) == 12
    crd = in_tree.ok("GET", f"{CRDS}/widgets.{group}")
    assert crd["status"]["storedVersions"] == ["v2"]
    migrating = next(c for c in crd["status"]["conditions"] if c["type"] == "StorageMigrating")
    assert (migrating["status"], migrating["reason"], migrating["message"]) == (
        "False", "MigrationSucceeded", "The migration has succeeded and the stored versions have been updated",
    )  # fmt: skip
    assert migrating["observedGeneration"] == crd["metadata"]["generation"]


def test_secrets_are_rewritten_under_the_new_key(in_tree: Http, kubesim: Kubesim, namespace: str) -> None:
    for i in range(8):
        in_tree.ok("POST", f"/api/v1/namespaces/{namespace}/secrets", {"metadata": {"name": f"s{i}"},
                                                                       "stringData": {"k": "v"}})  # fmt: skip
    kubesim.admin.set_encryption(["key2", "key1"])  # the kubesim fixture puts the keys back
    prefix = f"/registry/secrets/{namespace}/"
    assert all(v.startswith(b"k8s:enc:aescbc:v1:key1:") for v in stored(kubesim, prefix).values())
    obj = finished(in_tree, migrate(in_tree, "secrets"))
    assert shape(obj) == recorded_shape("svm-succeeded.json")
    values = stored(kubesim, prefix)
    assert len(values) == 8
    assert all(v.startswith(b"k8s:enc:aescbc:v1:key2:") for v in values.values())


def test_a_conflict_skips_the_object(
    in_tree: Http, kubesim: Kubesim, widgets: Callable[[int], str], namespace: str
) -> None:
    """ "in case of conflict, we can stop processing migration for that resource" (runMigration): the
    object is left as it is and the migration goes on and succeeds."""
    group = widgets(5)
    kubesim.admin.set_faults([{"verb": "patch", "resource": f"widgets.{group}", "name": "w002", "code": 409}])
    obj = finished(in_tree, migrate(in_tree, "widgets", group))
    assert is_true(obj, "Succeeded")
    versions = versions_in_etcd(kubesim, group, namespace)
    assert versions.pop("w002") == f"{group}/v1"
    assert set(versions.values()) == {f"{group}/v2"}


# ----- what it refuses ---------------------------------------------------------------------
def test_an_unknown_resource_fails_as_recorded(in_tree: Http) -> None:
    obj = finished(in_tree, migrate(in_tree, "nothings", "nope.example.com"))
    assert shape(obj) == recorded_shape("svm-unknown-resource.json")
    assert "resourceVersion" not in obj["status"]


def test_an_aggregated_api_is_not_in_discovery(in_tree: Http) -> None:
    """kubesim proxies no aggregated API (every request under it answers 503), so kcm's discovery
    has no resources for it: the migration fails as for an unknown resource."""
    group = f"agg{uuid.uuid4().hex[:8]}.example.com"
    apiservice = {
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": f"v1beta1.{group}"},
        "spec": {"group": group, "version": "v1beta1", "groupPriorityMinimum": 100, "versionPriority": 100,
                 "service": {"namespace": "kube-system", "name": "metrics-server"}},
    }  # fmt: skip
    path = "/apis/apiregistration.k8s.io/v1/apiservices"
    in_tree.ok("POST", path, apiservice)
    try:
        wait_until(lambda: in_tree("GET", f"/apis/{group}/v1beta1")[0] == 503, what="the aggregated API listed")
        obj = finished(in_tree, migrate(in_tree, "pods", group))
    finally:
        in_tree.ok("DELETE", f"{path}/v1beta1.{group}")
        wait_until(lambda: group not in {g["name"] for g in in_tree.ok("GET", "/apis")["groups"]}, what="it gone")
    assert shape(obj) == recorded_shape("svm-unknown-resource.json")


def test_events_are_refused_as_the_source_says(in_tree: Http, kubesim: Kubesim, namespace: str) -> None:
    """kcm's garbage collector ignores events; the migrator "can't migrate a resource that doesn't
    exist in the GC" and fails it once a minute old (kubesim: the grace set by the fixture)."""
    in_tree.ok("POST", f"/api/v1/namespaces/{namespace}/events", {"metadata": {"name": "e"}, "reason": "R"})
    kubesim.admin.reset_counters()
    obj = finished(in_tree, migrate(in_tree, "events"))
    failed = condition(obj, "Failed")
    assert failed is not None
    assert (failed["status"], failed["reason"], failed["message"]) == (
        "True", "StorageVersionMigrationFailed",
        "migration encountered unhandled error: resource does not exist in GC: no monitor found for resource "
        "/v1, Resource=events",
    )  # fmt: skip
    assert obj["status"]["resourceVersion"]  # its resourceVersion was recorded: events are in discovery
    assert "patch events" not in kubesim.admin.counters()["requestsByResource"]


def test_a_resource_without_patch_is_refused(in_tree: Http, kubesim: Kubesim) -> None:
    kubesim.admin.set_verbs("configmaps", ["get", "list", "update", "watch"])
    try:
        obj = finished(in_tree, migrate(in_tree, "configmaps"))
    finally:
        kubesim.admin.set_verbs("configmaps", None)
    failed = condition(obj, "Failed")
    assert failed is not None
    assert (
        failed["message"]
        == 'resource "/v1, Resource=configmaps" does not support discovery operations: [update patch list]'
    )


# ----- switches, restarts, one at a time ---------------------------------------------------------
def test_switched_off_the_api_is_served_and_nothing_moves(
    in_tree: Http, kubesim: Kubesim, widgets: Callable[[int], str]
) -> None:
    group = widgets(3)
    kubesim.admin.set_svm_controller(enabled=False)
    name = migrate(in_tree, "widgets", group)
    seen = kubesim.admin.svm_controller()["syncs"]
    # Three passes of the loop after the object was created: the controller looked, and did nothing.
    wait_until(lambda: kubesim.admin.svm_controller()["syncs"] >= seen + 3, what="three passes of the controller")
    obj = in_tree.ok("GET", f"{V1}/{name}")
    assert obj["status"] == {}
    assert kubesim.admin.svm_controller()["running"] is False
    kubesim.admin.set_svm_controller(enabled=True)
    assert is_true(finished(in_tree, name), "Succeeded")


def test_a_restart_mid_run_rescans_and_finishes(
    in_tree: Http, kubesim: Kubesim, widgets: Callable[[int], str], namespace: str
) -> None:
    group = widgets(20)
    gr = f"widgets.{group}"
    # w010 answers 503: the migration is requeued at it, again and again, half done and Running.
    kubesim.admin.set_faults([{"verb": "patch", "resource": gr, "name": "w010", "code": 503}])
    name = migrate(in_tree, "widgets", group)
    wait_until(lambda: kubesim.admin.faults()[0]["fired"] >= 2, what="the migration requeued at w010 and rescanned")
    obj = in_tree.ok("GET", f"{V1}/{name}")
    assert is_true(obj, "Running") and not is_true(obj, "Succeeded")
    versions = versions_in_etcd(kubesim, group, namespace)
    assert {versions[f"w{i:03d}"] for i in range(10)} == {f"{group}/v2"}
    assert {versions[f"w{i:03d}"] for i in range(10, 20)} == {f"{group}/v1"}

    restarts = kubesim.admin.svm_controller()["restarts"]
    assert kubesim.admin.restart_svm_controller()["restarts"] == restarts + 1
    kubesim.admin.clear_faults()
    assert is_true(finished(in_tree, name), "Succeeded")
    assert set(versions_in_etcd(kubesim, group, namespace).values()) == {f"{group}/v2"}
    # No checkpoint: the restarted controller scanned from the start; what was rewritten before
    # has a newer resourceVersion than the migration's and was skipped, the other half patched.
    assert kubesim.admin.svm_controller()["migrations"][gr] == {"migration": "", "migratedObjects": 10,
                                                                 "remainingObjects": 0}  # fmt: skip


def test_one_migration_per_resource_at_a_time(in_tree: Http, kubesim: Kubesim, widgets: Callable[[int], str]) -> None:
    """Judged on etcd's history of the two objects: at no revision are both running, and the
    younger one starts running only once the older one has ended."""
    group = widgets(6)
    kubesim.admin.set_svm_controller(enabled=False, qps=5, burst=1)
    first = migrate(in_tree, "widgets", group, name=f"a-{group[:11]}")
    second = migrate(in_tree, "widgets", group, name=f"b-{group[:11]}")
    kubesim.admin.reset_counters()
    kubesim.admin.set_svm_controller(enabled=True)
    a, b = finished(in_tree, first), finished(in_tree, second)
    assert is_true(a, "Succeeded") and is_true(b, "Succeeded")
    prefix = b"/registry/storageversionmigrations/"
    start = min(kv.create_revision for kv in kubesim.etcd.range(prefix, prefix_end(prefix)).kvs)
    second_started = None
    for revision in range(start, kubesim.etcd.revision() + 1):
        at = {kv.key.decode().rsplit("/", 1)[1]: json.loads(kv.value)
              for kv in kubesim.etcd.range(prefix, prefix_end(prefix), revision=revision).kvs}  # fmt: skip
        if first not in at or second not in at:
            continue
        assert not (is_true(at[first], "Running") and is_true(at[second], "Running")), f"both running at {revision}"
        if second_started is None and is_true(at[second], "Running"):
            second_started = revision
            assert is_true(at[first], "Succeeded"), "the younger one started before the older one ended"
    assert second_started is not None
    # The client's rate (qps 5, burst 1): never more than 6 patches in any second.
    # The younger one recorded its resourceVersion at first sight, before the older one rewrote
    # every object: it finds them all newer, and patches none.
    assert int(b["status"]["resourceVersion"]) < second_started
    tenths = dict(kubesim.admin.timeline()[f"patch widgets.{group}"])
    assert sum(tenths.values()) == 6
    assert max(sum(tenths.get(t + i, 0) for i in range(10)) for t in tenths) <= 6


# ----- the tools users have ----------------------------------------------------------------
def test_kubectl_lists_and_waits(in_tree: Http, kubectl: Kubectl, widgets: Callable[[int], str]) -> None:
    group = widgets(2)
    name = migrate(in_tree, "widgets", group)
    kubectl("wait", "--for=condition=Succeeded", f"storageversionmigrations.{GROUP}/{name}", "--timeout=120s",
            timeout=150)  # fmt: skip
    listed = kubectl("get", f"storageversionmigrations.{GROUP}", "-o", "name").stdout.split()
    assert f"storageversionmigration.{GROUP}/{name}" in listed


def test_with_several_servers_it_talks_to_the_first(tmp_path: Any) -> None:
    """kcm talks to one API server: the writes are that server's, and it works where that
    server serves the API."""
    with Cluster(servers=2, svm_controller=ControllerSettings(**FAST)) as cluster:
        first, second = (Admin(s.url) for s in cluster.servers)
        second.set_feature_gates({"StorageVersionMigrator": True})
        assert first.svm_controller()["running"] is False  # the first does not serve the API
        first.set_feature_gates({"StorageVersionMigrator": True})
        assert second.svm_controller()["server"] == cluster.servers[0].url
        http = Http(cluster.servers[1].url, plain_text_errors=True)
        name = migrate(http, "configmaps")
        assert is_true(finished(http, name), "Succeeded")
        assert "update storageversionmigrations.storagemigration.k8s.io" in first.counters()["requestsByResource"]
        assert "update storageversionmigrations.storagemigration.k8s.io" not in second.counters()["requestsByResource"]
