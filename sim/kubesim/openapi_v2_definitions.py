"""The built-in definitions of kubesim's `/openapi/v2`: what kubectl's validation reads.

Full `ObjectMeta`/`ListMeta`, and typed fields for the kinds users write by hand
(ConfigMap, Secret, Namespace, ServiceAccount, RBAC's roles and bindings); the
document's builder (:mod:`kubesim.openapi_v2`) adds every served kind and the CRDs'.
Held to reference/openapi-v2-summary.txt by tests/unit/sim/test_kubesim_openapi.py.
"""

from __future__ import annotations

from typing import Any

META = "io.k8s.apimachinery.pkg.apis.meta.v1"
API_VERSION = {
    "description": "APIVersion defines the versioned schema of this representation of an object. Servers should "
    "convert recognized schemas to the latest internal value, and may reject unrecognized values.",
    "type": "string",
}
KIND = {
    "description": "Kind is a string value representing the REST resource this object represents.",
    "type": "string",
}
STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_INT64 = {"type": "integer", "format": "int64"}
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_STR_LIST = {"type": "array", "items": {"type": "string"}}
# Untyped: kubectl's validation accepts any value here (kube-openapi's Arbitrary).
ANY = {"description": "not modeled by kubesim: any value is accepted"}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/definitions/{name}"}


def meta_definitions() -> dict[str, dict[str, Any]]:
    time = {"description": "RFC 3339 date and time.", "type": "string", "format": "date-time"}
    return {
        f"{META}.Time": time,
        f"{META}.MicroTime": {**time, "description": "RFC 3339 date and time with microseconds."},
        f"{META}.FieldsV1": {"description": "FieldsV1 stores a set of fields in a trie.", "type": "object"},
        f"{META}.ManagedFieldsEntry": {
            "type": "object",
            "properties": {
                "apiVersion": STR,
                "fieldsType": STR,
                "fieldsV1": ref(f"{META}.FieldsV1"),
                "manager": STR,
                "operation": STR,
                "subresource": STR,
                "time": ref(f"{META}.Time"),
            },
        },
        f"{META}.OwnerReference": {
            "type": "object",
            "required": ["apiVersion", "kind", "name", "uid"],
            "properties": {
                "apiVersion": STR,
                "blockOwnerDeletion": _BOOL,
                "controller": _BOOL,
                "kind": STR,
                "name": STR,
                "uid": STR,
            },
            "x-kubernetes-map-type": "atomic",
        },
        f"{META}.ObjectMeta": {
            "description": "ObjectMeta is metadata that all persisted resources must have.",
            "type": "object",
            "properties": {
                "annotations": _STR_MAP,
                "creationTimestamp": ref(f"{META}.Time"),
                "deletionGracePeriodSeconds": _INT64,
                "deletionTimestamp": ref(f"{META}.Time"),
                "finalizers": _STR_LIST,
                "generateName": STR,
                "generation": _INT64,
                "labels": _STR_MAP,
                "managedFields": {"type": "array", "items": ref(f"{META}.ManagedFieldsEntry")},
                "name": STR,
                "namespace": STR,
                "ownerReferences": {"type": "array", "items": ref(f"{META}.OwnerReference")},
                "resourceVersion": STR,
                "selfLink": STR,
                "uid": STR,
            },
        },
        f"{META}.ListMeta": {
            "description": "ListMeta describes metadata that synthetic resources must have.",
            "type": "object",
            "properties": {"continue": STR, "remainingItemCount": _INT64, "resourceVersion": STR, "selfLink": STR},
        },
        "io.k8s.api.core.v1.ObjectReference": {
            "type": "object",
            "properties": {
                "apiVersion": STR,
                "fieldPath": STR,
                "kind": STR,
                "name": STR,
                "namespace": STR,
                "resourceVersion": STR,
                "uid": STR,
            },
            "x-kubernetes-map-type": "atomic",
        },
        "io.k8s.api.core.v1.LocalObjectReference": {
            "type": "object",
            "properties": {"name": STR},
            "x-kubernetes-map-type": "atomic",
        },
    }


_BYTES_MAP = {"type": "object", "additionalProperties": {"type": "string", "format": "byte"}}
_CORE_EVENT = ["action", "count", "eventTime", "firstTimestamp", "involvedObject", "lastTimestamp", "message"]
_CORE_EVENT += ["reason", "related", "reportingComponent", "reportingInstance", "series", "source", "type"]
_EVENTS_EVENT = ["action", "deprecatedCount", "deprecatedFirstTimestamp", "deprecatedLastTimestamp"]
_EVENTS_EVENT += ["deprecatedSource", "eventTime", "note", "reason", "regarding", "related"]
_EVENTS_EVENT += ["reportingController", "reportingInstance", "series", "type"]

RBAC = "io.k8s.api.rbac.v1"


def rbac_definitions() -> dict[str, dict[str, Any]]:
    """What `kubectl apply` of a ClusterRole and its binding is validated against (k8s.io/api rbac/v1)."""
    return {
        f"{RBAC}.PolicyRule": {
            "type": "object",
            "required": ["verbs"],
            "properties": {
                "apiGroups": _STR_LIST,
                "nonResourceURLs": _STR_LIST,
                "resourceNames": _STR_LIST,
                "resources": _STR_LIST,
                "verbs": _STR_LIST,
            },
        },
        f"{RBAC}.AggregationRule": {"type": "object", "properties": {"clusterRoleSelectors": ANY}},
        f"{RBAC}.Subject": {
            "type": "object",
            "required": ["kind", "name"],
            "properties": {"apiGroup": STR, "kind": STR, "name": STR, "namespace": STR},
            "x-kubernetes-map-type": "atomic",
        },
        f"{RBAC}.RoleRef": {
            "type": "object",
            "required": ["apiGroup", "kind", "name"],
            "properties": {"apiGroup": STR, "kind": STR, "name": STR},
            "x-kubernetes-map-type": "atomic",
        },
    }


_RULES = {"type": "array", "items": ref(f"{RBAC}.PolicyRule")}
_BINDING = {"roleRef": ref(f"{RBAC}.RoleRef"), "subjects": {"type": "array", "items": ref(f"{RBAC}.Subject")}}

# The fields of each built-in kind besides apiVersion, kind and metadata, as
# k8s.io/api v1.36 declares them; `ANY` where kubesim does not type them.
BUILTIN_FIELDS: dict[tuple[str, str], dict[str, Any]] = {
    ("", "ConfigMap"): {"binaryData": _BYTES_MAP, "data": _STR_MAP, "immutable": _BOOL},
    ("", "Secret"): {"data": _BYTES_MAP, "immutable": _BOOL, "stringData": _STR_MAP, "type": STR},
    ("", "Namespace"): {
        "spec": {"type": "object", "properties": {"finalizers": _STR_LIST}},
        "status": {"type": "object", "properties": {"conditions": ANY, "phase": STR}},
    },
    ("", "ServiceAccount"): {
        "automountServiceAccountToken": _BOOL,
        "imagePullSecrets": {"type": "array", "items": ref("io.k8s.api.core.v1.LocalObjectReference")},
        "secrets": {"type": "array", "items": ref("io.k8s.api.core.v1.ObjectReference")},
    },
    ("", "Event"): {name: ANY for name in _CORE_EVENT},
    ("", "Binding"): {"target": ref("io.k8s.api.core.v1.ObjectReference")},
    ("", "ComponentStatus"): {"conditions": ANY},
    ("events.k8s.io", "Event"): {name: ANY for name in _EVENTS_EVENT},
    ("rbac.authorization.k8s.io", "ClusterRole"): {"aggregationRule": ref(f"{RBAC}.AggregationRule"), "rules": _RULES},
    ("rbac.authorization.k8s.io", "Role"): {"rules": _RULES},
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"): _BINDING,
    ("rbac.authorization.k8s.io", "RoleBinding"): _BINDING,
}
#: Required fields of built-in kinds (kubectl refuses a file without them).
BUILTIN_REQUIRED: dict[tuple[str, str], list[str]] = {
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"): ["roleRef"],
    ("rbac.authorization.k8s.io", "RoleBinding"): ["roleRef"],
}

# Where k8s.io/api (and the two extension API servers) define each group's types.
PACKAGES = {
    "": "io.k8s.api.core",
    "apiextensions.k8s.io": "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions",
    "apiregistration.k8s.io": "io.k8s.kube-aggregator.pkg.apis.apiregistration",
    "internal.apiserver.k8s.io": "io.k8s.api.apiserverinternal",
}
