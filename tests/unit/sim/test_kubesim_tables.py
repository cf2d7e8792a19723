"""Server-side tables (sim/kubesim/tables.py): what `kubectl get` prints.

A CRD's `additionalPrinterColumns` are read with a small JSONPath (including the
filter form `[?(@.type=="Succeeded")]` printer columns use); `date` columns are
shown as apimachinery's `duration.HumanDuration` shows them.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from kubesim.resources import ResourceType, builtin_resources, resource_from_crd
from kubesim.tables import _walk, human_duration, to_table

JOB: dict[str, Any] = {
    "apiVersion": "batch.example.com/v1",
    "kind": "Run",
    "metadata": {"name": "j1", "creationTimestamp": "2000-01-01T00:00:00Z", "labels": {"a-b": "c"}},
    "spec": {"replicas": 3, "items": [{"n": 1}, {"n": 2}], "paused": False},
    "status": {
        "conditions": [
            {"type": "Complete", "status": "False"},
            {"type": "Succeeded", "status": "True", "reason": "Done"},
        ]
    },
}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (".metadata.name", "j1"),
        ("{.metadata.name}", "j1"),
        (" .metadata.name ", "j1"),
        (".metadata.labels.a-b", "c"),
        (".spec.replicas", 3),
        (".spec.paused", False),
        (".spec.items[1].n", 2),
        (".spec.items[0]", {"n": 1}),
        (".spec.items[*].n", [1, 2]),
        ('.status.conditions[?(@.type=="Succeeded")].status', "True"),
        ('.status.conditions[?(@.type=="Succeeded")].reason', "Done"),
        (".status.conditions[?(@.type=='Complete')].status", "False"),
        ('.status.conditions[?(@.type == "Complete")].status', "False"),
        ('.status.conditions[?(@.type=="Failed")].status', None),
        (".status.conditions[*].type", ["Complete", "Succeeded"]),
        (".spec.items[5]", None),
        (".spec.items[5].n", None),
        (".missing", None),
        (".metadata.name.deeper", None),
        ("metadata.name", None),  # not a path from the object's root
        (".spec.items[x]", None),
    ],
)
def test_jsonpath(path: str, expected: Any) -> None:
    assert _walk(JOB, path) == expected


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        # apimachinery/pkg/util/duration's own test table
        (1, "1s"),
        (70, "70s"),
        (190, "3m10s"),
        (70 * 60, "70m"),
        (47 * 3600, "47h"),
        (49 * 3600, "2d1h"),
        ((8 * 24 + 2) * 3600, "8d"),
        (367 * 24 * 3600, "367d"),
        ((365 * 2 * 24 + 25) * 3600, "2y1d"),
        ((365 * 8 * 24 + 2) * 3600, "8y"),
        # the boundaries
        (0, "0s"),
        (119, "119s"),
        (120, "2m"),
        (9 * 60 + 59, "9m59s"),
        (10 * 60 + 59, "10m"),
        (179 * 60, "179m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 10 * 60, "3h10m"),
        (7 * 3600 + 59 * 60, "7h59m"),
        (8 * 3600 + 59 * 60, "8h"),
        (48 * 3600, "2d"),
        (7 * 24 * 3600 + 23 * 3600, "7d23h"),
        (2 * 365 * 24 * 3600, "2y"),
        (20 * 365 * 24 * 3600, "20y"),
        # "allow deviation no more than 2 seconds (excluded)": int() truncates toward zero
        (-0.5, "0s"),
        (-1, "0s"),
        (-1.5, "0s"),
        (-1.999, "0s"),
        (-2, "<invalid>"),
        (-3600, "<invalid>"),
    ],
)
def test_human_duration(seconds: float, expected: str) -> None:
    assert human_duration(seconds) == expected


def run_type() -> ResourceType:
    crd = {
        "metadata": {"name": "runs.batch.example.com"},
        "spec": {
            "group": "batch.example.com",
            "scope": "Namespaced",
            "names": {"plural": "runs", "singular": "run", "kind": "Run"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "additionalPrinterColumns": [
                        {"name": "Succeeded", "type": "string",
                         "jsonPath": '.status.conditions[?(@.type=="Succeeded")].status'},
                        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas", "priority": 1},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                        {"name": "Missing", "type": "string", "jsonPath": ".status.nothing"},
                    ],
                }
            ],
        },
    }  # fmt: skip
    rt = resource_from_crd(crd)
    assert rt is not None
    return rt


def test_crd_printer_columns() -> None:
    table = to_table(run_type(), [JOB])
    assert (table["kind"], table["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    columns = table["columnDefinitions"]
    assert [c["name"] for c in columns] == ["Name", "Succeeded", "Replicas", "Age", "Missing"]
    assert [c["type"] for c in columns] == ["string", "string", "integer", "date", "string"]
    assert [c["priority"] for c in columns] == [0, 0, 1, 0, 0]
    assert columns[0]["format"] == "name"
    [row] = table["rows"]
    name, succeeded, replicas, age, missing = row["cells"]
    assert (name, succeeded, replicas, missing) == ("j1", "True", 3, None)
    assert re.fullmatch(r"\d+y", age), age  # created in 2000: more than 8 years ago
    assert row["object"] == {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": JOB["metadata"]}  # fmt: skip


def test_future_date_column_is_invalid() -> None:
    future = {**JOB, "metadata": {**JOB["metadata"], "creationTimestamp": "2999-01-01T00:00:00Z"}}
    assert to_table(run_type(), [future])["rows"][0]["cells"][3] == "<invalid>"


def test_built_in_columns() -> None:
    configmaps = next(rt for rt in builtin_resources() if rt.resource == "configmaps")
    objs = [{"metadata": {"name": f"cm{i}", "creationTimestamp": f"2026-01-0{i}T00:00:00Z"}} for i in (1, 2)]
    table = to_table(configmaps, objs)
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Created At"]
    assert [r["cells"] for r in table["rows"]] == [
        ["cm1", "2026-01-01T00:00:00Z"],
        ["cm2", "2026-01-02T00:00:00Z"],
    ]


@pytest.mark.parametrize(
    ("include", "expected"),
    [
        ("None", None),
        ("Metadata", {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": JOB["metadata"]}),
        ("Object", JOB),
    ],
)
def test_include_object(include: str, expected: dict[str, Any] | None) -> None:
    [row] = to_table(run_type(), [JOB], include=include)["rows"]
    assert row.get("object") == expected


def test_empty_table_keeps_its_columns() -> None:
    table = to_table(run_type(), [])
    assert table["rows"] == []
    assert len(table["columnDefinitions"]) == 5
