"""kubesim's `/openapi/v2` document, held to reference/openapi-v2-summary.txt."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import yaml
from recorded import REFERENCE

from kubesim import openapi_v2
from kubesim.protobuf import fields
from kubesim.resources import ResourceType, builtin_resources, resource_from_crd

ROOT = Path(__file__).resolve().parents[3]
SUMMARY = REFERENCE / "openapi-v2-summary.txt"
CRD_DIR = ROOT / "deployments" / "crds"


def crd_types() -> list[ResourceType]:
    out = []
    for path in sorted(CRD_DIR.glob("*.yaml")):
        rt = resource_from_crd(yaml.safe_load(path.read_text()))
        assert rt is not None
        out.append(rt)
    return out


def widget(group: str = "example.com") -> ResourceType:
    schema = {
        "type": "object",
        "properties": {
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "required": ["size", "note"],
                "properties": {
                    "size": {"type": "integer", "anyOf": [{"minimum": 1}]},
                    "note": {"type": "string", "nullable": True},
                    "blob": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {"a": {}}},
                    "tags": {"type": "array", "x-kubernetes-preserve-unknown-fields": True, "items": {}},
                },
            },
        },
    }
    crd = {
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "names": {"plural": "widgets", "kind": "Widget"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}],
        },
    }
    rt = resource_from_crd(crd)
    assert rt is not None
    return rt


def gvks(doc: dict[str, Any]) -> dict[tuple[str, str, str], str]:
    out = {}
    for name, schema in doc["definitions"].items():
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            out[(gvk["group"], gvk["version"], gvk["kind"])] = name
    return out


def test_matches_the_reference_summary() -> None:
    """Top-level keys, swagger, info, and ConfigMap's properties and GVK as a
    real v1.36 server serves them (reference/openapi-v2-summary.txt)."""
    text = SUMMARY.read_text()
    keys = ast.literal_eval(re.search(r"top-level keys: (\[.*\])", text).group(1))  # type: ignore[union-attr]
    info = ast.literal_eval(re.search(r"info: (\{.*\})", text).group(1))  # type: ignore[union-attr]
    props = ast.literal_eval(re.search(r"properties: (\[.*\])", text).group(1))  # type: ignore[union-attr]
    doc = openapi_v2.build(builtin_resources())
    assert list(doc) == keys
    assert doc["swagger"] == "2.0" and "swagger: 2.0" in text
    assert doc["info"] == info
    cm = doc["definitions"]["io.k8s.api.core.v1.ConfigMap"]
    assert sorted(cm["properties"]) == props
    assert cm["type"] == "object"
    assert cm["x-kubernetes-group-version-kind"] == [{"group": "", "kind": "ConfigMap", "version": "v1"}]


def test_every_served_kind_has_a_definition_with_its_gvk() -> None:
    types = builtin_resources() + crd_types()
    doc = openapi_v2.build(types)
    found = gvks(doc)
    for rt in types:
        for version in rt.served_versions:
            assert (rt.group, version, rt.kind) in found, rt.kind
            if "list" in rt.verbs:
                assert (rt.group, version, f"{rt.kind}List") in found, rt.kind
    assert found[("", "v1", "ConfigMap")] == "io.k8s.api.core.v1.ConfigMap"
    assert found[("apps", "v1", "Deployment")] == "io.k8s.api.apps.v1.Deployment"
    assert found[("events.k8s.io", "v1", "Event")] == "io.k8s.api.events.v1.Event"
    assert found[("apiextensions.k8s.io", "v1", "CustomResourceDefinition")] == (
        "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition"
    )
    assert found[("migration.k8s.io", "v1alpha1", "StorageVersionMigration")] == (
        "io.k8s.migration.v1alpha1.StorageVersionMigration"
    )
    # every reference resolves
    refs = set(re.findall(r'"#/definitions/([^"]+)"', str(doc).replace("'", '"')))
    assert refs <= set(doc["definitions"])
    assert {f"{openapi_v2.META}.ObjectMeta", f"{openapi_v2.META}.ListMeta"} <= refs


def test_crd_schema_is_converted_as_kube_apiserver_publishes_it_in_v2() -> None:
    doc = openapi_v2.build([widget()])
    w = doc["definitions"]["com.example.v1.Widget"]
    assert w["properties"]["metadata"] == {"$ref": f"#/definitions/{openapi_v2.META}.ObjectMeta"}
    assert w["properties"]["apiVersion"]["type"] == w["properties"]["kind"]["type"] == "string"
    spec = w["properties"]["spec"]
    assert spec["required"] == ["size"]  # nullable fields are not required in v2
    assert spec["properties"]["size"] == {"type": "integer"}  # junctors dropped
    assert spec["properties"]["note"] == {}  # nullable: untyped
    assert spec["properties"]["blob"] == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert spec["properties"]["tags"] == {"x-kubernetes-preserve-unknown-fields": True}  # array without items
    lst = doc["definitions"]["com.example.v1.WidgetList"]
    assert lst["properties"]["items"]["items"] == {"$ref": "#/definitions/com.example.v1.Widget"}
    assert lst["properties"]["metadata"] == {"$ref": f"#/definitions/{openapi_v2.META}.ListMeta"}


def test_the_document_follows_the_crds() -> None:
    """A CRD added appears, a CRD deleted disappears; unchanged types are served from the cache."""
    builtins = builtin_resources()
    before = openapi_v2.document(builtins)
    assert openapi_v2.document(builtins) is before
    added = openapi_v2.document([*builtins, widget()])
    assert ("example.com", "v1", "Widget") in gvks(added)
    assert "com.example.v1.Widget" not in before["definitions"]
    after = openapi_v2.document(builtins)
    assert ("example.com", "v1", "Widget") not in gvks(after)


def test_protobuf_encodes_the_same_definitions() -> None:
    """The gnostic `openapi.v2.Document` kubectl asks for: swagger = 1, info = 2,
    definitions = 9 of NamedSchema {name = 1, value = 2}, the GVK a vendor
    extension (31) whose YAML is the JSON list."""
    types = builtin_resources() + crd_types()
    doc = openapi_v2.document(types)
    top = {num: val for num, _, val in fields(openapi_v2.protobuf(types))}
    assert top[1] == b"2.0"
    assert {n: v for n, _, v in fields(top[2])} == {1: b"Kubernetes", 2: b"1.36"}
    names = []
    for _, _, named in fields(top[9]):
        entry = {n: v for n, _, v in fields(named)}
        names.append(entry[1].decode())
        if entry[1] == b"io.k8s.api.core.v1.ConfigMap":
            schema = list(fields(entry[2]))
            props = [v for n, _, v in schema if n == 25]
            prop_names = [dict((n, v) for n, _, v in fields(p))[1].decode() for _, _, p in fields(props[0])]
            assert prop_names == sorted(doc["definitions"]["io.k8s.api.core.v1.ConfigMap"]["properties"])
            ext = [dict((n, v) for n, _, v in fields(v)) for n, _, v in schema if n == 31]
            assert ext[0][1] == b"x-kubernetes-group-version-kind"
            assert yaml.safe_load(dict((n, v) for n, _, v in fields(ext[0][2]))[2]) == [
                {"group": "", "kind": "ConfigMap", "version": "v1"}
            ]
    assert names == list(doc["definitions"])


def test_accept_negotiation() -> None:
    assert openapi_v2.wants_protobuf(openapi_v2.PROTOBUF)
    assert not openapi_v2.wants_protobuf("application/json")
    assert not openapi_v2.wants_protobuf("")
    assert not openapi_v2.wants_protobuf(f"application/json, {openapi_v2.PROTOBUF}")


def test_rbac_kinds_are_typed_as_k8s_io_api_declares_them() -> None:
    """kubectl validates `kind: List` files client-side against these (k8s.io/api rbac/v1 types.go):
    a ClusterRole's `rules`, a binding's `roleRef` (required) and `subjects`."""
    doc = openapi_v2.build(builtin_resources())
    defs = doc["definitions"]
    role = defs["io.k8s.api.rbac.v1.ClusterRole"]
    assert sorted(role["properties"]) == ["aggregationRule", "apiVersion", "kind", "metadata", "rules"]
    assert role["properties"]["rules"]["items"] == {"$ref": "#/definitions/io.k8s.api.rbac.v1.PolicyRule"}
    assert sorted(defs["io.k8s.api.rbac.v1.Role"]["properties"]) == ["apiVersion", "kind", "metadata", "rules"]
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        binding = defs[f"io.k8s.api.rbac.v1.{kind}"]
        assert sorted(binding["properties"]) == ["apiVersion", "kind", "metadata", "roleRef", "subjects"]
        assert binding["required"] == ["roleRef"]
    rule = defs["io.k8s.api.rbac.v1.PolicyRule"]
    assert rule["required"] == ["verbs"]
    assert sorted(rule["properties"]) == ["apiGroups", "nonResourceURLs", "resourceNames", "resources", "verbs"]
    assert defs["io.k8s.api.rbac.v1.RoleRef"]["required"] == ["apiGroup", "kind", "name"]
    assert defs["io.k8s.api.rbac.v1.Subject"]["required"] == ["kind", "name"]
