"""`x-kubernetes-validations` rules, evaluated as kube-apiserver evaluates them (with cel-python).

apiextensions-apiserver `pkg/apiserver/schema/cel/validation.go` walks the
structural schema beside the object; at every node with rules it binds `self`
to the value there (and `oldSelf` to the old value at the same place on update)
and evaluates each rule. What kubesim reproduces from it:

- a failing rule is `field.Invalid(<path>, <the node's schema type>, <message>)`:
  the value printed is the schema type, hence `Invalid value: "object"`; the path
  of a rule on the root is nil, which Go prints `<nil>`; `fieldPath` is appended
  to the path; `reason` picks Forbidden / Required / Duplicate instead;
  the message is `message`, or `failed rule: <rule>` without one;
- a runtime error is `Invalid value: "<type>": <error> evaluating rule: <message or rule>`
  (`no such key: x evaluating rule: ...`);
- a transition rule (one that names `oldSelf`) runs only on update, and only
  where an old value exists (object properties and map entries are correlated by
  key, list items of `x-kubernetes-list-type: map` by their keys);
- on update an unchanged value is not checked again, except by transition rules
  (CRDValidationRatcheting);
- the root's `metadata` shows only `name` and `generateName` to rules;
- objects are maps: `has(self.f)` is true when the key is present, even with
  `""` (so `(has(self.group) ? self.group : '') == (has(oldSelf.group) ? oldSelf.group : '')`
  treats an omitted `group` and `group: ""` as equal, which `self == oldSelf` does not:
  our CRDs' immutability rule on `spec.resource`); `self.f` on an absent key is the
  runtime error `no such key: f`;
- no rule runs when a schema error is a type error (`hasBlockingErr`): one
  `<nil>: Invalid value: "null": some validation rules were not checked ...` instead.

Programs are compiled once per rule text (an LRU cache shared by all CRD
revisions), never per request.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from kubesim.errors import (
    FieldError,
    field_duplicate,
    field_forbidden,
    field_invalid,
    field_required,
)
from kubesim.schemas import MISSING

_OLD_SELF = re.compile(r"\boldSelf\b")
_NO_SUCH_MEMBER = re.compile(r"no such member in mapping: '(.*)'")
BLOCKED = (
    "some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation"
)


class RuleCompileError(Exception):
    """A rule cel-python cannot parse; the text is CEL's `ERROR: <input>:L:C: ...`."""


@dataclass(frozen=True)
class Rule:
    text: str
    message: str
    explain: str  # ruleErrorString: the message, or the rule without one
    reason: str | None
    field_path: str
    transition: bool


@lru_cache(maxsize=2048)
def compile_rule(text: str) -> Any:
    """The compiled program of one rule (cached: a CRD's rules compile once)."""
    env = celpy.Environment()
    try:
        return env.program(env.compile(text))
    except CELParseError as exc:
        line, column = getattr(exc, "line", None) or 1, getattr(exc, "column", None) or 1
        source = text.splitlines()[line - 1] if text else ""
        caret = "." * max(column - 1, 0) + "^"
        raise RuleCompileError(f"ERROR: <input>:{line}:{column}: Syntax error\n | {source}\n | {caret}") from exc


def rules_of(schema: dict[str, Any]) -> list[Rule]:
    out = []
    for raw in schema.get("x-kubernetes-validations") or []:
        text = str(raw.get("rule") or "")
        message = str(raw.get("message") or "").strip() or f"failed rule: {text.strip()}"
        out.append(
            Rule(
                text=text,
                message=message,
                explain=str(raw.get("message") or "").strip() or text.strip(),
                reason=raw.get("reason"),
                field_path=str(raw.get("fieldPath") or ""),
                transition=bool(_OLD_SELF.search(text)),
            )
        )
    return out


def schema_rules(schema: dict[str, Any], path: str) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """Every rule of a schema tree: (the schema node's path, index, the raw rule), for CRD validation."""
    for i, raw in enumerate(schema.get("x-kubernetes-validations") or []):
        yield path, i, raw
    for name, sub in (schema.get("properties") or {}).items():
        if isinstance(sub, dict):
            yield from schema_rules(sub, f"{path}.properties[{name}]")
    if isinstance(schema.get("items"), dict):
        yield from schema_rules(schema["items"], f"{path}.items")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from schema_rules(schema["additionalProperties"], f"{path}.additionalProperties")


def _path_text(path: str | None) -> str:
    return "<nil>" if path is None else path


def _child(path: str | None, name: str) -> str:
    return name if path is None else f"{path}.{name}"


def _visible(value: Any) -> Any:
    """The root as rules see it: ObjectMeta reduced to `name` and `generateName`."""
    if isinstance(value, dict) and isinstance(value.get("metadata"), dict):
        meta = {k: v for k, v in value["metadata"].items() if k in ("name", "generateName")}
        return {**value, "metadata": meta}
    return value


def _self_value(value: Any, *, root: bool) -> Any:
    return json_to_cel(_visible(value) if root else value)


def _failure(rule: Rule, path: str | None, type_name: str) -> FieldError:
    where = _path_text(path)
    if rule.field_path:
        relative = rule.field_path[1:] if rule.field_path.startswith(".") else rule.field_path
        where = _child(path, relative)
    if rule.reason == "FieldValueForbidden":
        return field_forbidden(where, rule.message)
    if rule.reason == "FieldValueRequired":
        return field_required(where, rule.message)
    if rule.reason == "FieldValueDuplicate":
        return field_duplicate(where, type_name)
    return field_invalid(where, type_name, rule.message)


def _runtime_error(exc_text: str, rule: Rule) -> str:
    match = _NO_SUCH_MEMBER.search(exc_text)
    if match:
        exc_text = f"no such key: {match.group(1)}"
    elif "no matching overload" in exc_text:
        return (
            "'no such overload': call arguments did not match a supported operator, "
            f"function or macro signature for rule: {rule.explain}"
        )
    return f"{exc_text} evaluating rule: {rule.explain}"


def _evaluate(rule: Rule, value: Any, old: Any, *, root: bool) -> tuple[bool, str | None]:
    """(passed, runtime error text)."""
    if rule.text.strip() == "self == oldSelf" and old is not MISSING:
        # The plain immutability idiom, without a round trip through CEL; on the root, as the
        # rule sees it (metadata reduced to name and generateName, as in the CEL path below).
        return (_visible(old) == _visible(value) if root else old == value), None
    program = compile_rule(rule.text)
    activation = {"self": _self_value(value, root=root)}
    if old is not MISSING:
        activation["oldSelf"] = _self_value(old, root=root)
    try:
        result = program.evaluate(activation)
    except CELEvalError as exc:
        return False, str(exc.args[0] if exc.args else exc)
    if isinstance(result, CELEvalError):
        return False, str(result.args[0] if result.args else result)
    return isinstance(result, celtypes.BoolType) and bool(result), None


def validate(obj: dict[str, Any], schema: dict[str, Any], old: Any = MISSING) -> list[FieldError]:
    """The failing rules of a custom resource (`old`: the stored object on update)."""
    errors: list[FieldError] = []
    _walk(obj, schema, old, None, errors, root=True)
    return errors


def _walk(
    value: Any, schema: dict[str, Any], old: Any, path: str | None, errors: list[FieldError], *, root: bool
) -> None:
    # The root's metadata is volatile (resourceVersion, managedFields); rules see its name only.
    unchanged = old is not MISSING and (_visible(old) == _visible(value) if root else old == value)
    type_name = str(schema.get("type") or "")
    for rule in rules_of(schema) if value is not None else ():
        if rule.transition and old is MISSING:
            continue
        if unchanged and not rule.transition:
            continue  # ratcheting
        passed, failure = _evaluate(rule, value, old, root=root)
        if failure is not None:
            errors.append(field_invalid(_path_text(path), type_name, _runtime_error(failure, rule)))
        elif not passed:
            errors.append(_failure(rule, path, type_name))
    if isinstance(value, dict):
        old_map = old if isinstance(old, dict) else {}
        properties = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        for key, sub_value in value.items():
            if root and key == "metadata":
                continue
            sub = properties.get(key)
            if sub is not None:
                _walk(sub_value, sub, old_map.get(key, MISSING), _child(path, key), errors, root=False)
            elif isinstance(additional, dict):
                where = f"{_path_text(path)}[{key}]" if path is not None else f"[{key}]"
                _walk(sub_value, additional, old_map.get(key, MISSING), where, errors, root=False)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = schema["items"]
        olds = _correlate(value, old, schema)
        for i, item in enumerate(value):
            _walk(item, items, olds[i], f"{_path_text(path)}[{i}]", errors, root=False)


def _correlate(value: list[Any], old: Any, schema: dict[str, Any]) -> list[Any]:
    """Old items of a `x-kubernetes-list-type: map` list, matched by their keys; none otherwise."""
    keys = schema.get("x-kubernetes-list-map-keys") or []
    if schema.get("x-kubernetes-list-type") != "map" or not keys or not isinstance(old, list):
        return [MISSING] * len(value)
    by_key = {tuple(o.get(k) for k in keys): o for o in old if isinstance(o, dict)}
    return [by_key.get(tuple(v.get(k) for k in keys), MISSING) if isinstance(v, dict) else MISSING for v in value]


def has_blocking_error(errors: list[FieldError]) -> bool:
    return any(e.type == "FieldValueTypeInvalid" for e in errors)


def blocked_error() -> FieldError:
    return field_invalid("<nil>", None, BLOCKED)
