"""`/openapi/v2`: the swagger 2.0 document kubectl validates `kind: List` files with.

kubectl (v1.32 and v1.37 alike) validates a file client-side through
`/openapi/v2` when it cannot leave the job to the server: a `kind: List` has no
OpenAPI v3 operation taking `fieldValidation`, so kubectl fetches the v2
document, finds each item's kind through `x-kubernetes-group-version-kind` and
checks its fields (reference/README.md: `GET /openapi/v2` → 200, then one POST
per item). kubectl asks with `Accept: application/com.github.proto-openapi.spec.v2@v1.0+protobuf`
only and `proto.Unmarshal`s whatever comes back: a JSON body or a 406 makes it
refuse the file ("error validating data"), so kubesim answers that Accept with
the gnostic `openapi.v2.Document` protobuf, as kube-apiserver does, and anything
else with JSON.

Definitions carry what kubectl's validation reads: top-level properties of every
served kind (a field outside them is "unknown"), full `ObjectMeta`/`ListMeta`,
and typed fields for the kinds users write by hand (ConfigMap, Secret,
Namespace, ServiceAccount, and RBAC's roles and bindings: `storage-migrator rbac
| kubectl apply -f -`); nested parts of larger kinds (`spec`, `status`,
event sources) are left untyped, which kubectl accepts as anything. CRD kinds
are converted from `openAPIV3Schema` the way apiextensions-apiserver publishes
them in v2 (`ToStructuralOpenAPIV2` and `buildKubeNative`): junctors dropped,
nullable and preserve-unknown-fields subtrees left untyped, `metadata` a
reference to `ObjectMeta`, plus a `<Kind>List` definition.

The document follows the CRD set and is cached by it: `Registry.resource_types()`
hands out new `ResourceType` objects only when the CRDs change in etcd.
"""

from __future__ import annotations

import copy
import json
import struct
import threading
from typing import Any

from kubesim.openapi_v2_definitions import (
    ANY,
    API_VERSION,
    BUILTIN_FIELDS,
    BUILTIN_REQUIRED,
    KIND,
    META,
    PACKAGES,
    STR,
    meta_definitions,
    rbac_definitions,
    ref,
)
from kubesim.resources import ResourceType

PROTOBUF = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"


def definition_name(group: str, version: str, kind: str, *, custom: bool = False) -> str:
    """The definition name kube-apiserver gives a kind (`io.k8s.api.core.v1.ConfigMap`;
    a CRD's kind: reversed group, version, kind, `io.k8s.migration.v1alpha1.StorageVersionMigration`)."""
    if custom:
        return ".".join([*reversed(group.split(".")), version, kind])
    package = PACKAGES.get(group) or f"io.k8s.api.{group.split('.')[0]}"
    return f"{package}.{version}.{kind}"


def _gvk(group: str, version: str, kind: str) -> list[dict[str, str]]:
    return [{"group": group, "kind": kind, "version": version}]


def _with_type_meta(schema: dict[str, Any], metadata: str) -> dict[str, Any]:
    props = dict(schema.get("properties") or {})
    props.update(apiVersion=API_VERSION, kind=KIND, metadata=ref(metadata))
    return {**schema, "properties": dict(sorted(props.items()))}


def _list_definition(rt: ResourceType, version: str, item: str, list_kind: str) -> dict[str, Any]:
    schema = {
        "description": f"{list_kind} is a list of {rt.kind}",
        "type": "object",
        "required": ["items"],
        "properties": {"items": {"type": "array", "items": ref(item)}},
        "x-kubernetes-group-version-kind": _gvk(rt.group, version, list_kind),
    }
    return _with_type_meta(schema, f"{META}.ListMeta")


# ----- CRD schemas, as apiextensions-apiserver publishes them in v2 -----------------------


def _to_v2(s: dict[str, Any]) -> dict[str, Any]:
    """`ToStructuralOpenAPIV2`: what kubectl's v2 parser cannot cope with goes."""
    out = {k: v for k, v in s.items() if k not in ("allOf", "oneOf", "anyOf", "not", "nullable")}
    if s.get("nullable") or s.get("x-kubernetes-preserve-unknown-fields"):
        out.pop("items", None)
        out.pop("properties", None)
        if s.get("nullable"):
            out.pop("type", None)
    if "items" not in out and out.get("type") == "array":
        out.pop("type")
    props = out.get("properties")
    if isinstance(props, dict):
        nullable = {name for name, p in props.items() if isinstance(p, dict) and p.get("nullable")}
        if nullable and "required" in out:
            required = [r for r in out["required"] if r not in nullable]
            if required:
                out["required"] = required
            else:
                del out["required"]
        out["properties"] = {name: _to_v2(p) for name, p in props.items()}
    if isinstance(out.get("items"), dict):
        out["items"] = _to_v2(out["items"])
    extra = out.get("additionalProperties")
    if isinstance(extra, dict):
        if extra.get("nullable"):
            out.pop("required", None)
        out["additionalProperties"] = _to_v2(extra)
    if s.get("x-kubernetes-embedded-resource") and "properties" in out:
        out["properties"] = {"apiVersion": STR, "kind": STR, "metadata": {"type": "object"}, **out["properties"]}
    return out


def _crd_definition(rt: ResourceType, version: str) -> dict[str, Any]:
    """`buildKubeNative` with `V2: true`."""
    schema = rt.crd_schemas.get(version) or {}
    if not schema or schema.get("x-kubernetes-preserve-unknown-fields"):
        out: dict[str, Any] = {"type": "object"}
    else:
        out = _with_type_meta(_to_v2(schema), f"{META}.ObjectMeta")
    out["x-kubernetes-group-version-kind"] = _gvk(rt.group, version, rt.kind)
    return out


# ----- the document --------------------------------------------------------------------------


def _paths(rt: ResourceType, version: str, name: str) -> dict[str, Any]:
    base = f"/apis/{rt.group}/{version}" if rt.group else f"/api/{version}"
    collection = f"{base}/namespaces/{{namespace}}/{rt.resource}" if rt.namespaced else f"{base}/{rt.resource}"
    op = {
        "operationId": f"create{rt.kind}",
        "parameters": [{"name": "body", "in": "body", "required": True, "schema": ref(name)}],
        "responses": {"201": {"description": "Created", "schema": ref(name)}},
        "x-kubernetes-action": "post",
        "x-kubernetes-group-version-kind": _gvk(rt.group, version, rt.kind)[0],
    }
    return {collection: {"post": op}}


def build(types: list[ResourceType], *, server_version: str = "1.36") -> dict[str, Any]:
    definitions = {**meta_definitions(), **rbac_definitions()}
    paths: dict[str, Any] = {}
    for rt in types:
        for version in rt.served_versions:
            name = definition_name(rt.group, version, rt.kind, custom=rt.is_custom)
            if rt.is_custom:
                definitions[name] = _crd_definition(rt, version)
            else:
                fields = copy.deepcopy(BUILTIN_FIELDS.get((rt.group, rt.kind), {"spec": ANY, "status": ANY}))
                schema: dict[str, Any] = {"type": "object", "properties": fields}
                if (rt.group, rt.kind) in BUILTIN_REQUIRED:
                    schema["required"] = BUILTIN_REQUIRED[(rt.group, rt.kind)]
                definitions[name] = {
                    **_with_type_meta(schema, f"{META}.ObjectMeta"),
                    "x-kubernetes-group-version-kind": _gvk(rt.group, version, rt.kind),
                }
            if "list" in rt.verbs:
                definitions[f"{name}List"] = _list_definition(rt, version, name, f"{rt.kind}List")
            if "create" in rt.verbs:
                paths.update(_paths(rt, version, name))
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": server_version},
        "paths": dict(sorted(paths.items())),
        "definitions": dict(sorted(definitions.items())),
        "parameters": {},
        "securityDefinitions": {"BearerToken": {"type": "apiKey", "name": "authorization", "in": "header"}},
        "security": [{"BearerToken": []}],
    }


_cache_lock = threading.Lock()
_cache: dict[str, Any] = {}


def _signature(types: list[ResourceType]) -> tuple[Any, ...]:
    # A CRD change gives new ResourceType objects (Registry.refresh_crds); the
    # cache keeps `types` alive, so an id cannot be reused while it is cached.
    return tuple((rt.group, rt.kind, tuple(rt.served_versions), tuple(rt.verbs), id(rt.crd_schemas)) for rt in types)


def document(types: list[ResourceType]) -> dict[str, Any]:
    return _cached(types)[0]


def protobuf(types: list[ResourceType]) -> bytes:
    return _cached(types)[1]


def _cached(types: list[ResourceType]) -> tuple[dict[str, Any], bytes]:
    key = _signature(types)
    with _cache_lock:
        if _cache.get("key") != key:
            doc = build(types)
            _cache.update(key=key, types=list(types), doc=doc, pb=encode_document(doc))
        return _cache["doc"], _cache["pb"]


def wants_protobuf(accept: str) -> bool:
    """kube-openapi's negotiation: the protobuf type when asked for (first), else JSON."""
    for part in accept.split(","):
        media = part.split(";")[0].strip()
        if media in (PROTOBUF, "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"):
            return True
        if media in ("application/json", "*/*", "application/*"):
            return False
    return False


# ----- gnostic openapi.v2 protobuf (github.com/google/gnostic-models openapiv2/OpenAPIv2.proto) -----


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _string(field: int, value: str) -> bytes:
    return _len(field, value.encode()) if value else b""


def _bool(field: int, value: bool) -> bytes:
    return _varint(field << 3) + b"\x01" if value else b""


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value) if value else b""


def _double(field: int, value: float) -> bytes:
    return _varint(field << 3 | 1) + struct.pack("<d", value)


def _any(value: Any) -> bytes:
    # openapi.v2.Any {yaml = 2}; JSON is YAML, and kube-openapi reads it with a YAML parser.
    return _string(2, json.dumps(value))


def _named_any(field: int, name: str, value: Any) -> bytes:
    return _len(field, _string(1, name) + _len(2, _any(value)))


def _extensions(field: int, obj: dict[str, Any]) -> bytes:
    return b"".join(_named_any(field, k, v) for k, v in obj.items() if k.startswith("x-"))


def encode_schema(s: dict[str, Any]) -> bytes:
    """openapi.v2.Schema, for the keywords kubesim's documents use."""
    out = _string(1, s.get("$ref", "")) + _string(2, s.get("format", "")) + _string(3, s.get("title", ""))
    out += _string(4, s.get("description", ""))
    if "default" in s:
        out += _len(5, _any(s["default"]))
    for field, key in ((6, "multipleOf"), (7, "maximum"), (9, "minimum")):
        if key in s:
            out += _double(field, float(s[key]))
    out += _bool(8, bool(s.get("exclusiveMaximum"))) + _bool(10, bool(s.get("exclusiveMinimum")))
    for field, key in ((11, "maxLength"), (12, "minLength"), (14, "maxItems"), (15, "minItems")):
        out += _int(field, int(s.get(key, 0)))
    out += _string(13, s.get("pattern", "")) + _bool(16, bool(s.get("uniqueItems")))
    out += _int(17, int(s.get("maxProperties", 0))) + _int(18, int(s.get("minProperties", 0)))
    out += b"".join(_string(19, r) for r in s.get("required", []))
    out += b"".join(_len(20, _any(v)) for v in s.get("enum", []))
    extra = s.get("additionalProperties")
    if isinstance(extra, dict):
        out += _len(21, _len(1, encode_schema(extra)))
    elif isinstance(extra, bool):
        out += _len(21, _varint(2 << 3) + (b"\x01" if extra else b"\x00"))
    if "type" in s:
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        out += _len(22, b"".join(_string(1, t) for t in types))
    if isinstance(s.get("items"), dict):
        out += _len(23, _len(1, encode_schema(s["items"])))
    out += b"".join(_len(24, encode_schema(sub)) for sub in s.get("allOf", []))
    if "properties" in s:
        props = b"".join(_len(1, _string(1, k) + _len(2, encode_schema(v))) for k, v in s["properties"].items())
        out += _len(25, props)
    return out + _extensions(31, s)


def _encode_operation(op: dict[str, Any]) -> bytes:
    return _string(5, op.get("operationId", "")) + _extensions(13, op)


def encode_document(doc: dict[str, Any]) -> bytes:
    """openapi.v2.Document: swagger, info, paths (operations without parameters), definitions."""
    info = _string(1, doc["info"]["title"]) + _string(2, doc["info"]["version"])
    methods = {"get": 2, "put": 3, "post": 4, "delete": 5, "patch": 8}
    paths = b""
    for path, item in doc["paths"].items():
        ops = b"".join(_len(methods[m], _encode_operation(op)) for m, op in item.items() if m in methods)
        paths += _len(2, _string(1, path) + _len(2, ops))
    definitions = b"".join(
        _len(1, _string(1, name) + _len(2, encode_schema(schema))) for name, schema in doc["definitions"].items()
    )
    return _string(1, doc["swagger"]) + _len(2, info) + _len(8, paths) + _len(9, definitions)
