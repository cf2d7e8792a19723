"""`migrate-resource` on the in-tree engine (issue 36, item 2): kube-controller-manager's migrator (kubesim's,
sim/kubesim/svm_controller.py) writes; our request stays the record, our gates hold it, our counts prove it.

Judged by what etcd holds (DESIGN 8), not by what the flow or the controller reports. Small data (a dozen
objects), the controller's garbage-collector delay a fifth of a second.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import Kubesim, crd_manifest, wait_until
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from rotation_fixtures import KEY1, KEY2, SharedThreeServers, ThreeServers, wait

from kubesim.etcd import prefix_end
from storage_migrator.cli import main
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.migration.engines import ENGINE_ANNOTATION, IN_TREE_UNSEEN_ANNOTATION
from storage_migrator.migration.requests import read_migration
from storage_migrator.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("migration_crds", "prefect_api")]
pytest_plugins = ["rotation_cluster"]  # the module's cluster of three API servers, for the gate's tests

IN_TREE = ("storagemigration.k8s.io", "v1", "storageversionmigrations")
FAST_CONTROLLER = {"gc_delay": 0.2, "missing_resource_grace": 0.5}


@pytest.fixture
def api(kubesim: Kubesim) -> Iterator[Any]:
    client = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    yield client
    client.close()


@pytest.fixture
def in_tree(kubesim: Kubesim, monkeypatch: pytest.MonkeyPatch) -> Kubesim:
    """The in-tree API served and kube-controller-manager's controller running, fast; the run polls often.
    (The kubesim fixture turns the gate back off afterwards, deleting the in-tree objects left.)"""
    kubesim.admin.set_feature_gates({"StorageVersionMigrator": True})
    kubesim.admin.set_svm_controller(enabled=True, **FAST_CONTROLLER)
    monkeypatch.setenv("STORAGE_MIGRATOR_IN_TREE_POLL_SECONDS", "0.2")
    return kubesim


def in_tree_objects(api: Any) -> dict[str, dict[str, Any]]:
    items = k8s.CustomObjectsApi(api).list_cluster_custom_object(*IN_TREE)["items"]
    return {i["metadata"]["name"]: i for i in items}


def run_flow(kubesim: Kubesim, **params: Any) -> Any:
    from flows.migrate_resource import migrate_resource

    return migrate_resource(kubeconfig=kubesim.kubeconfig, return_state=True, **params)


@pytest.fixture
def widgets(in_tree: Kubesim, api: Any, namespace: str) -> Iterator[Callable[[int], str]]:
    """A CRD of its own group: `make(n)` creates n Widgets stored as v1, then moves the storage version to v2."""
    group = f"eng{uuid.uuid4().hex[:8]}.example.com"
    ext, custom = k8s.ApiextensionsV1Api(api), k8s.CustomObjectsApi(api)
    ext.create_custom_resource_definition(crd_manifest(group))
    wait_until(lambda: _served(custom, group, namespace), what="the CRD served")

    def make(count: int) -> str:
        for i in range(count):
            custom.create_namespaced_custom_object(group, "v1", namespace, "widgets", {
                "apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": f"w{i:03d}"}})  # fmt: skip
        crd = ext.read_custom_resource_definition(f"widgets.{group}")
        for version in crd.spec.versions:
            version.storage = version.name == "v2"
        ext.replace_custom_resource_definition(f"widgets.{group}", crd)
        return group

    try:
        yield make
    finally:
        ext.delete_custom_resource_definition(f"widgets.{group}")


def _served(custom: Any, group: str, namespace: str) -> bool:
    try:
        custom.list_namespaced_custom_object(group, "v1", namespace, "widgets")
    except k8s.ApiException:
        return False
    return True


def versions_in_etcd(kubesim: Kubesim, group: str, namespace: str) -> dict[str, str]:
    prefix = f"/registry/{group}/widgets/{namespace}/".encode()
    return {kv.key.decode().rsplit("/", 1)[1]: json.loads(kv.value)["apiVersion"]
            for kv in kubesim.etcd.range(prefix, prefix_end(prefix)).kvs}  # fmt: skip


def our_request(kubesim: Kubesim, name: str) -> Any:
    return read_migration(api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig)), name)


def poll(kubesim: Kubesim) -> Any:
    from flows.detect_storage_changes import detect_storage_changes

    return detect_storage_changes(settle_seconds=0, poll_seconds=600, start_migrations=False,
                                  kubeconfig=kubesim.kubeconfig)  # fmt: skip


def run_requested(kubesim: Kubesim) -> dict[str, str]:
    from flows.run_migrations import run_migrations

    return dict(run_migrations(max_parallel=2, kubeconfig=kubesim.kubeconfig).outcomes)


def is_true(obj: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in (obj.get("status") or {}).get("conditions") or [])


# ----- a migration on the in-tree engine ----------------------------------------------------
def test_a_crd_storage_flip_on_the_in_tree_engine_from_detection_to_refinement(
    in_tree: Kubesim, api: Any, widgets: Callable[[int], str], namespace: str, clean_slate: Any,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Issue 36: detection requests, our request is the record, kube-controller-manager writes (its own patches,
    through the API server), our count proves, detection refines and trims the CRD's stored versions."""
    group = widgets(0)  # the CRD alone, stored as v2 from the start; the objects come next, as v1
    monkeypatch.setenv("STORAGE_MIGRATOR_INCLUDE_RESOURCES", f"widgets.{group}")
    monkeypatch.setenv("STORAGE_MIGRATOR_ENGINE", "in-tree")
    ext, custom = k8s.ApiextensionsV1Api(api), k8s.CustomObjectsApi(api)
    crd = ext.read_custom_resource_definition(f"widgets.{group}")
    for version in crd.spec.versions:
        version.storage = version.name == "v1"
    ext.replace_custom_resource_definition(f"widgets.{group}", crd)
    for i in range(6):
        custom.create_namespaced_custom_object(group, "v1", namespace, "widgets", {
            "apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": f"w{i:03d}"}})  # fmt: skip
    poll(in_tree)  # first sight: a StorageState [Unknown] and a request
    assert set(run_requested(in_tree).values()) == {"Completed"}
    poll(in_tree)  # refined to v1
    crd = ext.read_custom_resource_definition(f"widgets.{group}")
    for version in crd.spec.versions:
        version.storage = version.name == "v2"  # the storage flip
    ext.replace_custom_resource_definition(f"widgets.{group}", crd)
    assert set(versions_in_etcd(in_tree, group, namespace).values()) == {f"{group}/v1"}
    wait_until(lambda: poll(in_tree).runnable, what="detection requesting the flip's migration")
    in_tree.admin.reset_counters()
    outcomes = run_requested(in_tree)
    assert set(outcomes.values()) == {"Completed"}, outcomes
    poll(in_tree)  # refines, and trims the CRD
    assert set(versions_in_etcd(in_tree, group, namespace).values()) == {f"{group}/v2"}
    requests = in_tree.admin.counters()["requestsByResource"]
    assert requests[f"patch widgets.{group}"] == 6  # kube-controller-manager's patches: none of ours
    (name,) = outcomes
    request = our_request(in_tree, name)
    assert (request.metadata.annotations or {})[ENGINE_ANNOTATION] == "in-tree"
    progress = request.status.progress
    assert progress is not None and (progress.listed, progress.rewritten, progress.unchanged) == (6, 6, 0)
    made = in_tree_objects(api)[name]  # named after our request, owned by it
    assert is_true(made, "Succeeded")
    assert made["metadata"]["ownerReferences"][0]["uid"] == request.metadata.uid
    state = next(s for s in clean_slate_states(in_tree) if s.metadata.name == f"widgets.{group}")
    assert state.status.persisted_storage_version_hashes == [state.status.current_storage_version_hash]
    assert ext.read_custom_resource_definition(f"widgets.{group}").status.stored_versions == ["v2"]
    # `status` says which engine ran the resource's last migration.
    assert main(["--kubeconfig", in_tree.kubeconfig, "status", "-o", "json"]) == 0
    (row,) = [r for r in json.loads(capsys.readouterr().out) if r["group"] == group]
    assert (row["migration"], row["phase"], row["engine"]) == (name, "Succeeded", "in-tree")


def clean_slate_states(kubesim: Kubesim) -> list[Any]:
    from storage_migrator.detection.states import list_states

    return list_states(api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig)))


def test_a_secrets_key_rotation_on_the_in_tree_engine_is_proven_by_our_count(
    in_tree: Kubesim, api: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36: "one in-tree object per encrypted resource and key, with our every-server gate and our
    verdict"; the verification pass's "rewrote nothing" is our own count (every object's resourceVersion
    not past the baseline we read), not the controller's word."""
    from flows.rotate_encryption_key import rotate_encryption_key

    monkeypatch.setenv("STORAGE_MIGRATOR_ENGINE", "in-tree")
    core = k8s.CoreV1Api(api)
    for i in range(6):
        core.create_namespaced_secret(namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=f"s{i}"),
                                                              string_data={"v": f"s{i}"}))  # fmt: skip
    in_tree.admin.set_encryption(["key1", "key2"])
    in_tree.admin.set_encryption(["key2", "key1"])  # seed 003's order; the kubesim fixture puts the keys back
    state = rotate_encryption_key(key="key2", resources=["secrets"], kubeconfig=in_tree.kubeconfig, return_state=True)
    assert state.is_completed(), state.message
    prefix = b"/registry/secrets/"
    assert {kv.value.split(b":")[4] for kv in in_tree.etcd.range(prefix, prefix_end(prefix)).kvs} == {b"key2"}
    made = in_tree_objects(api)
    assert is_true(made["secrets-key2"], "Succeeded") and is_true(made["secrets-key2-verify"], "Succeeded")
    (row,) = state.result().resources
    assert row.verified and row.verify_rewritten == 0 and row.rewritten >= 6
    verify = our_request(in_tree, "secrets-key2-verify")
    assert (verify.metadata.annotations or {})[ENGINE_ANNOTATION] == "in-tree"
    assert verify.status.progress is not None and verify.status.progress.unchanged == verify.status.progress.listed
    for name in ("secrets-key2", "secrets-key2-verify"):
        k8s.CustomObjectsApi(api).delete_cluster_custom_object("migration.k8s.io", "v1alpha1",
                                                               "storageversionmigrations", name)  # fmt: skip


def test_a_failed_in_tree_migration_fails_our_request_and_a_retry_is_a_new_one(
    in_tree: Kubesim, api: Any, widgets: Callable[[int], str], namespace: str
) -> None:
    """Failed is terminal there: our request becomes Failed, quoting it; kcm's trim of the CRD's
    storedVersions on failure is put back; a retry is a new request, and so a new in-tree object."""
    group = widgets(5)
    ext = k8s.ApiextensionsV1Api(api)
    assert ext.read_custom_resource_definition(f"widgets.{group}").status.stored_versions == ["v1", "v2"]
    # A webhook-like refusal of one object: kube-controller-manager fails the migration ("unhandled error").
    in_tree.admin.set_faults([{"verb": "patch", "resource": f"widgets.{group}", "name": "w002", "code": 400}])
    state = run_flow(in_tree, resource="widgets", group=group, engine="in-tree")
    assert state.is_failed()
    name = str(state.message).split(":")[0]
    failed = next(c for c in our_request(in_tree, name).status.conditions if c.type == "Failed")
    assert failed.reason == "InTreeMigrationFailed"
    assert (
        f"storageversionmigrations.storagemigration.k8s.io/{name} Failed (migration encountered unhandled error"
        in failed.message
    )
    assert is_true(in_tree_objects(api)[name], "Failed")  # kept: kube-controller-manager's record
    assert ext.read_custom_resource_definition(f"widgets.{group}").status.stored_versions == ["v1", "v2"]
    assert versions_in_etcd(in_tree, group, namespace)["w002"] == f"{group}/v1"

    in_tree.admin.clear_faults()
    again = run_flow(in_tree, resource="widgets", group=group, engine="in-tree")
    assert again.is_completed(), again.message
    assert again.result().migration != name
    assert is_true(in_tree_objects(api)[again.result().migration], "Succeeded")
    assert set(versions_in_etcd(in_tree, group, namespace).values()) == {f"{group}/v2"}


def test_a_controller_restart_mid_run_is_ridden_out(
    in_tree: Kubesim, api: Any, widgets: Callable[[int], str], namespace: str
) -> None:
    """kube-controller-manager has no checkpoint: restarted, it scans the running migration again (what it
    rewrote is newer than its resourceVersion and skipped). Our run waits it out, and proves it by etcd."""
    group = widgets(10)
    # w005 answers 503: the migration is requeued at it, again and again, half done and Running.
    in_tree.admin.set_faults([{"verb": "patch", "resource": f"widgets.{group}", "name": "w005", "code": 503}])
    outcome: dict[str, Any] = {}
    running = threading.Thread(target=lambda: outcome.setdefault("state", run_flow(
        in_tree, resource="widgets", group=group, engine="in-tree")), daemon=True)  # fmt: skip
    running.start()
    wait_until(lambda: in_tree.admin.faults()[0]["fired"] >= 2, what="the in-tree migration requeued at w005")
    restarts = in_tree.admin.svm_controller()["restarts"]
    assert in_tree.admin.restart_svm_controller()["restarts"] == restarts + 1
    in_tree.admin.clear_faults()
    running.join(timeout=120)
    state = outcome["state"]
    assert state.is_completed(), state.message
    assert set(versions_in_etcd(in_tree, group, namespace).values()) == {f"{group}/v2"}
    assert state.result().progress.rewritten == 10


def test_auto_with_the_api_served_and_the_controller_off_falls_back_and_says_so(
    in_tree: Kubesim, api: Any, widgets: Callable[[int], str], namespace: str, tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Issue 36: "an API can be served while kcm's gate is off". `auto` creates its in-tree object, sees it not
    picked up within in_tree_pickup_seconds, deletes it and migrates with the client engine, saying so in the
    log, the request's conditions and the ledger; the next run falls back at once."""
    from sqlalchemy import create_engine, text

    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv("STORAGE_MIGRATOR_DATABASE_URL", ledger)
    monkeypatch.setenv("STORAGE_MIGRATOR_IN_TREE_PICKUP_SECONDS", "1")
    group = widgets(4)
    in_tree.admin.set_svm_controller(enabled=False)  # kube-controller-manager's gate off; the API served
    in_tree.admin.reset_counters()
    state = run_flow(in_tree, resource="widgets", group=group, engine="auto", write_rate_per_second=2000.0)
    assert state.is_completed(), state.message
    assert set(versions_in_etcd(in_tree, group, namespace).values()) == {f"{group}/v2"}
    request = our_request(in_tree, state.result().migration)
    annotations = request.metadata.annotations or {}
    assert annotations[ENGINE_ANNOTATION] == "client" and IN_TREE_UNSEEN_ANNOTATION in annotations
    succeeded = next(c for c in request.status.conditions if c.type == "Succeeded")
    assert "did not pick up" in succeeded.message and "the client engine" in succeeded.message
    assert state.result().migration not in in_tree_objects(api)  # deleted when not picked up
    requests = in_tree.admin.counters()["requestsByResource"]
    assert requests["create storageversionmigrations.storagemigration.k8s.io"] == 1
    assert requests["delete storageversionmigrations.storagemigration.k8s.io"] == 1
    with create_engine(ledger).connect() as conn:
        engine, note = conn.execute(text("SELECT engine, engine_note FROM run_outcomes")).one()
    assert engine == "client" and "did not pick up" in note

    again = run_flow(in_tree, resource="widgets", group=group, engine="auto", write_rate_per_second=2000.0)
    assert again.is_completed(), again.message
    assert (
        in_tree.admin.counters()["requestsByResource"]["create storageversionmigrations.storagemigration.k8s.io"] == 1
    )
    note = (our_request(in_tree, again.result().migration).metadata.annotations or {})["migration.k8s.io/engine-note"]
    assert f"request {state.result().migration}" in note and "without trying again" in note


def test_events_are_refused_at_once_on_in_tree_and_go_to_the_client_engine_on_auto(
    in_tree: Kubesim, api: Any, namespace: str
) -> None:
    """kube-controller-manager's garbage collector ignores events, so its migrator fails them a minute later:
    `in-tree` refuses at once naming the fix, `auto` migrates them with the client engine."""
    k8s.CoreV1Api(api).create_namespaced_event(namespace, k8s.CoreV1Event(
        metadata=k8s.V1ObjectMeta(name="e"), involved_object=k8s.V1ObjectReference(name="x"), reason="R"))  # fmt: skip
    in_tree.admin.reset_counters()
    refused = run_flow(in_tree, resource="events", engine="in-tree")
    assert refused.is_failed()
    assert "garbage collector ignores events" in str(refused.message)
    assert "STORAGE_MIGRATOR_ENGINE=auto" in str(refused.message)
    requests = in_tree.admin.counters()["requestsByResource"]
    assert "create storageversionmigrations.storagemigration.k8s.io" not in requests
    assert "patch events" not in requests
    moved = run_flow(in_tree, resource="events", engine="auto", write_rate_per_second=2000.0)
    assert moved.is_completed(), moved.message
    assert moved.result().progress.listed >= 1
    note = (our_request(in_tree, moved.result().migration).metadata.annotations or {})["migration.k8s.io/engine-note"]
    assert "garbage collector ignores events" in note


# ----- the gate, on three API servers ----------------------------------------------------------
@pytest.fixture
def three(three_servers: SharedThreeServers, monkeypatch: pytest.MonkeyPatch) -> Iterator[ThreeServers]:
    """The module's three servers (rotation_fixtures.SharedThreeServers), a dozen Secrets under key1, the in-tree
    API served by each and kube-controller-manager's controller running (it talks to the first, as kcm to one
    address); afterwards the controller off, its objects deleted and the API no longer served."""
    monkeypatch.setenv("STORAGE_MIGRATOR_SERVER_CONFIG_POLL_SECONDS", "0.3")
    monkeypatch.setenv("STORAGE_MIGRATOR_IN_TREE_POLL_SECONDS", "0.2")
    monkeypatch.setenv("STORAGE_MIGRATOR_ENGINE", "in-tree")
    with three_servers.borrowed(secrets=12) as own:
        for admin in own.admins:
            admin.set_feature_gates({"StorageVersionMigrator": True})
        own.admins[0].set_svm_controller(enabled=True, **FAST_CONTROLLER)
        try:
            yield own
        finally:
            own.admins[0].set_svm_controller(enabled=False)
            api = own.api()
            try:
                k8s.CustomObjectsApi(api).delete_collection_cluster_custom_object(*IN_TREE)
            finally:
                api.close()
            for admin in own.admins:
                admin.set_feature_gates({"StorageVersionMigrator": False})


def rotate_on(servers: ThreeServers, **params: Any) -> Any:
    from flows.rotate_encryption_key import rotate_encryption_key

    return rotate_encryption_key(key="key2", resources=["secrets"], kubeconfig=str(servers.kubeconfig),
                                 context="kubesim-0", return_state=True, **params)  # fmt: skip


def shown_waiting(since: float) -> bool:
    """The rotation's gate showed (its table artifact, issue 19) that it waits for the servers to agree."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        shown = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(
            any_=["server-configs-rotate-key2"])), limit=20)  # fmt: skip
    return any(a.created is not None and a.created.timestamp() >= since and
               "waiting for every API server" in (a.description or "") for a in shown)  # fmt: skip


def in_tree_writes(servers: ThreeServers) -> dict[str, int]:
    counted = servers.admins[0].counters()["requestsByResource"]
    return {k: counted.get(k, 0) for k in ("create storageversionmigrations.storagemigration.k8s.io", "patch secrets")}


def test_the_gate_holds_an_in_tree_migration_while_the_servers_disagree(three: ThreeServers) -> None:
    """Issue 19's gate, before the cluster's own engine writes: while one server still writes with key1, no
    in-tree object exists and kube-controller-manager patches nothing; once every server runs one
    configuration, the in-tree migration runs and our verdict names it."""
    for server in range(3):
        three.roll(server, KEY1, KEY2)
    for server in range(2):
        three.roll(server, KEY2, KEY1)  # server 2 still writes with key1
    seen: dict[str, Any] = {}
    began = time.time()

    def operator() -> None:
        try:
            wait(lambda: shown_waiting(began), "the rotation waiting for server 2", timeout=120)
            seen["while they disagree"] = in_tree_writes(three)
        finally:
            three.roll(2, KEY2, KEY1)

    rolling = threading.Thread(target=operator, daemon=True)
    rolling.start()
    state = rotate_on(three, server_config_timeout=120)
    rolling.join(timeout=60)
    assert seen["while they disagree"] == {"create storageversionmigrations.storagemigration.k8s.io": 0,
                                           "patch secrets": 0}  # fmt: skip
    assert state.is_completed(), state.message
    assert "Proven under encryption configuration sha256:" in state.result().message
    assert three.keys_in_etcd() == {"key2"}
    assert in_tree_writes(three)["patch secrets"] >= 12  # kube-controller-manager's, through server 0


def test_a_server_changing_its_configuration_mid_run_stops_the_in_tree_migration(three: ThreeServers) -> None:
    """The gate lost mid-run: the in-tree object is deleted (its API's only stop: no new scan, no Succeeded on
    it) and our request fails as the client engine's would: not proven, keep the old key."""
    for server in range(3):
        three.roll(server, KEY1, KEY2)
    for server in range(3):
        three.roll(server, KEY2, KEY1)
    # s-0005 answers 503: the in-tree migration is requeued at it, again and again, half done and Running.
    three.admins[0].set_faults([{"verb": "patch", "resource": "secrets", "namespace": three.namespace,
                                 "name": "s-0005", "code": 503}])  # fmt: skip

    def operator() -> None:
        wait(lambda: three.admins[0].faults()[0]["fired"] >= 2, "the in-tree migration held at s-0005")
        three.roll(2, KEY1, KEY2)  # server 2 rolled back: it writes with key1 again

    rolling = threading.Thread(target=operator, daemon=True)
    rolling.start()
    try:
        state = rotate_on(three)
    finally:
        rolling.join(timeout=60)
        three.admins[0].clear_faults()
    assert state.is_failed(), state.message
    assert "keep the old key" in str(state.message).lower() or "do not remove the old key" in str(state.message).lower()
    api = three.api()
    try:
        request = k8s.CustomObjectsApi(api).get_cluster_custom_object("migration.k8s.io", "v1alpha1",
                                                                      "storageversionmigrations", "secrets-key2")  # fmt: skip
        assert "secrets-key2" not in in_tree_objects(api)
    finally:
        api.close()
    failed = next(c for c in request["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "EncryptionConfigurationChanged", failed
    assert "storageversionmigrations.storagemigration.k8s.io/secrets-key2 was deleted" in failed["message"]
    # Held at s-0005 until our run ended: stopped part-way, and deleted, so never scanned again.
    assert three.keys_in_etcd() == {"key1", "key2"}, "stopped part-way: both keys are still in etcd"
