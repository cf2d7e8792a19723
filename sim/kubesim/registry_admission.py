"""Admission on the registry's write path: what a body must be, and what the
server makes of it before it is stored.

Pure functions of the object (and, on update, the current one): the checks
kube-apiserver's REST handlers and strategies run (a body's apiVersion, kind,
name and namespace; PrepareForCreate/PrepareForUpdate, with a CRD's and a
custom resource's validation, crds.py), apart from the etcd reads and writes
of registry_writes.py.
"""

from __future__ import annotations

import base64
import copy
import re
from typing import Any

from kubesim import storagemigration
from kubesim.coordination import is_lease, validate_lease
from kubesim.crds import admit_custom_resource, crd_status, validate_crd
from kubesim.errors import StatusError, bad_request, conflict, invalid
from kubesim.resources import ResourceType

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _content(obj: dict[str, Any]) -> dict[str, Any]:
    """What counts as a change for `generation` (spec and the like, not metadata or status)."""
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}


def validate_name(rt: ResourceType, name: str) -> None:
    pattern = _LABEL_RE if rt.resource == "namespaces" else _NAME_RE
    limit = 63 if rt.resource == "namespaces" else 253
    if not name:
        raise invalid(rt.kind, rt.group, name, [("metadata.name", "Required value: name or generateName is required")])
    if rt.group == "rbac.authorization.k8s.io":
        # RBAC names are path segments (ValidateRBACName): `system:discovery` is valid.
        bad = f"may not be '{name}'" if name in (".", "..") else None
        bad = bad or next((f"may not contain '{c}'" for c in ("/", "%") if c in name), None)
        if bad:
            raise invalid(rt.kind, rt.group, name, [("metadata.name", f'Invalid value: "{name}": {bad}')])
        return
    if len(name) > limit or not pattern.match(name):
        raise invalid(
            rt.kind,
            rt.group,
            name,
            [
                (
                    "metadata.name",
                    f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case '
                    "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
                )
            ],
        )


def check_body(rt: ResourceType, version: str, body: Any, namespace: str | None) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the body of the request was in an unknown format")
    expected = rt.group_version(version)
    api_version = body.get("apiVersion")
    if api_version and api_version != expected:
        raise bad_request(
            f"the API version in the data ({api_version}) does not match the expected API version ({expected})"
        )
    kind = body.get("kind")
    if kind and kind != rt.kind:
        raise bad_request(f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})")
    meta = body.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise bad_request("metadata must be an object")
    body_ns = (meta or {}).get("namespace")
    if rt.namespaced and body_ns and namespace and body_ns != namespace:
        raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
    if meta:
        # ObjectMeta's maps and lists are omitempty: removing the last label leaves no `labels: {}`.
        for empty in [k for k in ("labels", "annotations", "finalizers", "ownerReferences") if k in meta]:
            if not meta[empty]:
                del meta[empty]
    return body


def prepare_for_create(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    if rt.resource == "namespaces" and not rt.group:
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        obj["status"] = {"phase": "Active"}
    if rt.resource == "secrets" and not rt.group:
        _merge_string_data(obj)
        if not obj.get("type"):
            obj["type"] = "Opaque"  # SetDefaults_Secret (kubectl create secret generic sends none)
    if rt.resource == "customresourcedefinitions":
        validate_crd(obj)
        obj["status"] = crd_status(obj, None)
    if rt.is_custom:
        obj = _admit_custom(rt, obj, None)
    if storagemigration.is_svm(rt):
        obj = storagemigration.admit_create(obj)
    if is_lease(rt):
        validate_lease(obj)
    return obj


def prepare_for_update(rt: ResourceType, new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    if rt.resource == "secrets" and not rt.group:
        _merge_string_data(new)
        if not new.get("type"):
            new["type"] = "Opaque"  # defaulted on every write, as on create
    if rt.resource == "customresourcedefinitions":
        validate_crd(new, old)
        new["status"] = crd_status(new, old.get("status") or {}, requested=new.get("status"))
    if rt.is_custom:
        new = _admit_custom(rt, new, old)
    if storagemigration.is_svm(rt):
        new = storagemigration.admit_update(new, old)
    if is_lease(rt):
        validate_lease(new)
    return new


def _admit_custom(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
    # Pruned and validated against the schema of the version being written (crds.py).
    version = obj["apiVersion"].rpartition("/")[2]
    return admit_custom_resource(rt.kind, rt.group, obj, rt.crd_schemas.get(version) or {}, old)


def _check_update_preconditions(
    rt: ResourceType, current: dict[str, Any], proposed_meta: dict[str, Any], name: str
) -> None:
    """The name, resourceVersion and uid of an update's body, when given, must be the current object's."""
    if proposed_meta.get("name") not in (None, "", name):
        raise bad_request(
            f"the name of the object ({proposed_meta.get('name')}) does not match the name on the URL ({name})"
        )
    rv = proposed_meta.get("resourceVersion")
    if rv not in (None, "") and str(rv) != current["metadata"]["resourceVersion"]:
        raise conflict(rt.resource, rt.group, name)
    cur_meta = current["metadata"]
    uid = proposed_meta.get("uid")
    if uid not in (None, "") and uid != cur_meta.get("uid"):
        # kube-apiserver treats a uid in the body as a precondition (the object was re-created).
        raise StatusError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {rt.group_resource} "{name}": Precondition failed: '
            f"UID in precondition: {uid}, UID in object meta: {cur_meta.get('uid')}",
            details={"name": name, **({"group": rt.group} if rt.group else {}), "kind": rt.resource},
        )


def merge_update(
    rt: ResourceType,
    version: str,
    current: dict[str, Any],
    proposed: dict[str, Any],
    subresource: str | None,
    name: str,
) -> dict[str, Any]:
    """What an update stores: the proposed object with the current one's immutable metadata (and status,
    when a subresource owns it), or, through the status subresource, the current object with the proposed status."""
    proposed_meta = proposed.get("metadata") or {}
    _check_update_preconditions(rt, current, proposed_meta, name)
    cur_meta = current["metadata"]
    if subresource == "status":
        new = copy.deepcopy(current)
        if "status" in proposed:
            new["status"] = proposed["status"]
        else:
            new.pop("status", None)
        if rt.resource == "customresourcedefinitions" or rt.is_custom:
            new = prepare_for_update(rt, new, current)
        if storagemigration.is_svm(rt):
            storagemigration.require_resource_version(proposed, name)
            new = storagemigration.admit_status_update(new, current)
        return new
    new = copy.deepcopy(proposed)
    new["apiVersion"] = rt.group_version(version)
    new["kind"] = rt.kind
    meta = dict(proposed_meta)
    for immutable in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "generation"):
        if immutable in cur_meta:
            meta[immutable] = cur_meta[immutable]
        else:
            meta.pop(immutable, None)
    new["metadata"] = meta
    if "status" in rt.subresources and rt.resource != "customresourcedefinitions":
        # The main resource ignores status when a status subresource exists.
        if "status" in current:
            new["status"] = current["status"]
        else:
            new.pop("status", None)
    new = prepare_for_update(rt, new, current)
    if rt.has_generation and _content(new) != _content(current):
        meta["generation"] = int(cur_meta.get("generation", 1)) + 1
    return new


def _merge_string_data(secret: dict[str, Any]) -> None:
    """A Secret's `stringData` is write-only: merged into `data` (base64), overriding, never stored.

    As the v1 -> internal conversion of kube-apiserver does.
    """
    string_data = secret.pop("stringData", None)
    if not isinstance(string_data, dict) or not string_data:
        return
    data = dict(secret.get("data") or {})
    for key, value in string_data.items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    secret["data"] = data
