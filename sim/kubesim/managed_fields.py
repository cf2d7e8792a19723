"""`metadata.managedFields` entries (FieldsV1) for the writes kubesim stores, as an
Update operation records them.

A write through a subresource (`/status`) is an entry of its own, as kube-apiserver keeps
one per manager, operation and subresource: `"subresource": "status"`, tracking `f:status`
only; a write of the main resource tracks everything but the status.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fields_v1(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        return {}
    out: dict[str, Any] = {".": {}} if value else {}
    for key, sub in value.items():
        out[f"f:{key}"] = _fields_v1(sub)
    return out


def managed_fields_entry(
    obj: dict[str, Any], *, manager: str, api_version: str, subresource: str | None = None
) -> dict[str, Any]:
    tracked: dict[str, Any] = {}
    if subresource == "status":
        tracked["f:status"] = _fields_v1(obj.get("status"))
    else:
        meta = obj.get("metadata") or {}
        meta_fields = {k: meta[k] for k in ("labels", "annotations", "finalizers") if k in meta}
        if meta_fields:
            tracked["f:metadata"] = {f"f:{k}": _fields_v1(v) for k, v in meta_fields.items()}
        for key, value in obj.items():
            if key not in ("apiVersion", "kind", "metadata", "status"):
                tracked[f"f:{key}"] = _fields_v1(value)
    entry = {
        "manager": manager,
        "operation": "Update",
        "apiVersion": api_version,
        "time": now_rfc3339(),
        "fieldsType": "FieldsV1",
        "fieldsV1": tracked,
    }
    if subresource:
        entry["subresource"] = subresource
    return entry


def _without_volatile(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in ("resourceVersion", "managedFields")}
    return {**obj, "metadata": meta}


def fix_managed_fields(
    new: dict[str, Any], current: dict[str, Any], manager: str, subresource: str | None = None
) -> None:
    """An update's entries: the manager's own (for that subresource) replaced, or, when nothing else
    changed, the current ones kept."""
    meta = new["metadata"]
    old_entries = current["metadata"].get("managedFields")
    if "managedFields" not in meta and old_entries is not None:
        meta["managedFields"] = old_entries
    if _without_volatile(new) == _without_volatile(current):
        meta["managedFields"] = old_entries  # nothing changed: keep the timestamps as they were
        if old_entries is None:
            meta.pop("managedFields", None)
        return
    entries = [
        e
        for e in (meta.get("managedFields") or [])
        if (e.get("manager"), e.get("subresource")) != (manager, subresource or None)
    ]
    entries.append(managed_fields_entry(new, manager=manager, api_version=new["apiVersion"], subresource=subresource))
    meta["managedFields"] = entries
