"""Each API server publishes the version it encodes every built-in resource in
through the StorageVersion API, as kube-apiserver does with the
`StorageVersionAPI` feature gate (seed 001, as shipped: reference/README.md).

Objects are named `<group>.<resource>` with `core` for the core group;
`status.storageVersions[]` holds one `{apiServerID, encodingVersion,
decodableVersions, servedVersions}` per server, `status.commonEncodingVersion`
is set only while they all agree, and the `AllEncodingVersionsEqual` condition
says whether they do. Custom resources have none (as on v1.36).

Only servers with the `StorageVersionAPI` gate publish; entries of servers that
are gone are removed by `prune`, the storageversiongc controller's rule, once
their identity lease is gone (sim/kubesim/leases.py).
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from typing import Any

from kubesim.errors import StatusError
from kubesim.managed_fields import now_rfc3339
from kubesim.registry import Registry, storage_group_resource
from kubesim.resources import STORAGE_VERSION_API_GATE, ResourceType, builtin_resources, sort_versions

GROUP = "internal.apiserver.k8s.io"
VERSION = "v1alpha1"
#: The field manager of the garbage collector's writes (it runs in kube-controller-manager).
GC_MANAGER = "kube-controller-manager"


def object_name(rt: ResourceType) -> str:
    return f"{rt.stored_group or 'core'}.{rt.storage_resource or rt.resource}"


def _entry(rt: ResourceType, server_id: str) -> dict[str, Any]:
    encoding = rt.stored_api_version(rt.storage_version)
    versions = sort_versions(list({*rt.served_versions, rt.storage_version}))
    decodable = [rt.stored_api_version(v) for v in versions]
    return {
        "apiServerID": server_id,
        "encodingVersion": encoding,
        "decodableVersions": decodable,
        "servedVersions": [rt.group_version(v) for v in sort_versions(rt.served_versions)],
    }


def _status(entries: list[dict[str, Any]], old: dict[str, Any]) -> dict[str, Any]:
    encodings = {e["encodingVersion"] for e in entries}
    agreed = len(encodings) == 1
    prior = next((c for c in old.get("conditions") or [] if c.get("type") == "AllEncodingVersionsEqual"), None)
    status = "True" if agreed else "False"
    condition = {
        "type": "AllEncodingVersionsEqual",
        "status": status,
        "lastTransitionTime": (
            prior["lastTransitionTime"] if prior and prior.get("status") == status else now_rfc3339()
        ),
        "reason": "CommonEncodingVersionSet" if agreed else "CommonEncodingVersionUnset",
        "message": "Common encoding version set" if agreed else "Common encoding version unset",
    }
    doc: dict[str, Any] = {"storageVersions": entries}
    if agreed:
        doc["commonEncodingVersion"] = next(iter(encodings))
    doc["conditions"] = [condition]
    return doc


def storage_version_type() -> ResourceType:
    """The StorageVersion type, served or not: a server with the gate off still withdraws."""
    return next(rt for rt in builtin_resources() if rt.group == GROUP and rt.resource == "storageversions")


def _entries(sv: dict[str, Any]) -> list[dict[str, Any]]:
    return list((sv.get("status") or {}).get("storageVersions") or [])


def _read(registry: Registry, sv_type: ResourceType, name: str) -> dict[str, Any] | None:
    try:
        return registry.get(sv_type, VERSION, None, name)
    except StatusError as exc:
        if exc.code != 404:
            raise
        return None


def publish(registry: Registry, *, withdraw: bool = False, only: Collection[str] | None = None) -> None:
    """Make this server's entries say what it encodes now.

    With the `StorageVersionAPI` gate on: one entry per built-in it stores, and
    none where it no longer serves the resource (a gate turned off). With the
    gate off, or `withdraw`: none at all (kubesim's stand-in for turning the API
    off; a real server needs a restart, and its old entries stay until the
    garbage collector removes them, sim/kubesim/leases.py). `only`: the objects
    (`object_name`) of what changed, e.g. the one resource whose storage version
    was set; the others are left as they are.

    An object whose status would not change is not written (issue 29: the test
    harness puts every storage version back after each test, and a no-op update of
    each object cost two etcd round trips).
    """
    sv_type = storage_version_type()
    server_id = registry.config.server_id
    wanted: dict[str, dict[str, Any]] = {}
    if not withdraw and STORAGE_VERSION_API_GATE in registry.config.feature_gates:
        types = {storage_group_resource(rt): rt for rt in registry.builtin_types() if not rt.virtual}
        wanted = {object_name(rt): _entry(rt, server_id) for rt in types.values()}
    if only is None:
        listed = {sv["metadata"]["name"]: sv for sv in registry.list(sv_type, VERSION, None).items}
    else:
        listed = {name: sv for name in only if (sv := _read(registry, sv_type, name)) is not None}
        wanted = {name: entry for name, entry in wanted.items() if name in only}
    mine = {name for name, sv in listed.items() if any(e.get("apiServerID") == server_id for e in _entries(sv))}
    for name in sorted(set(wanted) | mine):
        entry = wanted.get(name)

        def mutate(current: dict[str, Any], entry: dict[str, Any] | None = entry) -> dict[str, Any]:
            old = current.get("status") or {}
            entries = [e for e in _entries(current) if e.get("apiServerID") != server_id]
            if entry is not None:
                entries.append(entry)
            entries.sort(key=lambda e: str(e.get("apiServerID")))
            current["status"] = _status(entries, old)
            return current

        seen = listed.get(name)
        if seen is not None and mutate(copy.deepcopy(seen))["status"] == seen.get("status"):
            continue  # already says so
        try:
            registry.update(sv_type, VERSION, None, name, mutate, subresource="status", manager="kube-apiserver")
            continue
        except StatusError as exc:
            if exc.code != 404:
                raise
        if entry is None:
            continue
        try:
            registry.create(sv_type, VERSION, None, {"metadata": {"name": name}, "spec": {}}, manager="kube-apiserver")
        except StatusError as exc:
            if exc.code != 409:  # another server created it first
                raise
        registry.update(sv_type, VERSION, None, name, mutate, subresource="status", manager="kube-apiserver")


def prune(registry: Registry, live: Collection[str]) -> list[str]:
    """storageversiongc: remove the entries of API servers not in `live`; the names of the objects changed.

    kube-controller-manager's storageversiongc controller (pkg/controller/storageversiongc):
    an entry whose apiServerID has no identity lease is dropped, the common
    encoding version and its condition are recomputed (SetCommonEncodingVersion),
    and an object left with no entry is deleted (seed 001, "Garbage collection":
    "if empty, deletes the storageVersion object ... otherwise updates", both
    preconditioned on the resourceVersion read). A conflict is left for the next pass.
    """
    sv_type = storage_version_type()
    changed = []
    for sv in registry.list(sv_type, VERSION, None).items:
        name, rv = sv["metadata"]["name"], sv["metadata"]["resourceVersion"]
        kept = [e for e in _entries(sv) if e.get("apiServerID") in live]
        if len(kept) == len(_entries(sv)):
            continue

        def mutate(current: dict[str, Any], rv: str = rv, kept: list[dict[str, Any]] = kept) -> dict[str, Any]:
            current["metadata"]["resourceVersion"] = rv  # the precondition: the object we judged
            current["status"] = _status(kept, current.get("status") or {})
            return current

        try:
            if kept:
                registry.update(sv_type, VERSION, None, name, mutate, subresource="status", manager=GC_MANAGER)
            else:
                registry.delete(sv_type, VERSION, None, name, preconditions={"resourceVersion": rv})
        except StatusError as exc:
            if exc.code not in (404, 409):
                raise
            continue
        changed.append(name)
    return changed
