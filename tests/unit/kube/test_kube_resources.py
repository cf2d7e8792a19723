"""URL paths of resources (storage_migrator.kube.resources)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from storage_migrator.kube.resources import ResourceRef

CONFIGMAPS = ResourceRef(version="v1", resource="configmaps")
DEPLOYMENTS = ResourceRef(group="apps", version="v1", resource="deployments")
MIGRATIONS = ResourceRef(group="migration.k8s.io", version="v1alpha1", resource="storageversionmigrations")


@pytest.mark.parametrize(
    ("ref", "namespace", "path"),
    [
        (CONFIGMAPS, None, "/api/v1/configmaps"),
        (CONFIGMAPS, "default", "/api/v1/namespaces/default/configmaps"),
        (DEPLOYMENTS, None, "/apis/apps/v1/deployments"),
        (
            DEPLOYMENTS,
            "kube-system",
            "/apis/apps/v1/namespaces/kube-system/deployments",
        ),
    ],
)
def test_collection_paths(ref: ResourceRef, namespace: str | None, path: str) -> None:
    assert ref.collection_path(namespace=namespace) == path


def test_object_paths() -> None:
    assert CONFIGMAPS.object_path(name="a", namespace="ns") == "/api/v1/namespaces/ns/configmaps/a"
    assert (
        MIGRATIONS.object_path(name="secrets-x", subresource="status")
        == "/apis/migration.k8s.io/v1alpha1/storageversionmigrations/secrets-x/status"
    )


def test_names_cannot_escape_their_segment() -> None:
    with pytest.raises(ValueError, match="path segment"):
        CONFIGMAPS.object_path(name="../secrets", namespace="ns")
    with pytest.raises(ValueError):
        CONFIGMAPS.object_path(name="..", namespace="ns")


def test_names_and_coordinates() -> None:
    assert CONFIGMAPS.api_version == "v1"
    assert DEPLOYMENTS.api_version == "apps/v1"
    assert CONFIGMAPS.group_resource == "configmaps"
    assert DEPLOYMENTS.group_resource == "deployments.apps"
    assert str(DEPLOYMENTS) == "deployments.v1.apps"
    assert DEPLOYMENTS.describe(name="d", namespace="ns") == "deployments.v1.apps ns/d"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"version": "v1", "resource": "Config Maps"},
        {"version": "", "resource": "configmaps"},
        {"group": "Apps/", "version": "v1", "resource": "deployments"},
        {"version": "v1", "resource": "pods/status"},
    ],
)
def test_malformed_coordinates_are_rejected(kwargs: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        ResourceRef(**kwargs)
