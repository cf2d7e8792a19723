"""The patch formats kubesim applies: JSON merge patch, JSON patch, and a
strategic merge patch good enough for what kubectl sends.

Strategic merge patch is approximated: maps merge as in a merge patch, the
`$setElementOrder/`, `$retainKeys` and `$patch` directives kubectl adds are
honoured or dropped, and lists are replaced whole (kube-apiserver merges lists
with a patchMergeKey, e.g. containers by name). The closing note of issue 2
lists this gap.
"""

from __future__ import annotations

import copy
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


class PatchError(Exception):
    """The patch cannot be applied (bad document, failed `test`, bad path)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "delete":
        return None
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
    result = dict(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key.startswith("$"):
            continue  # $setElementOrder/..., $retainKeys, $deleteFromPrimitiveList/...
        if value is None:
            result.pop(key, None)
            continue
        merged = strategic_merge_patch(result.get(key), value)
        if merged is None:
            result.pop(key, None)
        else:
            result[key] = merged
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _container(doc: Any, parts: list[str]) -> Any:
    node = doc
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(f"path /{'/'.join(parts)} does not exist")
    return node


def _get(doc: Any, path: str) -> Any:
    return _container(doc, _pointer(path))


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent = _container(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise PatchError(f"path {path} does not exist")


def _add(doc: Any, path: str, value: Any, *, replace: bool) -> Any:
    parts = _pointer(path)
    if not parts:
        return copy.deepcopy(value)
    parent = _container(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError(f"path {path} does not exist")
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(copy.deepcopy(value))
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = copy.deepcopy(value)
            else:
                parent.insert(int(last), copy.deepcopy(value))
        else:
            raise PatchError(f"path {path} is out of range")
    else:
        raise PatchError(f"path {path} does not name a container")
    return doc


def _json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values: Python's `1 == True` is not JSON's (RFC 6902 4.6)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"invalid JSON patch operation {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, op.get("value"), replace=False)
        elif kind == "replace":
            doc = _add(doc, path, op.get("value"), replace=True)
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "test":
            if not _json_equal(_get(doc, path), op.get("value")):
                raise PatchError(f"test operation failed at {path}")
        elif kind in ("move", "copy"):
            value = _get(doc, op.get("from", ""))
            if kind == "move":
                _remove(doc, op.get("from", ""))
            doc = _add(doc, path, value, replace=False)
        else:
            raise PatchError(f"unknown JSON patch operation {kind!r}")
    return doc


def apply_patch(content_type: str, target: dict[str, Any], patch: Any) -> Any:
    if content_type == MERGE_PATCH:
        return merge_patch(target, patch)
    if content_type == STRATEGIC_MERGE_PATCH:
        return strategic_merge_patch(target, patch)
    if content_type == JSON_PATCH:
        return json_patch(target, patch)
    raise PatchError(f"unsupported patch type {content_type!r}")
