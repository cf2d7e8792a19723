"""Just enough OpenAPI v3 for kubectl's default (strict) validation.

kubectl asks `/openapi/v3` for the group-version document of the kind it sends,
and looks there for a PATCH operation of that kind that takes the
`fieldValidation` query parameter: when it finds one, it leaves validation to
the server and sends `fieldValidation=Strict`. kubesim declares the parameter
and does not validate fields (the closing note of issue 2 says so). The PATCH
operations list only JSON merge patch, so `kubectl apply` computes strategic
merge patches for built-ins from its compiled-in types, not from our schemas.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kubesim.resources import ResourceType

_FIELD_VALIDATION = {
    "name": "fieldValidation",
    "in": "query",
    "description": "how the server treats unknown or duplicate fields (kubesim accepts them)",
    "schema": {"type": "string", "uniqueItems": True},
}


def _gv_key(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _group_versions(types: list[ResourceType]) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    for rt in types:
        for v in rt.served_versions:
            if (rt.group, v) not in seen:
                seen.append((rt.group, v))
    return seen


def _gv_doc(types: list[ResourceType], group: str, version: str) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for rt in types:
        if rt.group != group or version not in rt.served_versions:
            continue
        gvk = {"group": group, "version": version, "kind": rt.kind}
        base = f"/{_gv_key(group, version)}"
        collection = f"{base}/namespaces/{{namespace}}/{rt.resource}" if rt.namespaced else f"{base}/{rt.resource}"
        ref = {"$ref": f"#/components/schemas/{rt.group or 'core'}.{version}.{rt.kind}"}
        schema = rt.crd_schemas.get(version) or {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        schemas[f"{rt.group or 'core'}.{version}.{rt.kind}"] = {
            **schema,
            "x-kubernetes-group-version-kind": [gvk],
        }
        op = {
            "x-kubernetes-group-version-kind": gvk,
            "parameters": [_FIELD_VALIDATION],
            "responses": {"200": {"content": {"application/json": {"schema": ref}}}},
        }
        body = {"content": {"application/json": {"schema": ref}}}
        paths[collection] = {"post": {**op, "requestBody": body}}
        if "create" in rt.verbs and rt.verbs == ["create"]:
            continue
        patch_body = {"content": {"application/merge-patch+json": {"schema": {"type": "object"}}}}
        paths[f"{collection}/{{name}}"] = {
            "put": {**op, "requestBody": body},
            "patch": {**op, "requestBody": patch_body},
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (kubesim)", "version": "v1.36.2"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def document(types: list[ResourceType], path: str) -> dict[str, Any] | None:
    if path.rstrip("/") == "/openapi/v3":
        index = {}
        for group, version in _group_versions(types):
            key = _gv_key(group, version)
            digest = hashlib.sha256(json.dumps(_gv_doc(types, group, version), sort_keys=True).encode()).hexdigest()
            index[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest[:32].upper()}"}
        return {"paths": index}
    if path.startswith("/openapi/v3/"):
        key = path[len("/openapi/v3/") :].strip("/")
        for group, version in _group_versions(types):
            if _gv_key(group, version) == key:
                return _gv_doc(types, group, version)
    return None
