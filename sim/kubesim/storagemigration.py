"""The in-tree `storagemigration.k8s.io` API: what its REST strategy makes of a
write, and what its validation refuses.

Held to kube-apiserver (refusals first), from the Kubernetes source read with
the `search` tool:
- `pkg/registry/storagemigration/storagemigration/strategy.go`: a create clears
  the status; an update keeps the stored status; a write through `/status`
  keeps the stored spec and metadata; neither verb allows an unconditional
  update (`AllowUnconditionalUpdate` false: a PUT must carry the
  resourceVersion it read);
- `pkg/apis/storagemigration/validation/validation.go` (the v1beta1/v1 one):
  `spec.resource.resource` required ("resource is required to be set",
  reference/svm-empty-resource-422.json), a DNS-1035 label; `spec.resource.group`
  a DNS-1123 subdomain when set; the whole `spec` immutable
  (ValidateImmutableField, reference/svm-spec-immutable-422.json); on `/status`:
  `status.resourceVersion` well formed and immutable once set, the conditions
  as `metav1validation.ValidateConditions` checks them, never `Succeeded` and
  `Failed` both True, and neither turned back once True;
- `staging/src/k8s.io/api/storagemigration/v1/types.go`: the typed object a
  body is decoded into: unknown fields are dropped, `spec.resource.group` and
  `.resource` and `status` are always written (no `omitempty`), a condition is
  a `metav1.Condition`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kubesim.errors import (
    FieldError,
    GoRaw,
    bad_request,
    field_duplicate,
    field_invalid,
    field_not_supported,
    field_required,
    field_too_long,
    invalid_object,
)
from kubesim.resources import ResourceType

GROUP = "storagemigration.k8s.io"
RESOURCE = "storageversionmigrations"
KIND = "StorageVersionMigration"
#: The condition types (types.go: MigrationConditionType).
RUNNING, SUCCEEDED, FAILED = "Running", "Succeeded", "Failed"

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_DNS1035_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation "
    "is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
_DNS1123_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
# metav1validation.ValidateCondition: a condition's type is a qualified name, its reason a CamelCase word.
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_QUALIFIED_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_REASON_MSG = (
    "a condition reason must start with alphabetic character, optionally followed by a string of alphanumeric "
    "characters or '_,:', and must end with an alphanumeric character or '_' (e.g. 'my_name',  or 'MY_NAME',  or "
    "'MyName',  or 'ReasonA,ReasonB',  or 'ReasonA:ReasonB', regex used for validation is "
    "'[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?')"
)
_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
_RV = re.compile(r"^[1-9][0-9]*$")
_CONDITION_STATUSES = ["False", "True", "Unknown"]
_MAX_REASON, _MAX_MESSAGE = 1024, 32768


def is_svm(rt: ResourceType) -> bool:
    return rt.group == GROUP and rt.resource == RESOURCE and not rt.is_custom


# ----- decoding: what the typed object keeps ------------------------------------
def _string(value: Any, path: str, go_field: str) -> str:
    """A JSON string field of the Go struct; anything else is the decoder's 400."""
    if value is None:
        return ""
    if not isinstance(value, str):
        kind = {bool: "bool", int: "number", float: "number", list: "array", dict: "object"}.get(type(value), "value")
        raise bad_request(f"json: cannot unmarshal {kind} into Go struct field {go_field}.{path} of type string")
    return value


def _condition(raw: Any, path: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise bad_request(f"json: cannot unmarshal into Go struct field StorageVersionMigrationStatus.{path}")
    out: dict[str, Any] = {
        "type": _string(raw.get("type"), f"{path}.type", "Condition"),
        "status": _string(raw.get("status"), f"{path}.status", "Condition"),
    }
    generation = raw.get("observedGeneration")
    if generation not in (None, 0):
        if not isinstance(generation, int) or isinstance(generation, bool):
            raise bad_request(
                f"json: cannot unmarshal into Go struct field Condition.{path}.observedGeneration of type int64"
            )
        out["observedGeneration"] = generation
    when = raw.get("lastTransitionTime")
    if when is not None and (not isinstance(when, str) or not _TIME.match(when)):
        raise bad_request(f'parsing time {json.dumps(when)} as "2006-01-02T15:04:05Z07:00": cannot parse')
    out["lastTransitionTime"] = when
    out["reason"] = _string(raw.get("reason"), f"{path}.reason", "Condition")
    out["message"] = _string(raw.get("message"), f"{path}.message", "Condition")
    return out


def decode(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as the typed StorageVersionMigration holds it (unknown fields dropped, defaults written)."""
    spec = obj.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    resource = spec.get("resource")
    resource = resource if isinstance(resource, dict) else {}
    out = {k: v for k, v in obj.items() if k in ("apiVersion", "kind", "metadata")}
    out["spec"] = {
        "resource": {
            "group": _string(resource.get("group"), "spec.resource.group", "StorageVersionMigration"),
            "resource": _string(resource.get("resource"), "spec.resource.resource", "StorageVersionMigration"),
        }
    }
    status = obj.get("status")
    status = status if isinstance(status, dict) else {}
    decoded: dict[str, Any] = {}
    conditions = status.get("conditions")
    if isinstance(conditions, list) and conditions:
        decoded["conditions"] = [_condition(c, f"status.conditions[{i}]") for i, c in enumerate(conditions)]
    rv = _string(status.get("resourceVersion"), "status.resourceVersion", "StorageVersionMigration")
    if rv:
        decoded["resourceVersion"] = rv
    out["status"] = decoded
    return out


# ----- validation -----------------------------------------------------------
def _spec_errors(obj: dict[str, Any]) -> list[FieldError]:
    """validateStorageMigrationSpec."""
    errors: list[FieldError] = []
    resource = obj["spec"]["resource"]
    if not resource["resource"]:
        errors.append(field_required("spec.resource.resource", "resource is required to be set"))
    else:
        msgs = _dns1035(resource["resource"])
        if msgs:
            errors.append(field_invalid("spec.resource.resource", resource["resource"], ",".join(msgs)))
    group = resource["group"]
    if group:
        msgs = []
        if len(group) > 253:
            msgs.append("must be no more than 253 characters")
        if not _DNS1123_SUBDOMAIN.match(group):
            msgs.append(_DNS1123_MSG)
        if msgs:
            errors.append(field_invalid("spec.resource.group", group, ",".join(msgs)))
    return errors


def _dns1035(value: str) -> list[str]:
    msgs = []
    if len(value) > 63:
        msgs.append("must be no more than 63 characters")
    if not _DNS1035.match(value):
        msgs.append(_DNS1035_MSG)
    return msgs


def _go_spec(obj: dict[str, Any]) -> GoRaw:
    # The internal StorageVersionMigrationSpec has no json tag on Resource: {"Resource":{...}}.
    resource = obj["spec"]["resource"]
    return GoRaw(json.dumps({"Resource": {"group": resource["group"], "resource": resource["resource"]}},
                            separators=(",", ":")))  # fmt: skip


def _go_conditions(conditions: list[dict[str, Any]]) -> GoRaw:
    # json.Marshal of []metav1.Condition, fields in the struct's order.
    order = ("type", "status", "observedGeneration", "lastTransitionTime", "reason", "message")
    return GoRaw(json.dumps([{k: c[k] for k in order if k in c} for c in conditions], separators=(",", ":")))


def _raise(name: str, errors: list[FieldError]) -> None:
    if errors:
        raise invalid_object(KIND, GROUP, name, errors)


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def admit_create(obj: dict[str, Any]) -> dict[str, Any]:
    """PrepareForCreate (status cleared) and Validate; raises the 422."""
    obj = decode(obj)
    obj["status"] = {}
    _raise(_name(obj), _spec_errors(obj))
    return obj


def require_resource_version(requested: dict[str, Any], name: str) -> None:
    """AllowUnconditionalUpdate false (both strategies): rest.BeforeUpdate refuses an update whose
    body names no resourceVersion (a patch always names the one it was applied to)."""
    if not (requested.get("metadata") or {}).get("resourceVersion"):
        _raise(name, [field_invalid("metadata.resourceVersion", GoRaw("0x0"), "must be specified for an update")])


def admit_update(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """PrepareForUpdate (the stored status kept) and ValidateUpdate: the spec is immutable."""
    require_resource_version(new, _name(old))
    new, old = decode(new), decode(old)
    new["status"] = old["status"]
    errors = _spec_errors(new)
    if new["spec"] != old["spec"]:
        errors.append(field_invalid("spec", _go_spec(new), "field is immutable"))
    _raise(_name(new), errors)
    return new


def _is_true(status: dict[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in status.get("conditions") or [])


def _condition_errors(conditions: list[dict[str, Any]]) -> list[FieldError]:
    """metav1validation.ValidateConditions."""
    errors: list[FieldError] = []
    seen: set[str] = set()
    for i, cond in enumerate(conditions):
        path = f"status.conditions[{i}]"
        kind = cond["type"]
        if kind in seen:
            errors.append(field_duplicate(f"{path}.type", kind))
        seen.add(kind)
        if not kind:
            errors.append(field_invalid(f"{path}.type", kind, "name part must be non-empty"))
        elif len(kind) > 63:
            errors.append(field_invalid(f"{path}.type", kind, "name part must be no more than 63 characters"))
        elif not _QUALIFIED_NAME.match(kind):
            errors.append(field_invalid(f"{path}.type", kind, _QUALIFIED_MSG))
        if cond["status"] not in _CONDITION_STATUSES:
            errors.append(field_not_supported(f"{path}.status", cond["status"], _CONDITION_STATUSES))
        if not cond.get("lastTransitionTime"):
            errors.append(field_required(f"{path}.lastTransitionTime", "must be set"))
        reason = cond["reason"]
        if not reason:
            errors.append(field_required(f"{path}.reason", "must be set"))
        else:
            if not _REASON.match(reason):
                errors.append(field_invalid(f"{path}.reason", reason, _REASON_MSG))
            if len(reason) > _MAX_REASON:
                errors.append(field_too_long(f"{path}.reason", _MAX_REASON))
        if len(cond["message"]) > _MAX_MESSAGE:
            errors.append(field_too_long(f"{path}.message", _MAX_MESSAGE))
    return errors


def admit_status_update(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """The status strategy: the stored spec kept, ValidateStorageVersionMigrationStatusUpdate."""
    new, old = decode(new), decode(old)
    new["spec"] = old["spec"]
    status, old_status = new["status"], old["status"]
    errors: list[FieldError] = []
    rv = status.get("resourceVersion", "")
    if rv and not _RV.match(rv):
        errors.append(field_invalid("status.resourceVersion", rv, f"resource version is not well formed: {rv}"))
    conditions = status.get("conditions") or []
    errors += _condition_errors(conditions)
    old_rv = old_status.get("resourceVersion", "")
    if old_rv and old_rv != rv:
        errors.append(field_invalid("status.resourceVersion", rv, "field is immutable"))
    if _is_true(status, SUCCEEDED) and _is_true(status, FAILED):
        errors.append(field_invalid("status.conditions", _go_conditions(conditions),
                                    "Both success and failed conditions cannot be true at the same time"))  # fmt: skip
    if _is_true(old_status, SUCCEEDED) and not _is_true(status, SUCCEEDED):
        errors.append(field_invalid("status.conditions", _go_conditions(conditions),
                                    "Success condition cannot be set to false once it is true"))  # fmt: skip
    if _is_true(old_status, FAILED) and not _is_true(status, FAILED):
        errors.append(field_invalid("status.conditions", _go_conditions(conditions),
                                    "Failed condition cannot be set to false once it is true"))  # fmt: skip
    _raise(_name(new), errors)
    return new


# ----- conditions, as k8s.io/apimachinery/pkg/api/meta sets them ---------------------
def find_condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def condition_true(obj: dict[str, Any], kind: str) -> bool:
    cond = find_condition(obj, kind)
    return cond is not None and cond.get("status") == "True"


def set_condition(obj: dict[str, Any], kind: str, status: str, reason: str, message: str, now: str) -> None:
    """meta.SetStatusCondition: a new type is appended; an existing one takes the new status, reason
    and message, and a new lastTransitionTime only when its status changes."""
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    for cond in conditions:
        if cond.get("type") == kind:
            if cond.get("status") != status:
                cond["lastTransitionTime"] = now
            cond.update({"status": status, "reason": reason, "message": message})
            return
    conditions.append({"type": kind, "status": status, "lastTransitionTime": now, "reason": reason, "message": message})
