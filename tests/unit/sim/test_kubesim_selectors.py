"""Label and field selectors (sim/kubesim/selectors.py), as LIST and WATCH take them.

The label grammar is apimachinery's `labels.Parse`: `=`, `==`, `!=`, `in`,
`notin`, `key` (exists), `!key` (does not exist), terms joined by commas (AND).
`!=` and `notin` also match objects without the label. Field selectors support
`metadata.name` and `metadata.namespace` (every resource has them); any other
field is a 400 BadRequest.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubesim.errors import StatusError
from kubesim.selectors import field_selector, label_selector

OBJECTS: dict[str, dict[str, Any]] = {
    "web": {"metadata": {"name": "web", "namespace": "a", "labels": {"app": "web", "tier": "front"}}},
    "db": {"metadata": {"name": "db", "namespace": "a", "labels": {"app": "db", "tier": "back"}}},
    "cache": {"metadata": {"name": "cache", "namespace": "b", "labels": {"app": "cache", "env": ""}}},
    "bare": {"metadata": {"name": "bare", "namespace": "b"}},
    "nolabels": {"metadata": {"name": "nolabels", "namespace": "b", "labels": {}}},
    "dotted": {"metadata": {"name": "dotted", "namespace": "c", "labels": {"example.com/team": "x_y.z-1"}}},
}


def matching(predicate: Any) -> set[str]:
    return {name for name, obj in OBJECTS.items() if predicate(obj)}


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (None, set(OBJECTS)),
        ("", set(OBJECTS)),
        ("app=web", {"web"}),
        ("app==web", {"web"}),
        ("app = web", {"web"}),
        ("app!=web", {"db", "cache", "bare", "nolabels", "dotted"}),  # no label matches !=
        ("app in (web,db)", {"web", "db"}),
        ("app in ( web , db )", {"web", "db"}),
        ("app in (web)", {"web"}),
        ("app notin (web,db)", {"cache", "bare", "nolabels", "dotted"}),  # no label matches notin
        ("app", {"web", "db", "cache"}),
        ("!app", {"bare", "nolabels", "dotted"}),
        ("env", {"cache"}),  # exists, with an empty value
        ("env=", {"cache"}),
        ("app,tier", {"web", "db"}),
        ("app=web,tier=front", {"web"}),
        ("app=web,tier=back", set()),
        ("app in (web,db),tier!=back", {"web"}),
        ("tier notin (front),app", {"db", "cache"}),
        ("!tier,app", {"cache"}),
        ("example.com/team=x_y.z-1", {"dotted"}),
        ("example.com/team", {"dotted"}),
        ("app=nope", set()),
    ],
)
def test_label_selector(expr: str | None, expected: set[str]) -> None:
    assert matching(label_selector(expr)) == expected


@pytest.mark.parametrize("expr", ["app in web", "app in (web", "in (a)", "app notin", "a b"])
def test_unparsable_label_selector_is_a_bad_request(expr: str) -> None:
    with pytest.raises(StatusError) as info:
        label_selector(expr)
    assert (info.value.code, info.value.reason) == (400, "BadRequest")


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (None, set(OBJECTS)),
        ("", set(OBJECTS)),
        ("metadata.name=web", {"web"}),
        ("metadata.name==web", {"web"}),
        ("metadata.name!=web", set(OBJECTS) - {"web"}),
        ("metadata.namespace=b", {"cache", "bare", "nolabels"}),
        ("metadata.namespace=b,metadata.name!=bare", {"cache", "nolabels"}),
        ("metadata.namespace!=a,metadata.namespace!=b", {"dotted"}),
        ("metadata.name=nope", set()),
    ],
)
def test_field_selector(expr: str | None, expected: set[str]) -> None:
    assert matching(field_selector(expr, kind="ConfigMap")) == expected


@pytest.mark.parametrize(("expr", "field"), [("spec.foo=bar", "spec.foo"), ("status.phase!=Running", "status.phase")])
def test_unsupported_field_is_a_bad_request(expr: str, field: str) -> None:
    with pytest.raises(StatusError) as info:
        field_selector(expr, kind="ConfigMap")
    err = info.value
    assert (err.code, err.reason) == (400, "BadRequest")
    assert "field label not supported" in err.message
    assert field in err.message
    assert err.body()["status"] == "Failure"


@pytest.mark.parametrize("expr", ["metadata.name", "web"])
def test_field_selector_without_operator_is_a_bad_request(expr: str) -> None:
    with pytest.raises(StatusError) as info:
        field_selector(expr)
    assert info.value.code == 400
