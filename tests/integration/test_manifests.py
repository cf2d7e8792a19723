"""What an operator applies to a cluster, applied to kubesim as they would (issues 9 and 14).

Issue 9: "The CRDs install on a real cluster: the approval annotation on both,
and a test that applies `deployments/` to kubesim with kubesim enforcing the
rule" (reference/crd-protected-group-422.json: a real v1.36 server refused our
CRDs without it). Issue 14: "`kubectl kustomize deployments/` renders, and
`kubectl apply -k deployments/ --dry-run=server` succeeds against kubesim."
With the machine's kubectl and the pinned one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import Kubectl, Kubesim

from kubesim.etcd import prefix_end

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("migration_crds")]

DEPLOYMENTS = Path(__file__).resolve().parents[2] / "deployments"
NAMESPACE = "storage-migrator"


def rendered(kubectl: Kubectl, path: Path) -> list[dict[str, object]]:
    out = kubectl("kustomize", str(path))
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def kinds(docs: list[dict[str, object]]) -> set[tuple[str, str]]:
    return {(str(d["kind"]), str(dict(d["metadata"])["name"])) for d in docs}  # type: ignore[call-overload]


def snapshot(kubesim: Kubesim) -> dict[bytes, int]:
    """Every key under /registry/ and its mod revision, but the API servers' own leases (heartbeats)."""
    result = kubesim.etcd.range(b"/registry/", prefix_end(b"/registry/"), keys_only=True)
    return {kv.key: kv.mod_revision for kv in result.kvs if not kv.key.startswith(b"/registry/leases/")}


@pytest.fixture
def cleanup(kubectl: Kubectl) -> Iterator[None]:
    """Everything but the CRDs (the session's tests use them) is removed afterwards, and the install's
    namespace made again, empty: the session's migrations hold their writer Leases there (issue 37)."""
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", check=False)
    yield
    for kind in ("clusterrolebindings.rbac.authorization.k8s.io", "clusterroles.rbac.authorization.k8s.io"):
        kubectl("delete", kind, "storage-migrator", "--ignore-not-found", check=False)
    for kind in ("validatingadmissionpolicybindings.admissionregistration.k8s.io",
                 "validatingadmissionpolicies.admissionregistration.k8s.io"):  # fmt: skip
        kubectl("delete", kind, "storage-migrator-flow-run-jobs", "--ignore-not-found", check=False)
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", check=False)
    kubectl("create", "namespace", NAMESPACE)


def test_every_protected_group_crd_we_ship_carries_the_approval_annotation() -> None:
    crds = [yaml.safe_load(p.read_text()) for p in sorted((DEPLOYMENTS / "crds").glob("*.yaml"))]
    assert len(crds) == 2
    for crd in crds:
        assert crd["kind"] == "CustomResourceDefinition"
        annotations = crd["metadata"].get("annotations") or {}
        assert str(annotations.get("api-approved.kubernetes.io", "")).startswith("https://"), crd["metadata"]


def test_kustomize_renders_the_install_and_crds_plus_rbac_are_the_process_pool_case(kubectl: Kubectl) -> None:
    full = kinds(rendered(kubectl, DEPLOYMENTS))
    rbac_only = {
        ("CustomResourceDefinition", "storageversionmigrations.migration.k8s.io"),
        ("CustomResourceDefinition", "storagestates.migration.k8s.io"),
        ("Namespace", NAMESPACE),
        ("ServiceAccount", "storage-migrator"),
        ("ClusterRole", "storage-migrator"),
        ("ClusterRoleBinding", "storage-migrator"),
        # Issue 37: the runs' writer Leases, in the install's namespace only.
        ("Role", "storage-migrator-writers"),
        ("RoleBinding", "storage-migrator-writers"),
    }
    worker = {
        ("ServiceAccount", "prefect-worker"),
        ("Role", "prefect-worker"),
        ("RoleBinding", "prefect-worker"),
        ("ConfigMap", "prefect-worker"),
        # Issue 30: the cluster's name in pull mode, which its flow-run Jobs read (empty: one cluster).
        ("ConfigMap", "storage-migrator-cluster"),
        ("Deployment", "prefect-worker"),
    }
    # Issue 35: the cluster refuses any other Job from the worker's ServiceAccount.
    admission = {
        ("ValidatingAdmissionPolicy", "storage-migrator-flow-run-jobs"),
        ("ValidatingAdmissionPolicyBinding", "storage-migrator-flow-run-jobs"),
    }
    # The pool's job template, for the worker to create the pool with (name + kustomize's content hash).
    [template] = [name for kind, name in full if name.startswith("storage-migrator-work-pool-")]
    assert full == rbac_only | worker | admission | {("ConfigMap", template)}
    # Issue 14: "An overlay (or documented patch) for the process-pool case (RBAC only)":
    # `kubectl apply -f deployments/crds/ -f deployments/rbac/` (docs/operator-guide.md).
    files = [*sorted((DEPLOYMENTS / "crds").glob("*.yaml")), *sorted((DEPLOYMENTS / "rbac").glob("*.yaml"))]
    assert kinds([d for p in files for d in yaml.safe_load_all(p.read_text()) if d]) == rbac_only


def test_server_dry_run_stores_nothing_then_apply_installs(kubesim: Kubesim, kubectl: Kubectl, cleanup: None) -> None:
    docs = rendered(kubectl, DEPLOYMENTS)
    before = snapshot(kubesim)
    # As on a real server (kubernetes/kubernetes#83562): a dry run creates no namespace, so
    # the objects in a namespace that does not exist yet are refused.
    first = kubectl("apply", "-k", str(DEPLOYMENTS), "--dry-run=server", check=False)
    assert first.returncode != 0
    assert f'namespaces "{NAMESPACE}" not found' in first.stderr, first.stderr
    assert "namespace/storage-migrator created (server dry run)" in first.stdout, first.stdout
    assert snapshot(kubesim) == before

    kubectl("create", "namespace", NAMESPACE)
    before = snapshot(kubesim)
    dry = kubectl("apply", "-k", str(DEPLOYMENTS), "--dry-run=server")
    assert "deployment.apps/prefect-worker created (server dry run)" in dry.stdout, dry.stdout
    assert "role.rbac.authorization.k8s.io/prefect-worker created (server dry run)" in dry.stdout, dry.stdout
    assert snapshot(kubesim) == before, "a server-side dry run wrote to etcd"
    # The process-pool case: CRDs and RBAC only.
    rbac_only = kubectl("apply", "-f", str(DEPLOYMENTS / "crds"), "-f", str(DEPLOYMENTS / "rbac"), "--dry-run=server")
    assert "clusterrole.rbac.authorization.k8s.io/storage-migrator created (server dry run)" in rbac_only.stdout
    assert snapshot(kubesim) == before, "a server-side dry run wrote to etcd"

    applied = kubectl("apply", "-k", str(DEPLOYMENTS))
    for doc in docs:
        name = dict(doc["metadata"])["name"]  # type: ignore[call-overload]
        assert f"/{name} " in applied.stdout, applied.stdout
    after = snapshot(kubesim)
    for key in (
        b"/registry/deployments/storage-migrator/prefect-worker",
        b"/registry/roles/storage-migrator/prefect-worker",
        b"/registry/rolebindings/storage-migrator/prefect-worker",
        b"/registry/configmaps/storage-migrator/prefect-worker",
        b"/registry/serviceaccounts/storage-migrator/storage-migrator",
        b"/registry/clusterrolebindings/storage-migrator",
        b"/registry/validatingadmissionpolicies/storage-migrator-flow-run-jobs",
        b"/registry/validatingadmissionpolicybindings/storage-migrator-flow-run-jobs",
        b"/registry/roles/storage-migrator/storage-migrator-writers",
        b"/registry/rolebindings/storage-migrator/storage-migrator-writers",
    ):
        assert key in after, key
    crd = kubectl("get", "customresourcedefinitions.apiextensions.k8s.io",
                  "storageversionmigrations.migration.k8s.io", "-o", "yaml")  # fmt: skip
    conditions = {c["type"]: (c["status"], c["reason"]) for c in yaml.safe_load(crd.stdout)["status"]["conditions"]}
    # apiextensions' approval controller: the annotation is a URL, so the policy is met.
    assert conditions["KubernetesAPIApprovalPolicyConformant"] == ("True", "ApprovedAnnotation")
    assert conditions["Established"][0] == "True"
    kubectl("get", "storageversionmigrations.migration.k8s.io")  # served
    role = kubectl("get", "clusterroles.rbac.authorization.k8s.io", "storage-migrator", "-o", "yaml")
    assert yaml.safe_load(role.stdout)["rules"][0]["verbs"] == ["list", "patch", "update"]


def test_the_in_tree_component_swaps_the_role_and_sets_the_engine_in_the_cluster(
    kubectl: Kubectl, tmp_path: Path
) -> None:
    """Issue 36: "the kustomize install offers it": deployments/kustomization.yaml with its `components:` lines
    uncommented binds deployments/rbac/in-tree/'s role (no patch or update on anything migrated) and sets
    STORAGE_MIGRATOR_ENGINE=in-tree in the ConfigMap every flow-run Job reads (the cluster decides)."""
    import shutil

    copy = tmp_path / "deployments"
    shutil.copytree(DEPLOYMENTS, copy)
    text = (copy / "kustomization.yaml").read_text()
    assert "# components:\n#   - rbac/in-tree\n" in text
    (copy / "kustomization.yaml").write_text(text.replace("# components:\n#   - rbac/in-tree\n",
                                                          "components:\n  - rbac/in-tree\n"))  # fmt: skip
    docs = rendered(kubectl, copy)
    assert kinds(docs) == kinds(rendered(kubectl, DEPLOYMENTS))
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and dict(d["metadata"])["name"] == "storage-migrator"]  # type: ignore[call-overload]
    variant = yaml.safe_load_all((DEPLOYMENTS / "rbac" / "in-tree" / "storage-migrator.yaml").read_text())
    (wanted,) = [d for d in variant if d and d["kind"] == "ClusterRole"]
    assert role["rules"] == wanted["rules"]
    (cluster,) = [d for d in docs if dict(d["metadata"])["name"] == "storage-migrator-cluster"]  # type: ignore[call-overload]
    assert cluster["data"] == {"STORAGE_MIGRATOR_ENGINE": "in-tree"}
