"""deployments/rbac: what the workers may do is what the code does, and no more.

A static reading of the role; tests/integration/test_rbac_proven.py proves it against
kubesim's RBAC (every flow with this role alone; no rule can be removed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesim.authn import UserInfo
from kubesim.rbac_authorizer import Attributes, rule_allows
from storage_migrator.kube.discovery import DiscoveredResource
from storage_migrator.operations.rbac import (
    CLUSTER_IDENTITY_RULES,
    EVERY_LIST,
    EVERYTHING,
    FIXED_RULES,
    IN_TREE_RULES,
    WRITER_LEASE_RULES,
    PolicyRule,
    RoleManifest,
    UnknownResource,
    build_role,
    shipped_rules,
)

RBAC = Path(__file__).resolve().parents[3] / "deployments" / "rbac" / "storage-migrator.yaml"
#: Issue 36: the in-tree engine's variant (kube-controller-manager writes).
IN_TREE_RBAC = RBAC.parent / "in-tree" / "storage-migrator.yaml"


def cluster_role(path: Path = RBAC) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    return role


def shipped_writers_role() -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    (role,) = [d for d in docs if d["kind"] == "Role"]
    return role


def test_the_writer_leases_are_granted_in_the_install_namespace_only() -> None:
    """Issue 37: each run's request Lease (the budget and the lock) in the install's namespace: a Role,
    bound to the workers' ServiceAccount; nothing of Leases cluster-wide beyond the `*` rewrite verbs."""
    role = shipped_writers_role()
    assert role["metadata"] == {"name": "storage-migrator-writers", "namespace": "storage-migrator"}
    assert [PolicyRule.model_validate(r) for r in role["rules"]] == list(WRITER_LEASE_RULES)
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding"]
    assert binding["metadata"] == role["metadata"] and binding["roleRef"]["name"] == "storage-migrator-writers"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "storage-migrator",
                                    "namespace": "storage-migrator"}]  # fmt: skip
    for verb in ("create", "delete"):
        assert not allowed("coordination.k8s.io", "leases", verb), "no Lease is created or deleted cluster-wide"


def test_a_narrow_role_grants_the_writer_leases_in_the_namespace_it_is_told() -> None:
    built = build_role(DISCOVERED, resources=["secrets"], namespace="migrator-eu")
    writers = built.manifest["items"][4]
    assert writers["metadata"] == {"name": "storage-migrator-writers", "namespace": "migrator-eu"}


def allowed(group: str, resource: str, verb: str) -> bool:
    """Whether a rule of the role allows it, matched as kube-apiserver's RBAC matches
    (sim/kubesim/rbac_authorizer.py: `*` covers subresources, `resource/sub` is one name)."""
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
    for verb in ("get", "list", "create", "patch", "delete"):
        assert allowed("migration.k8s.io", "storageversionmigrations", verb)
        assert allowed("migration.k8s.io", "storagestates", verb)
    # Nothing of ours watches (detection polls): no watch, even on our own objects.
    assert not allowed("migration.k8s.io", "storageversionmigrations", "watch")
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


def test_each_api_servers_metrics_are_readable() -> None:
    """Issue 19 item 5: "`get` on the `/metrics` non-resource URL" (no default role grants it)."""
    urls = [r for r in cluster_role()["rules"] if "nonResourceURLs" in r]
    assert "/metrics" in urls[0]["nonResourceURLs"] and urls[0]["verbs"] == ["get"]


def test_agreement_sources_are_readable() -> None:
    """DESIGN 4.4: the StorageVersion API (GET one object between chunks, LIST in a poll)
    and the kubernetes Service's EndpointSlices (the API servers to poll one by one)."""
    assert allowed("internal.apiserver.k8s.io", "storageversions", "get")
    assert allowed("internal.apiserver.k8s.io", "storageversions", "list")
    assert allowed("discovery.k8s.io", "endpointslices", "list")


# Issue 14 item 3: "`storage-migrator rbac [--resources secrets,configmaps] [--no-put]` prints a
# ClusterRole for exactly the resources it will migrate (from discovery, or the list given),
# `update` only where the PUT fallback is allowed".


def _served(group: str, resource: str, kind: str, verbs: tuple[str, ...] = ("list", "patch", "update"),
            *, version: str = "v1", hash_: str = "h") -> DiscoveredResource:  # fmt: skip
    return DiscoveredResource(group=group, version=version, resource=resource, kind=kind, namespaced=True,
                              verbs=verbs, storage_version_hash=hash_, is_subresource=False, preferred=True)  # fmt: skip


DISCOVERED = [
    _served("", "secrets", "Secret"),
    _served("", "configmaps", "ConfigMap"),
    _served("", "pods/status", "Pod").model_copy(update={"is_subresource": True}),
    _served("", "tokenreviews", "TokenReview", ("create",), hash_=""),
    _served("apps", "deployments", "Deployment"),
    _served("example.com", "widgets", "Widget"),
    _served("example.com", "gadgets", "Gadget", ("get", "list", "update")),  # no patch: the PUT fallback
]


def _rules(built: RoleManifest) -> list[dict[str, Any]]:
    role, binding, leases, leases_binding, writers, writers_binding = built.manifest["items"]
    assert (role["kind"], binding["kind"]) == ("ClusterRole", "ClusterRoleBinding")
    # Issue 19: the API servers' identity Leases, listed in kube-system only, by the same ServiceAccount.
    assert (leases["kind"], leases["metadata"]["namespace"]) == ("Role", "kube-system")
    assert leases["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list"]}]
    assert leases_binding["roleRef"]["name"] == leases["metadata"]["name"]
    assert leases_binding["subjects"] == binding["subjects"]
    # Issue 37: the runs' writer Leases, in the install's namespace only (a Role), by the same ServiceAccount.
    assert (writers["kind"], writers["metadata"]["namespace"]) == ("Role", "storage-migrator")
    assert writers["rules"] == [r.to_wire() for r in WRITER_LEASE_RULES] == [shipped_writers_role()["rules"][0]]
    assert writers_binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                          "name": writers["metadata"]["name"]}  # fmt: skip
    assert writers_binding["subjects"] == binding["subjects"]
    # Issue 20: the cluster's identity (the uid of kube-system) is read by a LIST of namespaces.
    fixed = [r.to_wire() for r in (*FIXED_RULES, *CLUSTER_IDENTITY_RULES)]
    assert fixed[-1] == {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list"]}
    assert role["rules"][len(role["rules"]) - len(fixed) :] == fixed
    return list(role["rules"][: len(role["rules"]) - len(fixed)])


def test_the_shipped_files_rules_are_the_functions() -> None:
    """One source of truth: the shipped role is `*` plus the fixed rules `*` does not grant
    (a narrower role from `storage-migrator rbac` carries all of them)."""
    shipped = [PolicyRule.model_validate(r) for r in cluster_role()["rules"]]
    assert shipped == shipped_rules()
    assert (
        shipped[0] == EVERYTHING == PolicyRule(api_groups=("*",), resources=("*",), verbs=("list", "patch", "update"))
    )
    assert set(shipped[1:-1]) < set(FIXED_RULES) and shipped[-1:] == list(IN_TREE_RULES)


def test_the_in_tree_variant_writes_nothing_migrated_and_is_the_function() -> None:
    """Issue 36: "`storage-migrator rbac --engine in-tree` prints a role with no patch or update on any
    migrated resource. The kustomize install offers it" (deployments/rbac/in-tree/)."""
    variant = [PolicyRule.model_validate(r) for r in cluster_role(IN_TREE_RBAC)["rules"]]
    assert variant == shipped_rules("in-tree")
    assert variant[0] == EVERY_LIST == PolicyRule(api_groups=("*",), resources=("*",), verbs=("list",))
    role = cluster_role(IN_TREE_RBAC)
    for verb in ("patch", "update", "get", "create", "delete"):
        for group, resource in (("", "secrets"), ("apps", "deployments"), ("example.com", "widgets")):
            name, _, sub = resource.partition("/")
            attrs = Attributes(user=UserInfo("u"), verb=verb, path="", resource_request=True, api_group=group,
                               resource=name, subresource=sub)  # fmt: skip
            assert not any(rule_allows(attrs, r) for r in role["rules"]), (verb, group, resource)
    assert ({"get", "create", "delete"} <= set(next(r for r in role["rules"] if r.get("apiGroups") ==
                                                    ["storagemigration.k8s.io"])["verbs"]))  # fmt: skip
    # The rest of the file is the shipped one's: the same Namespace, ServiceAccount and binding.
    same = [d for d in yaml.safe_load_all(RBAC.read_text()) if d and d["kind"] != "ClusterRole"]
    assert same == [d for d in yaml.safe_load_all(IN_TREE_RBAC.read_text()) if d and d["kind"] != "ClusterRole"]


#: What kube-apiserver serves for these (kcm's migrator needs list, watch, delete, update and patch).
ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SERVED_IN_FULL = [
    _served("", "secrets", "Secret", ALL_VERBS),
    _served("", "configmaps", "ConfigMap", ALL_VERBS),
    _served("", "events", "Event", ALL_VERBS),
    _served("apps", "deployments", "Deployment", ALL_VERBS),
    _served("example.com", "gadgets", "Gadget", ("get", "list", "update")),
]


def test_the_in_tree_role_lists_what_it_migrates_and_refuses_what_kcm_cannot() -> None:
    built = build_role(SERVED_IN_FULL, resources=["secrets", "configmaps"], engine="in-tree")
    role = built.manifest["items"][0]
    assert role["rules"][0] == {"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["list"]}
    assert role["rules"][-1] == IN_TREE_RULES[0].to_wire()
    with pytest.raises(UnknownResource, match=r"the in-tree engine cannot migrate events: .*--engine auto"):
        build_role(SERVED_IN_FULL, resources=["secrets", "events"], engine="in-tree")
    every = build_role(SERVED_IN_FULL, engine="in-tree", aggregated_groups=frozenset({"apps"}))
    assert every.resources == ["configmaps", "secrets"]
    assert "aggregated" in every.left_out["deployments.apps"] and "garbage collector" in every.left_out["events"]
    assert "gadgets.example.com" in every.left_out  # serves no delete, watch nor patch
    assert not any({"patch", "update"} & set(r["verbs"]) for r in every.manifest["items"][0]["rules"]
                   if set(r.get("apiGroups", [])) & {"", "apps", "example.com"})  # fmt: skip
    # auto: the client engine's verbs, and the in-tree objects' lifecycle too; client: not the latter.
    auto = build_role(SERVED_IN_FULL, resources=["secrets"], engine="auto").manifest["items"][0]["rules"]
    assert auto[0]["verbs"] == ["list", "patch"] and auto[-1] == IN_TREE_RULES[0].to_wire()
    client = build_role(SERVED_IN_FULL, resources=["secrets"]).manifest["items"][0]["rules"]
    assert IN_TREE_RULES[0].to_wire() not in client


def test_a_key_rotation_role_lists_and_patches_secrets_and_configmaps_only() -> None:
    built = build_role(DISCOVERED, resources=["secrets", "configmaps"])
    assert _rules(built) == [{"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["list", "patch"]}]
    assert built.resources == ["configmaps", "secrets"]
    role, binding, *_ = built.manifest["items"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "storage-migrator", "namespace": "storage-migrator"}
    ]


def test_update_only_where_the_resource_serves_no_patch() -> None:
    """DESIGN 4.5 / targets.py write_mode_for: merge patch where served, else PUT of the object as read."""
    built = build_role(DISCOVERED, resources=["widgets.example.com", "gadgets.example.com", "deployments.apps"])
    assert _rules(built) == [
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list", "patch"]},
        {"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["list", "patch"]},
        {"apiGroups": ["example.com"], "resources": ["gadgets"], "verbs": ["list", "patch", "update"]},
    ]
    for rule in _rules(build_role(DISCOVERED)):  # never get, create or delete on what is migrated
        assert set(rule["verbs"]) <= {"list", "patch", "update"}


def test_no_put_refuses_a_named_resource_that_needs_it_and_leaves_it_out_of_discovery() -> None:
    with pytest.raises(UnknownResource, match=r"gadgets\.example\.com serve\(s\) no patch.*--no-put"):
        build_role(DISCOVERED, resources=["secrets", "gadgets.example.com"], allow_put=False)
    built = build_role(DISCOVERED, allow_put=False)
    assert "gadgets.example.com" not in built.resources and "gadgets.example.com" in built.left_out
    assert all("update" not in r["verbs"] for r in _rules(built))


def test_without_a_list_every_resource_detection_tracks_grouped_by_api_group() -> None:
    built = build_role(DISCOVERED, exclude=["deployments.apps"], name="narrow", service_account=("ops", "migrator"))
    assert built.resources == ["configmaps", "gadgets.example.com", "secrets", "widgets.example.com"]
    assert [r["apiGroups"] for r in _rules(built)] == [[""], ["example.com"], ["example.com"]]
    role, binding, *_ = built.manifest["items"]
    assert role["metadata"]["name"] == binding["metadata"]["name"] == "narrow"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "migrator", "namespace": "ops"}]


def test_unknown_resources_are_refused_all_named() -> None:
    with pytest.raises(UnknownResource) as caught:
        build_role(DISCOVERED, resources=["secrets", "sekrets", "pods/status", "tokenreviews"])
    message = str(caught.value)
    assert "sekrets, pods/status, tokenreviews" in message
    assert "'<resource>.<group>' from: " in message and "widgets.example.com" in message
