"""The discovery documents, shaped like reference/discovery-*.json.

Every persisted resource carries the `storageVersionHash` of its storage
group/version/kind (shared storage shares the hash); sub-resources and virtual
resources carry none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kubesim.resources import ResourceType, sort_versions

KUBE_VERSION = {"major": "1", "minor": "36", "gitVersion": "v1.36.2-kubesim", "platform": "linux/amd64"}
_CRD_VERBS = ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"]


def _resource_entry(rt: ResourceType) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": rt.resource,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": list(_CRD_VERBS if rt.is_custom else rt.verbs),
    }
    if rt.short_names:
        entry["shortNames"] = list(rt.short_names)
    if rt.categories:
        entry["categories"] = list(rt.categories)
    hash_ = rt.hash_for(rt.storage_version)
    if hash_:
        entry["storageVersionHash"] = hash_
    return entry


def _subresource_entry(rt: ResourceType, sub: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": f"{rt.resource}/{sub}", "singularName": "", "namespaced": rt.namespaced}
    if sub == "scale":
        entry.update({"group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]})
    elif sub == "finalize":
        entry.update({"kind": rt.kind, "verbs": ["update"]})
    else:
        entry.update({"kind": rt.kind, "verbs": ["get", "patch", "update"]})
    return entry


def resource_list(types: list[ResourceType], group: str, version: str) -> dict[str, Any] | None:
    served = [rt for rt in types if rt.group == group and version in rt.served_versions]
    if not served:
        return None
    resources: list[dict[str, Any]] = []
    for rt in sorted(served, key=lambda r: r.resource):
        resources.append(_resource_entry(rt))
        resources.extend(_subresource_entry(rt, sub) for sub in sorted(rt.subresources))
    doc: dict[str, Any] = {"kind": "APIResourceList"}
    if group:
        doc["apiVersion"] = "v1"
    doc["groupVersion"] = f"{group}/{version}" if group else version
    doc["resources"] = resources
    return doc


def _group_versions(types: list[ResourceType], extra: Sequence[tuple[str, str]] = ()) -> dict[str, list[str]]:
    """Group -> served versions, newest first; `extra` adds (group, version) pairs of aggregated APIs."""
    pairs = [(rt.group, v) for rt in types for v in rt.served_versions] + list(extra)
    groups: dict[str, list[str]] = {}
    for group, version in pairs:
        versions = groups.setdefault(group, [])
        if version not in versions:
            versions.append(version)
    return {g: sort_versions(vs) for g, vs in groups.items()}


def api_group(types: list[ResourceType], group: str, extra: Sequence[tuple[str, str]] = ()) -> dict[str, Any] | None:
    versions = _group_versions(types, extra).get(group)
    if not group or not versions:
        return None
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
        "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]},
    }


# The order of /apis on a real kube-apiserver (reference/discovery-apis.json): the
# aggregator sorts groups by priority, and clients resolve a resource name served
# by two groups to the first. CRD groups come after the built-ins, by name.
_BUILTIN_GROUP_ORDER = [
    "apiregistration.k8s.io", "apps", "events.k8s.io", "authentication.k8s.io", "authorization.k8s.io",
    "autoscaling", "batch", "certificates.k8s.io", "networking.k8s.io", "policy", "rbac.authorization.k8s.io",
    "storage.k8s.io", "admissionregistration.k8s.io", "apiextensions.k8s.io", "scheduling.k8s.io",
    "coordination.k8s.io", "node.k8s.io", "discovery.k8s.io", "resource.k8s.io", "flowcontrol.apiserver.k8s.io",
    "internal.apiserver.k8s.io", "storagemigration.k8s.io",
]  # fmt: skip


def _group_order(group: str) -> tuple[int, str]:
    if group in _BUILTIN_GROUP_ORDER:
        return (_BUILTIN_GROUP_ORDER.index(group), "")
    return (len(_BUILTIN_GROUP_ORDER), group)


def api_group_list(types: list[ResourceType], extra: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    groups = []
    for group in sorted(_group_versions(types, extra), key=_group_order):
        doc = api_group(types, group, extra)
        if doc is not None:
            groups.append({k: v for k, v in doc.items() if k not in ("kind", "apiVersion")})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }
