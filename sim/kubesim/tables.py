"""Server-side tables (`Accept: ...;as=Table;g=meta.k8s.io;v=v1`), what kubectl
get prints: a CRD's `additionalPrinterColumns`, or Name and Created At."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from kubesim.resources import ResourceType

_FILTER = re.compile(r'^\[\?\(@\.([A-Za-z0-9_.]+)\s*==\s*["\']([^"\']*)["\']\)\]')


def _walk(value: Any, path: str) -> Any:
    """A small JSONPath: `.a.b`, `[0]`, `[*]`, and `[?(@.type=="Ready")]`."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    node: list[Any] = [value]
    rest = path
    while rest:
        if rest.startswith("."):
            m = re.match(r"^\.([A-Za-z0-9_-]+)", rest)
            if not m:
                return None
            node = [n.get(m.group(1)) for n in node if isinstance(n, dict) and m.group(1) in n]
            rest = rest[m.end() :]
        elif rest.startswith("[?"):
            m = _FILTER.match(rest)
            if not m:
                return None
            key_path, want = m.group(1), m.group(2)
            out = []
            for n in node:
                for item in n if isinstance(n, list) else []:
                    if str(_walk(item, "." + key_path)) == want:
                        out.append(item)
            node = out
            rest = rest[m.end() :]
        elif rest.startswith("["):
            m = re.match(r"^\[(\d+|\*)\]", rest)
            if not m:
                return None
            if m.group(1) == "*":
                node = [x for n in node if isinstance(n, list) for x in n]
            else:
                i = int(m.group(1))
                node = [n[i] for n in node if isinstance(n, list) and len(n) > i]
            rest = rest[m.end() :]
        else:
            return None
    if not node:
        return None
    return node[0] if len(node) == 1 else node


def _columns(rt: ResourceType) -> list[dict[str, Any]]:
    name = {"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a "
            "namespace.", "priority": 0}  # fmt: skip
    custom = rt.crd_printer_columns.get(rt.storage_version) or next(iter(rt.crd_printer_columns.values()), [])
    if rt.is_custom and custom:
        cols = [name]
        for c in custom:
            cols.append({
                "name": c.get("name", ""),
                "type": c.get("type", "string"),
                "format": c.get("format", ""),
                "description": c.get("description", ""),
                "priority": int(c.get("priority", 0)),
            })  # fmt: skip
        return cols
    created = {"name": "Created At", "type": "date", "format": "", "description": "CreationTimestamp is a timestamp "
               "representing the server time when this object was created.", "priority": 0}  # fmt: skip
    return [name, created]


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration, which CRD `date` columns are shown in."""
    s = int(seconds)  # Go's int(d.Seconds()) truncates toward zero: -1.5s is "0s"
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = s // 3600
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if h < 24 * 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if h < 24 * 365 * 2:
        return f"{d}d"
    y = d // 365
    if h < 24 * 365 * 8:
        return f"{y}y{d % 365}d" if d % 365 else f"{y}y"
    return f"{y}y"


def _cell(obj: dict[str, Any], column: dict[str, Any]) -> Any:
    value = _walk(obj, column.get("jsonPath", ""))
    if column.get("type") == "date" and isinstance(value, str):
        try:
            then = datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        except ValueError:
            return value
        return human_duration((datetime.now(UTC) - then).total_seconds())
    return value


def _cells(rt: ResourceType, obj: dict[str, Any]) -> list[Any]:
    meta = obj.get("metadata") or {}
    custom = rt.crd_printer_columns.get(rt.storage_version) or next(iter(rt.crd_printer_columns.values()), [])
    if rt.is_custom and custom:
        return [meta.get("name")] + [_cell(obj, c) for c in custom]
    return [meta.get("name"), meta.get("creationTimestamp")]


def to_table(rt: ResourceType, items: list[dict[str, Any]], *, include: str = "Metadata") -> dict[str, Any]:
    rows = []
    for obj in items:
        row: dict[str, Any] = {"cells": _cells(rt, obj)}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": obj.get("metadata", {})}  # fmt: skip
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {}, "columnDefinitions": _columns(rt),
            "rows": rows}  # fmt: skip
