"""Each API server publishes the version it encodes every built-in resource in
through the StorageVersion API, as kube-apiserver does with the
`StorageVersionAPI` feature gate (seed 001, as shipped: reference/README.md).

Objects are named `<group>.<resource>` with `core` for the core group;
`status.storageVersions[]` holds one `{apiServerID, encodingVersion,
decodableVersions, servedVersions}` per server, `status.commonEncodingVersion`
is set only while they all agree, and the `AllEncodingVersionsEqual` condition
says whether they do. Custom resources have none (as on v1.36).
"""

from __future__ import annotations

from typing import Any

from kubesim.errors import StatusError
from kubesim.registry import Registry, now_rfc3339, storage_group_resource
from kubesim.resources import ResourceType, sort_versions

GROUP = "internal.apiserver.k8s.io"
VERSION = "v1alpha1"


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


def publish(registry: Registry, *, withdraw: bool = False) -> None:
    """Record (or, when the server stops, remove) this server's encoding versions."""
    types = {storage_group_resource(rt): rt for rt in registry.builtin_types() if not rt.virtual}
    sv_type = next(rt for rt in registry.builtin_types() if rt.group == GROUP and rt.resource == "storageversions")
    server_id = registry.config.server_id
    for rt in types.values():
        name = object_name(rt)

        def mutate(current: dict[str, Any], rt: ResourceType = rt) -> dict[str, Any]:
            old = current.get("status") or {}
            entries = [e for e in old.get("storageVersions") or [] if e.get("apiServerID") != server_id]
            if not withdraw:
                entries.append(_entry(rt, server_id))
            entries.sort(key=lambda e: str(e.get("apiServerID")))
            current["status"] = _status(entries, old)
            return current

        try:
            registry.update(sv_type, VERSION, None, name, mutate, subresource="status", manager="kube-apiserver")
            continue
        except StatusError as exc:
            if exc.code != 404 or withdraw:
                if exc.code == 404:
                    continue
                raise
        try:
            registry.create(sv_type, VERSION, None, {"metadata": {"name": name}, "spec": {}}, manager="kube-apiserver")
        except StatusError as exc:
            if exc.code != 409:  # another server created it first
                raise
        registry.update(sv_type, VERSION, None, name, mutate, subresource="status", manager="kube-apiserver")
