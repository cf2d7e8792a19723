"""The CRD manifests declare every field the models can write.

The API server prunes fields a structural schema does not declare, silently:
a status field missing here would be lost on every write.
"""

from __future__ import annotations

import types
import typing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Union

import pytest
import yaml
from pydantic import BaseModel

from storage_migrator.conditions import set_condition
from storage_migrator.models import (
    MAX_RECORDED_FAILURES,
    GroupResource,
    GroupVersionResource,
    MigrationProgress,
    ObjectFailure,
    StorageState,
    StorageVersionHash,
    StorageVersionMigration,
    new_storage_state,
    new_storage_version_migration,
)

CRDS = Path(__file__).resolve().parents[2] / "deployments" / "crds"
_SCALAR_TYPES = {str: "string", int: "integer", bool: "boolean", float: "number"}


def load_crd(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((CRDS / name).read_text())
    return doc


def version_of(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    return typing.cast(dict[str, Any], version)


def unwrap(annotation: Any) -> Any:
    """Strip Optional and Annotated to the type that is emitted."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            assert len(args) == 1, f"ambiguous union {annotation}"
            annotation = args[0]
        else:
            return annotation


def assert_schema_covers(model: type[BaseModel], schema: dict[str, Any], path: str) -> None:
    assert schema.get("type") == "object", path
    properties = schema.get("properties", {})
    for name, field in model.model_fields.items():
        key = field.alias or name
        where = f"{path}.{key}"
        if key == "metadata":
            assert "metadata" in properties
            continue
        assert key in properties, f"{where} is not declared in the CRD schema (would be pruned)"
        assert_type_covers(field.annotation, properties[key], where)


def assert_type_covers(annotation: Any, schema: dict[str, Any], where: str) -> None:
    annotation = unwrap(annotation)
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        assert_schema_covers(annotation, schema, where)
    elif origin is list:
        assert schema.get("type") == "array", where
        assert_type_covers(typing.get_args(annotation)[0], schema["items"], f"{where}[]")
    elif origin is Literal:
        assert schema.get("type") == "string", where
        if "enum" in schema:
            assert set(typing.get_args(annotation)) <= set(schema["enum"]), where
    elif annotation.__name__ == "datetime":
        assert schema == {**schema, "type": "string", "format": "date-time"}, where
    else:
        assert schema.get("type") == _SCALAR_TYPES[annotation], where


@pytest.mark.parametrize(
    ("file", "model", "kind"),
    [
        (
            "storageversionmigrations.yaml",
            StorageVersionMigration,
            "StorageVersionMigration",
        ),
        ("storagestates.yaml", StorageState, "StorageState"),
    ],
)
def test_schema_declares_every_model_field(file: str, model: type[BaseModel], kind: str) -> None:
    crd = load_crd(file)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["spec"]["group"] == "migration.k8s.io"
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["kind"] == kind
    version = version_of(crd)
    assert (version["name"], version["served"], version["storage"]) == (
        "v1alpha1",
        True,
        True,
    )
    assert version["subresources"] == {"status": {}}
    assert_schema_covers(model, version["schema"]["openAPIV3Schema"], kind)


def prune(value: Any, schema: dict[str, Any]) -> Any:
    """What a structural-schema API server keeps of a value (no preserve-unknown here)."""
    if isinstance(value, dict) and schema.get("type") == "object" and "properties" in schema:
        return {k: prune(v, schema["properties"][k]) for k, v in value.items() if k in schema["properties"]}
    if isinstance(value, list) and schema.get("type") == "array":
        return [prune(v, schema["items"]) for v in value]
    return value


def test_full_objects_survive_pruning() -> None:
    now = datetime(2026, 11, 22, tzinfo=UTC)
    migration = new_storage_version_migration(group="apps", version="v1", resource="deployments", name="m")
    migration.spec.continue_token = "tok"
    status = migration.status
    status.conditions = set_condition([], condition_type="Running", status="True", now=now, reason="r", message="m")
    status.phase = "Running"
    status.target_storage_version_hash = "h"
    status.progress = MigrationProgress(
        listed=1,
        rewritten=1,
        unchanged=1,
        gone=1,
        conflicted=1,
        failed=1,
        chunks=1,
        remaining_item_count=1,
    )
    status.started_at = status.finished_at = now
    status.failures = [
        ObjectFailure(namespace="n", name="x", code=422, reason="Invalid", message="m")
    ] * MAX_RECORDED_FAILURES
    state = new_storage_state(group="apps", resource="deployments")
    state.status.current_storage_version_hash = "h"
    state.status.last_heartbeat_time = now
    state.status.current_storage_version_hashes = [
        StorageVersionHash(reporter_id="r", current_storage_version_hash="h", last_heartbeat_time=now)
    ]
    for file, obj in (
        ("storageversionmigrations.yaml", migration),
        ("storagestates.yaml", state),
    ):
        schema = version_of(load_crd(file))["schema"]["openAPIV3Schema"]
        wire = obj.to_wire()
        assert prune(wire, schema) == wire


def immutable_with_defaults(schema: dict[str, Any]) -> str:
    """The immutability rule a `spec.resource` schema needs (issue 19, item 6): every declared
    field compared, an optional one with its default applied (omitted == ""), as apimachinery's
    semantic equality compares Go structs whose empty strings `omitempty` drops."""
    required = set(schema.get("required") or [])
    clauses = []
    for name, prop in sorted(schema["properties"].items(), key=lambda item: item[0] in required):  # optional first
        assert prop["type"] == "string", (name, "the default '' is a string's")
        if name in required:
            clauses.append(f"self.{name} == oldSelf.{name}")
        else:
            clauses.append(f"(has(self.{name}) ? self.{name} : '') == (has(oldSelf.{name}) ? oldSelf.{name} : '')")
    return " && ".join(clauses)


def test_resource_is_immutable_and_printer_columns_are_simple() -> None:
    for file, group_model in (
        ("storageversionmigrations.yaml", GroupVersionResource),
        ("storagestates.yaml", GroupResource),
    ):
        version = version_of(load_crd(file))
        resource = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["resource"]
        [rule] = resource["x-kubernetes-validations"]
        # Every field of spec.resource is compared (a field added without its clause fails here),
        # an omitted optional one as "": not `self == oldSelf`, which refused Go clients' updates.
        assert rule["rule"] == immutable_with_defaults(resource)
        assert "\n" not in rule["rule"] and "optionalOldSelf" not in rule  # a transition rule: updates only
        assert rule["message"].startswith("spec.resource is immutable; create another ")
        assert resource["required"] == ["resource"]
        assert set(resource["properties"]) == {f.alias or n for n, f in group_model.model_fields.items()}
        for column in version["additionalPrinterColumns"]:
            path = column["jsonPath"]
            assert path.startswith(".") and all(part.isidentifier() for part in path[1:].split(".")), path


def test_printer_columns() -> None:
    migrations = {
        c["name"]: c for c in version_of(load_crd("storageversionmigrations.yaml"))["additionalPrinterColumns"]
    }
    assert migrations["Resource"]["jsonPath"] == ".spec.resource.resource"
    assert migrations["Phase"]["jsonPath"] == ".status.phase"
    assert migrations["Age"] == {
        "name": "Age",
        "type": "date",
        "jsonPath": ".metadata.creationTimestamp",
    }
    assert {"Listed", "Rewritten", "Failed", "Group"} <= set(migrations)
    states = {c["name"]: c["jsonPath"] for c in version_of(load_crd("storagestates.yaml"))["additionalPrinterColumns"]}
    assert states["Persisted"] == ".status.persistedStorageVersionHashes"
    assert states["Current"] == ".status.currentStorageVersionHash"
    assert states["Heartbeat"] == ".status.lastHeartbeatTime"
