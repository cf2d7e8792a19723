"""The deployments of prefect.yaml on a real Prefect server with a process worker,
started the way an operator starts them (`prefect deploy --all`, `prefect worker
start`, `prefect deployment run`), against kubesim; judged by etcd, the
StorageVersionMigration objects and the server's flow-run history."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from shared_stack import flow_runs, runs_under_way

from devstack import PrefectStack
from kubesim.codec import decode
from kubesim.etcd import prefix_end
from storage_migrator.conditions import is_condition_true
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.migration.requests import list_migrations
from storage_migrator.migration.writer_leases import list_writer_leases
from storage_migrator.settings import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("migration_crds")]


@pytest.fixture
def stack(deployed_stack: PrefectStack, wait_for: Any) -> PrefectStack:
    """The e2e tier's stack (tests/e2e/conftest.py: on PostgreSQL, issue 13: the documented choice
    for a shared server; its detection schedule paused), once no run is under way: an earlier
    test's run-migrations ends with a poll, and one inside a test would change what it counts."""
    wait_for(lambda: not runs_under_way(deployed_stack), what="no flow run under way before the test")
    return deployed_stack


def test_migrate_resource_deployment_runs_and_is_in_the_history(
    stack: PrefectStack, kubesim: Any, namespace: str, wait_for: Any
) -> None:
    """DESIGN 2: `prefect deployment run 'migrate-resource/migrate-resource' -p resource=...`
    creates the request and runs it; operators audit flow-run history."""
    api = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    core = k8s.CoreV1Api(api)
    for i in range(30):
        core.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"e2e-{i}")))
    kubesim.admin.set_storage_version("configmaps", "v2")
    ours = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    before = {m.metadata.name for m in list_migrations(ours)}

    stack.run("deployment", "run", "migrate-resource/migrate-resource", "--param", "resource=configmaps")

    def finished() -> Any:
        fresh = [m for m in list_migrations(ours) if m.metadata.name not in before]
        return fresh if fresh and is_condition_true(fresh[0].status.conditions, "Succeeded") else None

    (migration,) = wait_for(finished, what="the configmaps migration to succeed")
    prefix = f"/registry/configmaps/{namespace}/".encode()
    versions = {decode(kv.value, read_keys=[]).api_version for kv in kubesim.etcd.range(prefix, prefix_end(prefix)).kvs}
    assert versions == {"v2"}
    uid = migration.metadata.uid[:8]
    run = wait_for(
        lambda: next((r for r in flow_runs(stack) if r.name == f"migrate-configmaps-v1-{uid}" and r.state
                      and r.state.is_completed()), None),
        what="the flow run in the history",
    )  # fmt: skip
    assert "resource:configmaps" in run.tags and f"migration:{migration.metadata.name}" in run.tags
    # Issue 37: the write budget and the request's lock are a Lease in the cluster, deleted when
    # the run ends; Prefect's global concurrency limits are no longer on the write path at all.
    assert not [lease for lease in list_writer_leases(api, namespace="storage-migrator")
                if lease.request == migration.metadata.name], "the run's writer Lease is gone"  # fmt: skip
    with stack.client() as client:
        limits = [limit.name for limit in client.read_global_concurrency_limits(limit=200, offset=0)]
    assert not [name for name in limits if name.startswith("storage-migrator-writes")], limits
    api.close()


def test_unknown_resource_fails_the_run_with_a_clear_message(stack: PrefectStack, kubesim: Any, wait_for: Any) -> None:
    ours = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    before = {m.metadata.name for m in list_migrations(ours)}
    stack.run("deployment", "run", "migrate-resource/migrate-resource", "--param", "resource=nosuchthings")
    run = wait_for(
        lambda: next((r for r in flow_runs(stack) if r.name == "migrate-nosuchthings" and r.state
                      and r.state.is_final()), None),
        what="the failed run",
    )  # fmt: skip
    assert run.state.is_failed()
    assert "nosuchthings" in (run.state.message or "")
    assert {m.metadata.name for m in list_migrations(ours)} == before


def test_a_request_applied_with_kubectl_is_run_by_run_migrations(
    stack: PrefectStack, kubesim: Any, namespace: str, tmp_path: Path
) -> None:
    """DESIGN 2: operators request with `kubectl apply` and wait with `kubectl wait`."""
    manifest = tmp_path / "svm.yaml"
    manifest.write_text(json.dumps({
        "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
        "metadata": {"name": "e2e-secrets-key2"}, "spec": {"resource": {"version": "v1", "resource": "secrets"}},
    }))  # fmt: skip
    api = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    k8s.CoreV1Api(api).create_namespaced_secret(namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="s")))
    kubesim.admin.set_encryption(["key2", "key1"])
    kubectl = ["kubectl", "--kubeconfig", kubesim.kubeconfig]
    subprocess.run([*kubectl, "apply", "-f", str(manifest)], check=True, capture_output=True, timeout=60)
    stack.run("deployment", "run", "run-migrations/run-migrations")
    waited = subprocess.run(
        [*kubectl, "wait", "--for=condition=Succeeded", "storageversionmigrations.migration.k8s.io/e2e-secrets-key2", "--timeout=180s"],
        capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert waited.returncode == 0, waited.stderr
    value, _ = kubesim.etcd.get(f"/registry/secrets/{namespace}/s".encode())
    assert value is not None and value.value.startswith(b"k8s:enc:aescbc:v1:key2:")
    api.close()
