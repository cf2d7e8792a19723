"""deployments/rbac: what the workers may do is what the code does, and no more.

A static reading of the role; tests/integration/test_rbac_proven.py proves it against
kubesim's RBAC (every flow with this role alone; no rule can be removed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kubesim.authn import UserInfo
from kubesim.rbac_authorizer import Attributes, rule_allows

RBAC = Path(__file__).resolve().parents[2] / "deployments" / "rbac" / "storage-migrator.yaml"


def cluster_role() -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    return role


def allowed(group: str, resource: str, verb: str) -> bool:
    """Whether a rule of the role allows it, matched as kube-apiserver's RBAC matches
    (kubesim/rbac_authorizer.py: `*` covers subresources, `resource/sub` is one name)."""
    name, _, sub = resource.partition("/")
    attrs = Attributes(user=UserInfo("u"), verb=verb, path="", resource_request=True, api_group=group,
                       resource=name, subresource=sub)  # fmt: skip
    return any(rule_allows(attrs, rule) for rule in cluster_role()["rules"])


def test_migrated_objects_can_be_listed_and_rewritten_but_not_read_created_or_deleted() -> None:
    """DESIGN 4.5: a metadata-only LIST and a no-op patch (or the PUT fallback) per object."""
    for verb in ("list", "patch", "update"):
        assert allowed("", "secrets", verb)
        assert allowed("apps", "deployments", verb)
    for verb in ("get", "create", "delete", "deletecollection", "watch", "*"):
        assert not allowed("", "secrets", verb), verb


def test_our_api_and_crd_refinement_are_covered() -> None:
    for verb in ("get", "list", "watch", "create", "patch", "delete"):
        assert allowed("migration.k8s.io", "storageversionmigrations", verb)
        assert allowed("migration.k8s.io", "storagestates", verb)
    assert allowed("migration.k8s.io", "storageversionmigrations/status", "patch")
    assert allowed("migration.k8s.io", "storagestates/status", "patch")
    assert allowed("apiextensions.k8s.io", "customresourcedefinitions/status", "patch")
    assert not allowed("apiextensions.k8s.io", "customresourcedefinitions", "delete")
    assert allowed("apiregistration.k8s.io", "apiservices", "list")


def test_discovery_is_readable_and_bound_to_the_service_account() -> None:
    urls = [r for r in cluster_role()["rules"] if "nonResourceURLs" in r]
    assert urls and {"/api", "/apis", "/apis/*"} <= set(urls[0]["nonResourceURLs"])
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == "storage-migrator"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "storage-migrator", "namespace": "storage-migrator"}
    ]


def test_agreement_sources_are_readable() -> None:
    """DESIGN 4.4: the StorageVersion API (GET one object between chunks, LIST in a poll)
    and the kubernetes Service's EndpointSlices (the API servers to poll one by one)."""
    assert allowed("internal.apiserver.k8s.io", "storageversions", "get")
    assert allowed("internal.apiserver.k8s.io", "storageversions", "list")
    assert allowed("discovery.k8s.io", "endpointslices", "list")
