"""CustomResourceDefinitions: what the apiextensions strategy refuses, and the status its controllers keep.

From apiextensions-apiserver (`pkg/apis/apiextensions/validation/validation.go`,
`pkg/apihelpers/helpers.go`, `pkg/controller/apiapproval`):

- a CRD whose `spec.group` is `k8s.io`, `kubernetes.io` or ends in `.k8s.io` /
  `.kubernetes.io` is in a protected group (IsProtectedCommunityGroup) and needs
  the `api-approved.kubernetes.io` annotation: a URL (with a scheme and a host)
  approves it, a value starting with "unapproved" is accepted but the
  `KubernetesAPIApprovalPolicyConformant` condition says False; no value is
  `Required value`, any other value `Invalid value` (validateAPIApproval,
  reference/crd-protected-group-422.json). On update the check is skipped when
  the approval *state* did not change, so a controller updating the spec of an
  old CRD is not refused;
- every `x-kubernetes-validations` rule must compile, or the CRD is refused.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from kubesim import cel, schemas
from kubesim.cel import RuleCompileError, compile_rule, schema_rules
from kubesim.errors import (
    FieldError,
    GoRaw,
    field_invalid,
    field_not_supported,
    field_required,
    go_quote,
    invalid_object,
)

APPROVAL_ANNOTATION = "api-approved.kubernetes.io"
_APPROVAL_PATH = f"metadata.annotations[{APPROVAL_ANNOTATION}]"
_KEP = "see https://github.com/kubernetes/enhancements/pull/1111"
APPROVAL_CONDITION = "KubernetesAPIApprovalPolicyConformant"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def crd_established(crd: dict[str, Any]) -> bool:
    for cond in (crd.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Established":
            return bool(cond.get("status") == "True")
    return False


def is_protected_group(group: str) -> bool:
    """apihelpers.IsProtectedCommunityGroup."""
    return group in ("k8s.io", "kubernetes.io") or group.endswith((".k8s.io", ".kubernetes.io"))


def api_approval_state(annotations: dict[str, Any] | None) -> tuple[str, str]:
    """apihelpers.GetAPIApprovalState: (Missing | Bypassed | Approved | Invalid, reason)."""
    value = str((annotations or {}).get(APPROVAL_ANNOTATION) or "")
    if not value:
        return "Missing", f"protected groups must have approval annotation {go_quote(APPROVAL_ANNOTATION)}, {_KEP}"
    if value.startswith("unapproved"):
        return "Bypassed", f"not approved: {go_quote(value)}"
    try:
        parts = urlsplit(value)
        is_url = bool(parts.scheme and parts.netloc) and " " not in value
    except ValueError:
        is_url = False
    if is_url:
        return "Approved", f"approved in {value}"
    return "Invalid", (
        f"protected groups must have approval annotation {go_quote(APPROVAL_ANNOTATION)} with either a URL "
        f'or a reason starting with "unapproved", {_KEP}'
    )


def _api_approval_errors(crd: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    """validateAPIApproval."""
    if not is_protected_group(str((crd.get("spec") or {}).get("group") or "")):
        return []
    state, reason = api_approval_state((crd.get("metadata") or {}).get("annotations"))
    if old is not None and api_approval_state((old.get("metadata") or {}).get("annotations"))[0] == state:
        return []
    if state == "Missing":
        return [field_required(_APPROVAL_PATH, reason)]
    if state == "Invalid":
        value = crd["metadata"]["annotations"][APPROVAL_ANNOTATION]
        return [field_invalid(_APPROVAL_PATH, value, reason)]
    return []


def _go_rule(raw: dict[str, Any]) -> GoRaw:
    # How %#v prints an apiextensions.ValidationRule (the bad value of a rule that does not compile).
    return GoRaw(
        f"apiextensions.ValidationRule{{Rule:{go_quote(str(raw.get('rule') or ''))}, "
        f"Message:{go_quote(str(raw.get('message') or ''))}, "
        f"MessageExpression:{go_quote(str(raw.get('messageExpression') or ''))}, "
        "Reason:(*apiextensions.FieldValueErrorReason)(nil), "
        f"FieldPath:{go_quote(str(raw.get('fieldPath') or ''))}, OptionalOldSelf:(*bool)(nil)}}"
    )


def _rule_errors(spec: dict[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    for i, version in enumerate(spec.get("versions") or []):
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if not isinstance(schema, dict):
            continue
        base = f"spec.versions[{i}].schema.openAPIV3Schema"
        for path, j, raw in schema_rules(schema, base):
            try:
                compile_rule(str(raw.get("rule") or ""))
            except RuleCompileError as exc:
                where = f"{path}.x-kubernetes-validations[{j}].rule"
                errors.append(field_invalid(where, _go_rule(raw), f"compilation failed: {exc}"))
    return errors


def validate_crd(crd: dict[str, Any], old: dict[str, Any] | None = None) -> None:
    """Raise 422 `Invalid` for what ValidateCustomResourceDefinition(Update) refuses (the subset kubesim checks)."""
    name = (crd.get("metadata") or {}).get("name", "")
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    errors: list[FieldError] = []
    if spec.get("group") and names.get("plural") and name != f"{names['plural']}.{spec['group']}":
        errors.append(field_invalid("metadata.name", name, 'must be spec.names.plural+"."+spec.group'))
    if not spec.get("group"):
        errors.append(field_required("spec.group"))
    scope = spec.get("scope")
    if not scope:
        errors.append(field_required("spec.scope"))
    elif scope not in ("Namespaced", "Cluster"):
        errors.append(field_not_supported("spec.scope", scope, ["Cluster", "Namespaced"]))
    versions = spec.get("versions") or []
    if len([v for v in versions if v.get("storage")]) != 1:
        errors.append(
            field_invalid(
                "spec.versions",
                [v.get("name") for v in versions],
                "must have exactly one version marked as storage version",
            )
        )
    if not names.get("plural"):
        errors.append(field_required("spec.names.plural"))
    if not names.get("kind"):
        errors.append(field_required("spec.names.kind"))
    errors += _rule_errors(spec)
    errors += _api_approval_errors(crd, old)
    if errors:
        raise invalid_object("CustomResourceDefinition", "apiextensions.k8s.io", name, errors)


def _approval_condition(crd: dict[str, Any], prior: dict[str, Any] | None, ts: str) -> dict[str, Any] | None:
    """The condition the KubernetesAPIApprovalPolicyConformant controller keeps on protected groups."""
    if not is_protected_group(str((crd.get("spec") or {}).get("group") or "")):
        return None
    state, reason = api_approval_state((crd.get("metadata") or {}).get("annotations"))
    status, why = {
        "Approved": ("True", "ApprovedAnnotation"),
        "Bypassed": ("False", "UnapprovedAnnotation"),
        "Missing": ("False", "MissingAnnotation"),
        "Invalid": ("False", "InvalidAnnotation"),
    }[state]
    if prior and prior.get("status") == status and prior.get("reason") == why and prior.get("message") == reason:
        return dict(prior)
    return {"type": APPROVAL_CONDITION, "status": status, "lastTransitionTime": ts, "reason": why, "message": reason}


def crd_status(
    crd: dict[str, Any], old: dict[str, Any] | None, *, requested: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The status the apiextensions controllers keep: names accepted, established,
    API approval for protected groups, and `storedVersions` growing with every
    storage version ever used."""
    spec = crd.get("spec") or {}
    storage = next(v["name"] for v in spec.get("versions") or [] if v.get("storage"))
    base = requested if requested is not None else (old or {})
    stored = list(base.get("storedVersions") or (old or {}).get("storedVersions") or [])
    if storage not in stored:
        stored.append(storage)
    ts = _now()
    prior = {c.get("type"): c for c in (old or {}).get("conditions") or []}

    def cond(kind: str, reason: str, message: str) -> dict[str, Any]:
        if kind in prior and prior[kind].get("status") == "True":
            return dict(prior[kind])
        return {"type": kind, "status": "True", "lastTransitionTime": ts, "reason": reason, "message": message}

    conditions = [
        cond("NamesAccepted", "NoConflicts", "no conflicts found"),
        cond("Established", "InitialNamesAccepted", "the initial names have been accepted"),
    ]
    approval = _approval_condition(crd, prior.get(APPROVAL_CONDITION), ts)
    if approval is not None:
        conditions.append(approval)
    # Conditions other controllers keep through /status (kube-controller-manager's storage version
    # migrator writes `StorageMigrating`, sim/kubesim/svm_controller.py) stay as written.
    kept = {c["type"] for c in conditions}
    conditions += [dict(c) for c in base.get("conditions") or [] if isinstance(c, dict) and c.get("type") not in kept]
    return {"conditions": conditions, "acceptedNames": dict(spec.get("names") or {}), "storedVersions": stored}


def admit_custom_resource(
    kind: str, group: str, obj: dict[str, Any], schema: dict[str, Any], old: dict[str, Any] | None
) -> dict[str, Any]:
    """Prune `obj` in place to its CRD's structural schema, then validate it as the
    customResourceStrategy does: schema errors, then (unless one is a type error)
    the `x-kubernetes-validations` rules. Raises 422 `Invalid`; returns `obj`."""
    if not schema:
        return obj  # a schemaless version (kubesim's own fixtures): nothing to prune or check
    schemas.prune(obj, schema)
    prior: Any = schemas.MISSING if old is None else old
    errors = schemas.validate(obj, schema, prior)
    if cel.has_blocking_error(errors):
        errors.append(cel.blocked_error())
    else:
        errors += cel.validate(obj, schema, prior)
    if errors:
        name = str((obj.get("metadata") or {}).get("name") or "")
        raise invalid_object(kind, group, name, errors)
    return obj
