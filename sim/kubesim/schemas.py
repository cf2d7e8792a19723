"""A custom resource against its CRD's structural schema: pruning and OpenAPI validation.

kube-apiserver decodes a custom resource, prunes what its structural schema does
not declare, then validates what is left (apiextensions-apiserver
`pkg/apiserver/schema/pruning`, `pkg/apiserver/validation`, kube-openapi's
`pkg/validation`). kubesim does the same, in the same order, so a test that
passes here is not one a real server would refuse:

- pruning keeps `apiVersion`, `kind` and `metadata` at the root (metadata as
  ObjectMeta: its unknown fields are dropped too), keeps everything under
  `x-kubernetes-preserve-unknown-fields`, and map entries under
  `additionalProperties`; any other field not in `properties` goes;
- validation errors are field errors worded as `kubeOpenAPIResultToFieldErrors`
  words them: `Required value`, `Unsupported value: "x": supported values: ...`,
  `Invalid value: "string": spec.n in body must be of type integer: "string"`
  (FieldValueTypeInvalid), `Invalid value: ...: spec.s in body should match '...'`;
- on update, a value equal to the old value at the same place is not validated
  again (CRDValidationRatcheting, GA in v1.33), so an object stored before its
  schema tightened still takes a no-op patch.

Functions here are pure: crds.py calls them, for the registry's admission (registry_admission.py).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import lru_cache
from typing import Any

from kubesim.errors import (
    FieldError,
    field_invalid,
    field_not_supported,
    field_required,
    field_too_long,
    field_too_many,
    field_type_invalid,
)

MISSING: Any = object()  # no old value at this place (a create, or a field added)

# ObjectMeta's serialized fields (k8s.io/apimachinery/pkg/apis/meta/v1/types.go): the
# root `metadata` of a custom resource is decoded into ObjectMeta, which drops the rest.
OBJECT_META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
_ROOT_KEPT = ("apiVersion", "kind", "metadata")
_IN = "body"  # kube-openapi's `in` for a request body


# ----- pruning ---------------------------------------------------------------
def prune(obj: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """Drop, in place, what the structural schema does not declare; returns `obj`."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        for key in [k for k in meta if k not in OBJECT_META_FIELDS]:
            del meta[key]
    _prune_object(obj, schema, keep=_ROOT_KEPT)
    return obj


def _prune(value: Any, schema: dict[str, Any]) -> None:
    if isinstance(value, dict):
        keep = _ROOT_KEPT if schema.get("x-kubernetes-embedded-resource") else ()
        _prune_object(value, schema, keep=keep)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for item in value:
                _prune(item, items)


def _prune_object(value: dict[str, Any], schema: dict[str, Any], *, keep: tuple[str, ...]) -> None:
    properties = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    for key in list(value):
        sub = properties.get(key)
        if key in keep:
            continue  # apiVersion, kind, metadata (ObjectMeta's own fields, pruned above)
        if sub is not None:
            _prune(value[key], sub)
        elif isinstance(additional, dict):
            _prune(value[key], additional)
        elif additional is True or preserve:
            continue
        else:
            del value[key]


# ----- validation ------------------------------------------------------------
def validate(obj: dict[str, Any], schema: dict[str, Any], old: Any = MISSING) -> list[FieldError]:
    """The schema's errors for a (pruned) custom resource; `old` is the stored object on update.

    The root's `apiVersion`, `kind` and `metadata` are ObjectMeta's business, not the schema's.
    """
    errors: list[FieldError] = []
    if old is not MISSING and old == obj:
        return errors
    _check_object(obj, schema, old, "", errors, skip=_ROOT_KEPT)
    return errors


def _child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_ok(value: Any, schema: dict[str, Any]) -> tuple[bool, str]:
    """(matches, the type the error names) for `type` and `x-kubernetes-int-or-string`."""
    actual = _json_type(value)
    if schema.get("x-kubernetes-int-or-string"):
        return actual in ("integer", "string"), "integer,string"
    wanted = schema.get("type")
    if not wanted:
        return True, ""
    if wanted == actual:
        return True, wanted
    if wanted == "number" and actual == "integer":
        return True, wanted
    if wanted == "integer" and isinstance(value, float) and value.is_integer():
        return True, wanted  # a JSON 1.0 is an integer for kube-openapi (swag.IsFloat64AJSONInteger)
    return False, wanted


def _check(value: Any, schema: dict[str, Any], old: Any, path: str, errors: list[FieldError]) -> None:
    if old is not MISSING and old == value:
        return  # ratcheting: an unchanged value is not validated again
    if value is None:
        if not schema.get("nullable") and (schema.get("type") or schema.get("x-kubernetes-int-or-string")):
            _, wanted = _type_ok(value, schema)
            errors.append(field_type_invalid(path, "null", f'{path} in {_IN} must be of type {wanted}: "null"'))
        return
    ok, wanted = _type_ok(value, schema)
    if not ok:
        actual = _json_type(value)
        errors.append(field_type_invalid(path, actual, f'{path} in {_IN} must be of type {wanted}: "{actual}"'))
        return
    enum = schema.get("enum")
    if enum is not None and value not in enum:
        errors.append(field_not_supported(path, value, [v if isinstance(v, str) else _json(v) for v in enum]))
    if isinstance(value, str):
        _check_string(value, schema, path, errors)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        _check_number(value, schema, path, errors)
    elif isinstance(value, list):
        _check_array(value, schema, old, path, errors)
    elif isinstance(value, dict):
        _check_object(value, schema, old, path, errors, skip=())


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


@lru_cache(maxsize=512)
def _pattern(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern)
    except re.error:
        return None


def _is_date_time(text: str) -> bool:
    # strfmt.DateTime accepts RFC 3339 (with or without fractional seconds).
    candidate = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        datetime.fromisoformat(candidate)
    except ValueError:
        return False
    return "T" in text.upper() or " " in text


def _check_string(value: str, schema: dict[str, Any], path: str, errors: list[FieldError]) -> None:
    max_length = schema.get("maxLength")
    if max_length is not None and len(value) > max_length:
        errors.append(field_too_long(path, int(max_length)))
    min_length = schema.get("minLength")
    if min_length is not None and len(value) < min_length:
        errors.append(field_invalid(path, value, f"{path} in {_IN} should be at least {min_length} chars long"))
    pattern = schema.get("pattern")
    if pattern is not None:
        compiled = _pattern(pattern)
        if compiled is not None and not compiled.search(value):
            errors.append(field_invalid(path, value, f"{path} in {_IN} should match '{pattern}'"))
    if schema.get("format") == "date-time" and not _is_date_time(value):
        errors.append(field_invalid(path, value, f'{path} in {_IN} must be of type date-time: "{value}"'))


def _number_text(limit: Any) -> str:
    if isinstance(limit, float) and limit.is_integer():
        return str(int(limit))
    return str(limit)


def _check_number(value: float, schema: dict[str, Any], path: str, errors: list[FieldError]) -> None:
    maximum = schema.get("maximum")
    if maximum is not None:
        if schema.get("exclusiveMaximum") and value >= maximum:
            errors.append(field_invalid(path, value, f"{path} in {_IN} should be less than {_number_text(maximum)}"))
        elif value > maximum:
            errors.append(
                field_invalid(path, value, f"{path} in {_IN} should be less than or equal to {_number_text(maximum)}")
            )
    minimum = schema.get("minimum")
    if minimum is not None:
        if schema.get("exclusiveMinimum") and value <= minimum:
            errors.append(field_invalid(path, value, f"{path} in {_IN} should be greater than {_number_text(minimum)}"))
        elif value < minimum:
            errors.append(
                field_invalid(
                    path, value, f"{path} in {_IN} should be greater than or equal to {_number_text(minimum)}"
                )
            )
    multiple = schema.get("multipleOf")
    if multiple and (value / multiple) != int(value / multiple):
        errors.append(field_invalid(path, value, f"{path} in {_IN} should be a multiple of {_number_text(multiple)}"))


def _check_array(value: list[Any], schema: dict[str, Any], old: Any, path: str, errors: list[FieldError]) -> None:
    max_items = schema.get("maxItems")
    if max_items is not None and len(value) > max_items:
        errors.append(field_too_many(path, len(value), int(max_items)))
    min_items = schema.get("minItems")
    if min_items is not None and len(value) < min_items:
        errors.append(field_invalid(path, len(value), f"{path} in {_IN} should have at least {min_items} items"))
    items = schema.get("items")
    if not isinstance(items, dict):
        return
    for i, item in enumerate(value):
        # Items of an atomic list have no old value to ratchet against.
        _check(item, items, MISSING, f"{path}[{i}]", errors)


def _check_object(
    value: dict[str, Any],
    schema: dict[str, Any],
    old: Any,
    path: str,
    errors: list[FieldError],
    *,
    skip: tuple[str, ...],
) -> None:
    old_map = old if isinstance(old, dict) else {}
    for name in schema.get("required") or []:
        if name not in value and name not in skip:
            errors.append(field_required(_child(path, name)))
    properties = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    for key, sub_value in value.items():
        if key in skip:
            continue
        sub = properties.get(key)
        if sub is None and isinstance(additional, dict):
            sub = additional
        if sub is not None:
            _check(sub_value, sub, old_map.get(key, MISSING), _child(path, key), errors)
    max_properties = schema.get("maxProperties")
    if max_properties is not None and len(value) > max_properties:
        errors.append(field_too_many(path, len(value), int(max_properties)))
