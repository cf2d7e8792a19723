"""The `run-migrations` and `initialize` flows against kubesim, on a Prefect test server."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from kubesim.codec import decode
from kubesim.etcd import prefix_end
from storage_migrator.conditions import is_condition_true
from storage_migrator.detection.states import list_states
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.migration.dispatch import migration_resource
from storage_migrator.migration.requests import list_migrations, read_migration
from storage_migrator.settings import Settings

pytestmark = pytest.mark.usefixtures("migration_crds", "prefect_api")
GROUP, VERSION, PLURAL = "migration.k8s.io", "v1alpha1", "storageversionmigrations"
FAST = {"write_rate_per_second": 2000.0, "write_concurrency": 8}


@pytest.fixture
def api(kubesim: Any) -> Iterator[k8s.ApiClient]:
    client = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    yield client
    client.close()


@pytest.fixture
def cleanup_requests(api: k8s.ApiClient) -> Iterator[None]:
    """Requests left pending would be picked up by the next test's dispatcher."""
    custom = k8s.CustomObjectsApi(api)
    before = {m["metadata"]["name"] for m in custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]}
    yield
    for item in custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]:
        if item["metadata"]["name"] not in before:
            custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, item["metadata"]["name"])


def request(api: k8s.ApiClient, name: str, resource: str, group: str = "", version: str = "v1") -> None:
    k8s.CustomObjectsApi(api).create_cluster_custom_object(
        GROUP, VERSION, PLURAL,
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "StorageVersionMigration", "metadata": {"name": name},
         "spec": {"resource": {"group": group, "version": version, "resource": resource}}},
    )  # fmt: skip


def stored_versions(kubesim: Any, prefix: str) -> set[str]:
    raw = prefix.encode()
    return {
        decode(kv.value, read_keys=["key1", "key2"]).api_version for kv in kubesim.etcd.range(raw, prefix_end(raw)).kvs
    }


def test_pending_requests_run_oldest_first_and_one_at_a_time_per_resource(
    kubesim: Any, namespace: str, api: k8s.ApiClient, cleanup_requests: None
) -> None:
    """DESIGN 4.6 and seed 003: "requests for the same resource run one after
    another"; every pending request is picked up, whoever created it."""
    from flows.run_migrations import run_migrations

    core = k8s.CoreV1Api(api)
    for i in range(15):
        core.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"c{i}")))
        core.create_namespaced_secret(namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=f"s{i}")))
    kubesim.admin.set_storage_version("configmaps", "v2")
    kubesim.admin.set_encryption(["key2", "key1"])
    request(api, "first-configmaps", "configmaps")
    request(api, "second-configmaps", "configmaps")
    request(api, "only-secrets", "secrets")

    summary = run_migrations(max_parallel=2, kubeconfig=kubesim.kubeconfig, chunk_size=5, **FAST)
    assert summary.outcomes == {"first-configmaps": "Completed", "only-secrets": "Completed",
                                "second-configmaps": "Completed"}  # fmt: skip
    ours = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    first, second = read_migration(ours, "first-configmaps"), read_migration(ours, "second-configmaps")
    for m in (first, second, read_migration(ours, "only-secrets")):
        assert is_condition_true(m.status.conditions, "Succeeded"), m.metadata.name
    assert first.status.finished_at and second.status.started_at
    assert second.status.started_at >= first.status.finished_at
    assert second.status.progress and second.status.progress.rewritten == 0  # the first did all the work
    assert stored_versions(kubesim, f"/registry/configmaps/{namespace}/") == {"v2"}
    keys = {kv.value.split(b":")[4] for kv in kubesim.etcd.range(
        f"/registry/secrets/{namespace}/".encode(), prefix_end(f"/registry/secrets/{namespace}/".encode())).kvs}  # fmt: skip
    assert keys == {b"key2"}


def test_a_request_made_with_kubectl_apply_is_run_and_kubectl_wait_sees_it(
    kubesim: Any, namespace: str, api: k8s.ApiClient, cleanup_requests: None, tmp_path: Path
) -> None:
    """seed 002: "The cluster admin can run the kubectl wait --for=condition=Succeeded"."""
    from flows.run_migrations import run_migrations

    k8s.CoreV1Api(api).create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="a")))
    manifest = tmp_path / "request.yaml"
    manifest.write_text(
        f"apiVersion: {GROUP}/{VERSION}\nkind: StorageVersionMigration\nmetadata:\n  name: applied-configmaps\n"
        "spec:\n  resource:\n    version: v1\n    resource: configmaps\n"
    )
    kubectl = ["kubectl", "--kubeconfig", kubesim.kubeconfig]
    subprocess.run([*kubectl, "apply", "-f", str(manifest)], check=True, capture_output=True, timeout=60)
    waiter = subprocess.Popen(
        [*kubectl, "wait", "--for=condition=Succeeded", "storageversionmigration/applied-configmaps", "--timeout=120s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    runner = threading.Thread(target=run_migrations, kwargs={"kubeconfig": kubesim.kubeconfig, **FAST})
    runner.start()
    out, err = waiter.communicate(timeout=150)
    runner.join(timeout=150)
    assert waiter.returncode == 0, err
    assert "condition met" in out


def test_initialize_requests_every_persisted_resource_and_says_what_it_skipped(
    kubesim: Any, clean_slate: k8s.ApiClient
) -> None:
    """seed 002 "Alpha workflow": requests for every resource from discovery, custom
    ones from CRDs; sub-resources, resources without a storageVersionHash and the
    second of a pair that "share the same storage" are left out. Issue 24: each
    request comes after the StorageState that records its hash (seed 000), so that
    the migration refines it."""
    from flows.initialize import initialize

    summary = initialize(start_migrations=False, kubeconfig=kubesim.kubeconfig)
    ours = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    created = {m.metadata.name: m for m in list_migrations(ours) if m.metadata.name in summary.created}
    requested = {(m.spec.resource.group, m.spec.resource.resource) for m in created.values()}
    for expected in [("", "configmaps"), ("", "secrets"), ("", "events"), ("apps", "deployments"),
                     ("batch", "cronjobs"), ("migration.k8s.io", "storagestates")]:  # fmt: skip
        assert expected in requested
    assert ("events.k8s.io", "events") not in requested
    skipped = {s.group_resource: s.reason for s in summary.skipped}
    assert "shares storage" in skipped["events.events.k8s.io"]
    assert "no storageVersionHash" in skipped["tokenreviews.authentication.k8s.io"]
    assert all(m.metadata.labels == {"migration.k8s.io/requested-by": "initialize"} for m in created.values())
    states = {s.metadata.name: s for s in list_states(ours)}
    for migration in created.values():
        state = states[migration_resource(migration)]
        assert state.status.persisted_storage_version_hashes == ["Unknown"]
        # etcd's revisions order the writes: the state first, then its request.
        assert int(state.metadata.resource_version or 0) < int(migration.metadata.resource_version or 0)

    again = initialize(start_migrations=False, kubeconfig=kubesim.kubeconfig)
    assert again.created == []
    assert "already requested" in {s.group_resource: s.reason for s in again.skipped}["configmaps"]


def test_initialize_then_runs_what_it_requested(kubesim: Any, namespace: str, clean_slate: k8s.ApiClient,
                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The run-migrations that initialize starts ends with a detection poll, which refines the
    state initialize wrote (issue 24): no second request."""
    from flows.initialize import initialize

    # The settings the runs initialize starts read (run-migrations' closing poll follows the include list).
    monkeypatch.setenv("STORAGE_MIGRATOR_INCLUDE_RESOURCES", "configmaps")
    monkeypatch.setenv("STORAGE_MIGRATOR_WRITE_RATE_PER_SECOND", "2000")
    k8s.CoreV1Api(clean_slate).create_namespaced_config_map(
        namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="x"))
    )
    kubesim.admin.set_storage_version("configmaps", "v2")
    summary = initialize(include=["configmaps"], kubeconfig=kubesim.kubeconfig)
    (name,) = summary.created
    ours = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    assert is_condition_true(read_migration(ours, name).status.conditions, "Succeeded")
    assert stored_versions(kubesim, f"/registry/configmaps/{namespace}/") == {"v2"}
    assert [m.metadata.name for m in list_migrations(ours)] == [name]
    (state,) = list_states(ours)
    assert state.status.persisted_storage_version_hashes == [state.status.current_storage_version_hash]


@pytest.fixture
def broken_metrics_api(kubesim: Any, api: k8s.ApiClient) -> Iterator[str]:
    """An APIService whose server is down, as a broken metrics-server is on many real clusters.

    kubesim proxies nothing, so it answers under that group version what the
    aggregator answers then: 503 "service unavailable", discovery included. It re-reads
    APIServices every quarter second, as it does CRDs, and lists the group in `/apis` from
    the same reading that answers 503: the fixture waits until `/apis` lists the group (and,
    afterwards, no longer does), not a guessed 0.3 s (issue 29).
    """
    registration = k8s.ApiregistrationV1Api(api)
    name = "v1beta1.metrics.k8s.io"

    def listed() -> bool:
        return "metrics.k8s.io" in {g.name for g in k8s.ApisApi(api).get_api_versions().groups}

    registration.create_api_service(
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": name},
         "spec": {"group": "metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                  "versionPriority": 100, "service": {"namespace": "kube-system", "name": "metrics-server"}}}
    )  # fmt: skip
    wait_until(listed, what="/apis listing metrics.k8s.io", timeout=30)
    try:
        yield "metrics.k8s.io/v1beta1"
    finally:
        registration.delete_api_service(name)
        wait_until(lambda: not listed(), what="/apis no longer listing metrics.k8s.io", timeout=30)


def test_an_aggregated_api_that_is_down_answers_503_as_on_a_real_cluster(
    kubesim: Any, api: k8s.ApiClient, broken_metrics_api: str
) -> None:
    """kubectl on a cluster with a broken metrics-server: "unable to retrieve the
    complete list of server APIs: metrics.k8s.io/v1beta1: the server is currently
    unable to handle the request"; our discovery reports the group version and
    carries on with the rest."""
    from storage_migrator.kube.discovery import discover

    groups = [g.name for g in k8s.ApisApi(api).get_api_versions().groups]
    assert "metrics.k8s.io" in groups
    out = subprocess.run(["kubectl", "--kubeconfig", kubesim.kubeconfig, "api-resources"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode != 0
    assert "metrics.k8s.io/v1beta1: the server is currently unable to handle the request" in out.stderr
    assert "configmaps" in out.stdout  # the rest is still listed
    found = discover(api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig)))
    assert [(f.group_version, f.code) for f in found.failed] == [(broken_metrics_api, 503)]
    assert any(r.resource == "configmaps" for r in found.resources)


def test_initialize_with_an_aggregated_api_down_requests_the_rest_and_fails_naming_it(
    kubesim: Any, clean_slate: k8s.ApiClient, broken_metrics_api: str
) -> None:
    """A broken aggregated API must not leave every other resource unmigrated: the
    run requests the rest, then ends Failed naming what it could not see and what to do."""
    from flows.initialize import initialize

    state = initialize(start_migrations=False, kubeconfig=kubesim.kubeconfig, return_state=True)

    assert state.is_failed()
    assert f"{broken_metrics_api}: discovery answered 503" in (state.message or "")
    assert "run initialize again" in (state.message or "")
    ours = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    requested = {(m.spec.resource.group, m.spec.resource.resource) for m in list_migrations(ours)}
    assert {("", "configmaps"), ("", "secrets"), ("apps", "deployments")} <= requested
