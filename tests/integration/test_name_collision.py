"""Our resource names collide with the in-tree storagemigration.k8s.io API (issue 9, item 4).

Seen on a real kube-apiserver v1.36.2 that serves `storagemigration.k8s.io/v1beta1`:
"`kubectl get storageversionmigrations` answered "No resources found" while
`storageversionmigrations.migration.k8s.io` listed every request `Succeeded`."
kubesim serves the in-tree API behind the `StorageVersionMigrator` feature gate,
so these tests see the collision, and show that the fully-qualified names the
docs and messages use are the ones that work.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from conftest import Kubectl, Kubesim
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from storage_migrator.kube.discovery import discover
from storage_migrator.models import MIGRATIONS_KIND_NAME

pytestmark = pytest.mark.integration


@pytest.fixture
def in_tree_api(kubesim: Kubesim) -> Iterator[None]:
    kubesim.admin.set_feature_gates({"StorageVersionMigrator": True})
    yield  # the kubesim fixture puts the gates back


@pytest.fixture
def succeeded_request(kubesim: Kubesim, migration_crds: None) -> Iterator[str]:
    """One of our StorageVersionMigrations, marked Succeeded."""
    api = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    custom = k8s.CustomObjectsApi(api)
    name = f"collide-{uuid.uuid4().hex[:8]}"
    body = {
        "apiVersion": "migration.k8s.io/v1alpha1",
        "kind": "StorageVersionMigration",
        "metadata": {"name": name},
        "spec": {"resource": {"group": "", "version": "v1", "resource": "secrets"}},
    }
    custom.create_cluster_custom_object("migration.k8s.io", "v1alpha1", "storageversionmigrations", body)
    status = {"status": {"conditions": [{"type": "Succeeded", "status": "True", "reason": "Completed"}]}}
    custom.patch_cluster_custom_object_status("migration.k8s.io", "v1alpha1", "storageversionmigrations", name, status)
    try:
        yield name
    finally:
        custom.delete_cluster_custom_object("migration.k8s.io", "v1alpha1", "storageversionmigrations", name)
        api.close()


def test_the_in_tree_api_is_served_only_behind_its_feature_gate(kubesim: Kubesim, migration_crds: None) -> None:
    """reference/README.md: "The in-tree migrator's API `storagemigration.k8s.io/v1beta1`
    exists in this version behind the `StorageVersionMigrator` gate"."""
    api = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    try:
        groups = {g.name for g in k8s.ApisApi(api).get_api_versions().groups}
        assert "storagemigration.k8s.io" not in groups
        kubesim.admin.set_feature_gates({"StorageVersionMigrator": True})
        groups = [g.name for g in k8s.ApisApi(api).get_api_versions().groups]
        assert "storagemigration.k8s.io" in groups
        # Built-in groups come first in /apis, so clients resolve a shared plural to it.
        assert groups.index("storagemigration.k8s.io") < groups.index("migration.k8s.io")
        # Our detection sees it as a persisted resource of its own (docs/migrations.md).
        found = discover(api).resources
        in_tree = [
            r for r in found if r.group == "storagemigration.k8s.io" and r.resource == "storageversionmigrations"
        ]
        # v1.37: v1 (GA) beside v1beta1, one storage version, so one hash.
        assert sorted(r.version for r in in_tree) == ["v1", "v1beta1"]
        assert {(r.kind, r.namespaced) for r in in_tree} == {("StorageVersionMigration", False)}
        assert len({r.storage_version_hash for r in in_tree}) == 1
        assert in_tree[0].storage_version_hash
    finally:
        api.close()


def test_a_bare_name_resolves_to_the_in_tree_api_and_the_full_name_to_ours(
    kubectl: Kubectl, in_tree_api: None, succeeded_request: str
) -> None:
    bare = kubectl("get", "storageversionmigrations", "-o", "name")
    assert bare.returncode == 0, bare.stderr
    assert succeeded_request not in bare.stdout  # the collision the issue saw
    full = kubectl("get", MIGRATIONS_KIND_NAME, "-o", "name")
    assert full.returncode == 0, full.stderr
    assert f"storageversionmigration.migration.k8s.io/{succeeded_request}" in full.stdout.splitlines()

    waited = kubectl(
        "wait", "--for=condition=Succeeded", f"{MIGRATIONS_KIND_NAME}/{succeeded_request}", "--timeout=20s"
    )
    assert waited.returncode == 0, waited.stderr
    wrong = kubectl(
        "wait", "--for=condition=Succeeded", f"storageversionmigration/{succeeded_request}", "--timeout=3s", check=False
    )
    assert wrong.returncode != 0  # waits on an in-tree object that does not exist


def test_without_the_in_tree_api_the_bare_name_finds_ours(kubectl: Kubectl, succeeded_request: str) -> None:
    """The switch is what makes the collision visible: off, kubesim behaves as before."""
    bare = kubectl("get", "storageversionmigrations", "-o", "name")
    assert bare.returncode == 0, bare.stderr
    assert f"storageversionmigration.migration.k8s.io/{succeeded_request}" in bare.stdout.splitlines()
