"""What an operator applies to a cluster, applied to kubesim as they would (issue 9).

Issue 9: "The CRDs install on a real cluster: the approval annotation on both,
and a test that applies `deployments/` to kubesim with kubesim enforcing the
rule" (reference/crd-protected-group-422.json: a real v1.36 server refused our
CRDs without it). With the machine's kubectl and the pinned one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import Kubectl, Kubesim

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("migration_crds")]

DEPLOYMENTS = Path(__file__).resolve().parents[2] / "deployments"


def manifests() -> list[dict[str, object]]:
    return [d for path in sorted(DEPLOYMENTS.rglob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture
def cleanup(kubectl: Kubectl) -> Iterator[None]:
    """Everything but the CRDs (the session's tests use them) is removed afterwards."""
    yield
    for doc in manifests():
        kind, meta = str(doc["kind"]), dict(doc["metadata"])  # type: ignore[call-overload]
        if kind != "CustomResourceDefinition":
            ns = ["-n", str(meta["namespace"])] if "namespace" in meta else []
            kubectl("delete", kind.lower(), str(meta["name"]), *ns, "--ignore-not-found", check=False)


def test_every_protected_group_crd_we_ship_carries_the_approval_annotation() -> None:
    crds = [d for d in manifests() if d["kind"] == "CustomResourceDefinition"]
    assert len(crds) == 2
    for crd in crds:
        annotations = dict(crd["metadata"]).get("annotations") or {}  # type: ignore[call-overload]
        assert str(annotations.get("api-approved.kubernetes.io", "")).startswith("https://"), crd["metadata"]


def test_kubectl_apply_of_deployments_succeeds(kubesim: Kubesim, kubectl: Kubectl, cleanup: None) -> None:
    applied = kubectl("apply", "-R", "-f", str(DEPLOYMENTS))
    for doc in manifests():
        name = dict(doc["metadata"])["name"]  # type: ignore[call-overload]
        assert f"/{name} " in applied.stdout, applied.stdout
    crd = kubectl("get", "customresourcedefinitions.apiextensions.k8s.io",
                  "storageversionmigrations.migration.k8s.io", "-o", "yaml")  # fmt: skip
    conditions = {c["type"]: (c["status"], c["reason"]) for c in yaml.safe_load(crd.stdout)["status"]["conditions"]}
    # apiextensions' approval controller: the annotation is a URL, so the policy is met.
    assert conditions["KubernetesAPIApprovalPolicyConformant"] == ("True", "ApprovedAnnotation")
    assert conditions["Established"][0] == "True"
    role = kubectl("get", "clusterroles.rbac.authorization.k8s.io", "storage-migrator", "-o", "yaml")
    assert yaml.safe_load(role.stdout)["rules"][0]["verbs"] == ["list", "patch", "update"]
