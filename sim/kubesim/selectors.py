"""Label and field selectors, as the LIST and WATCH query parameters give them."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from kubesim.errors import bad_request

Predicate = Callable[[dict[str, Any]], bool]

_SET_RE = re.compile(r"^\s*(!?)([A-Za-z0-9_./-]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")


def _split_top(expr: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in expr:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def _label_term(term: str) -> Callable[[dict[str, str]], bool]:
    eq_op = next((op for op in ("!=", "==", "=") if op in term), None)
    if eq_op is not None:
        eq_key, eq_value = (s.strip() for s in term.split(eq_op, 1))
        negated = eq_op == "!="

        def equals(labels: dict[str, str]) -> bool:
            return (labels.get(eq_key) == eq_value) != negated

        return equals
    m = _SET_RE.match(term)
    if not m:
        raise bad_request(f"unable to parse requirement: {term!r}")
    negate, key, op, values = m.groups()
    allowed = {v.strip() for v in (values or "").split(",") if v.strip()}

    def member(labels: dict[str, str]) -> bool:
        if op == "in":
            return labels.get(key) in allowed
        if op == "notin":
            return labels.get(key) not in allowed
        return (key in labels) != bool(negate)

    return member


def label_selector(expr: str | None) -> Predicate:
    if not expr:
        return lambda obj: True
    terms = [_label_term(t) for t in _split_top(expr)]

    def match(obj: dict[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(t(labels) for t in terms)

    return match


_FIELDS: dict[str, Callable[[dict[str, Any]], str]] = {
    "metadata.name": lambda obj: (obj.get("metadata") or {}).get("name", ""),
    "metadata.namespace": lambda obj: (obj.get("metadata") or {}).get("namespace", ""),
}


def _field_term(getter: Callable[[dict[str, Any]], str], value: str, *, negated: bool) -> Predicate:
    def match(obj: dict[str, Any]) -> bool:
        return (getter(obj) == value) != negated

    return match


def field_selector(expr: str | None, *, kind: str = "") -> Predicate:
    if not expr:
        return lambda obj: True
    terms: list[Predicate] = []
    for term in _split_top(expr):
        for op in ("!=", "==", "="):
            if op in term:
                field, value = (s.strip() for s in term.split(op, 1))
                break
        else:
            raise bad_request(f"invalid field selector: {term!r}")
        if field not in _FIELDS:
            raise bad_request(f'field label not supported: "{field}"' + (f" for {kind}" if kind else ""))
        terms.append(_field_term(_FIELDS[field], value, negated=op == "!="))
    return lambda obj: all(t(obj) for t in terms)
