"""`metadata.managedFields` entries (FieldsV1) for the writes kubesim stores, as an
Update operation records them."""

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


def managed_fields_entry(obj: dict[str, Any], *, manager: str, api_version: str) -> dict[str, Any]:
    tracked: dict[str, Any] = {}
    meta = obj.get("metadata") or {}
    meta_fields = {k: meta[k] for k in ("labels", "annotations", "finalizers") if k in meta}
    if meta_fields:
        tracked["f:metadata"] = {f"f:{k}": _fields_v1(v) for k, v in meta_fields.items()}
    for key, value in obj.items():
        if key not in ("apiVersion", "kind", "metadata", "status"):
            tracked[f"f:{key}"] = _fields_v1(value)
    return {
        "manager": manager,
        "operation": "Update",
        "apiVersion": api_version,
        "time": now_rfc3339(),
        "fieldsType": "FieldsV1",
        "fieldsV1": tracked,
    }
