"""The Kubernetes access layer over HTTP against kubesim (real etcd behind it).

Objects are created with the official client, then read and written with
storage_migrator.kube; answers are held to what a real kube-apiserver v1.36
answers (tests/reference).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client import ApiClient

from storage_migrator.conditions import set_condition
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.discovery import discover, pick_preferred
from storage_migrator.kube.errors import AlreadyExists, Conflict, KubeError, NotFound
from storage_migrator.kube.listing import iterate_items, list_page
from storage_migrator.kube.reading import read_object, read_object_bytes
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.writing import (
    create_object,
    delete_object,
    patch_object,
    replace_object,
    rewrite_with_patch,
    rewrite_with_put,
)
from storage_migrator.models import StorageVersionMigration, new_storage_version_migration
from storage_migrator.settings import Settings

CONFIGMAPS = ResourceRef(version="v1", resource="configmaps")
CRDS_REF = ResourceRef(group="apiextensions.k8s.io", version="v1", resource="customresourcedefinitions")
MIGRATIONS = ResourceRef(group="migration.k8s.io", version="v1alpha1", resource="storageversionmigrations")
CRD_DIR = Path(__file__).resolve().parents[2] / "deployments" / "crds"
SENTINEL = "integration-sentinel-value"


@pytest.fixture
def api(kubesim: Any) -> Iterator[ApiClient]:
    client = api_client_from_settings(Settings(kubeconfig=Path(kubesim.kubeconfig)))
    yield client
    client.close()  # type: ignore[no-untyped-call]


def make_configmaps(api: ApiClient, namespace: str, count: int, *, padding: int = 0) -> list[str]:
    core = k8s.CoreV1Api(api)
    names = [f"cm-{i:03d}" for i in range(count)]
    for name in names:
        core.create_namespaced_config_map(
            namespace,
            k8s.V1ConfigMap(
                metadata=k8s.V1ObjectMeta(name=name),
                data={"k": SENTINEL, **({"pad": "x" * padding} if padding else {})},
            ),
        )
    return names


def test_list_pages_with_limit_and_continue(api: ApiClient, namespace: str) -> None:
    names = make_configmaps(api, namespace, 5)
    first = list_page(api, CONFIGMAPS, limit=2, namespace=namespace)
    assert len(first.items) == 2
    assert first.continue_token
    assert first.remaining_item_count == 3
    seen = [item["metadata"]["name"] for item in first.items]
    token: str | None = first.continue_token
    while token:
        page = list_page(api, CONFIGMAPS, limit=2, continue_token=token, namespace=namespace)
        assert page.resource_version == first.resource_version  # one snapshot
        seen += [item["metadata"]["name"] for item in page.items]
        token = page.continue_token
    assert seen == names


def test_cluster_wide_list_reaches_every_namespace(api: ApiClient, namespace: str) -> None:
    names = set(make_configmaps(api, namespace, 3))
    found = {
        item["metadata"]["name"]
        for item in iterate_items(api, CONFIGMAPS, limit=2, metadata_only=True)
        if item["metadata"].get("namespace") == namespace
    }
    assert found == names


def test_metadata_only_list_carries_no_data(api: ApiClient, namespace: str) -> None:
    make_configmaps(api, namespace, 2, padding=4096)
    full = list_page(api, CONFIGMAPS, limit=10, namespace=namespace, metadata_only=False)
    meta = list_page(api, CONFIGMAPS, limit=10, namespace=namespace, metadata_only=True)
    assert full.kind == "ConfigMapList"
    assert all(item["data"]["k"] == SENTINEL for item in full.items)
    assert meta.kind == "PartialObjectMetadataList"
    assert len(meta.items) == 2
    for item in meta.items:
        assert item["kind"] == "PartialObjectMetadata"
        assert "data" not in item
        assert item["metadata"]["resourceVersion"]
    assert SENTINEL.encode() not in json.dumps(meta.items).encode()
    assert meta.response_bytes < full.response_bytes


def test_noop_merge_patch_keeps_the_resource_version(api: ApiClient, namespace: str) -> None:
    (name,) = make_configmaps(api, namespace, 1)
    before = read_object(api, CONFIGMAPS, name=name, namespace=namespace)
    rv = before["metadata"]["resourceVersion"]
    result = rewrite_with_patch(api, CONFIGMAPS, name=name, namespace=namespace, resource_version=rv)
    assert (result.name, result.namespace) == (name, namespace)
    assert result.old_resource_version == rv
    assert result.new_resource_version == rv
    assert not result.rewritten
    assert SENTINEL not in repr(result)
    after = read_object(api, CONFIGMAPS, name=name, namespace=namespace)
    assert after == before


def test_stale_resource_version_is_a_conflict(api: ApiClient, namespace: str) -> None:
    (name,) = make_configmaps(api, namespace, 1)
    rv = read_object(api, CONFIGMAPS, name=name, namespace=namespace)["metadata"]["resourceVersion"]
    k8s.CoreV1Api(api).patch_namespaced_config_map(name, namespace, {"data": {"k": "new"}})
    with pytest.raises(Conflict) as caught:
        rewrite_with_patch(api, CONFIGMAPS, name=name, namespace=namespace, resource_version=rv)
    assert caught.value.code == 409
    assert "the object has been modified" in caught.value.message
    assert read_object(api, CONFIGMAPS, name=name, namespace=namespace)["data"] == {"k": "new"}


def test_missing_object_is_not_found(api: ApiClient, namespace: str) -> None:
    with pytest.raises(NotFound):
        rewrite_with_patch(api, CONFIGMAPS, name="nope", namespace=namespace, resource_version="1")
    with pytest.raises(NotFound):
        read_object(api, CONFIGMAPS, name="nope", namespace=namespace)


def test_unknown_resource_is_not_found(api: ApiClient) -> None:
    with pytest.raises(NotFound) as caught:
        list_page(api, ResourceRef(version="v1", resource="nosuchthings"), limit=1)
    assert caught.value.code == 404


def test_put_fallback_writes_the_bytes_as_read(api: ApiClient, namespace: str) -> None:
    (name,) = make_configmaps(api, namespace, 1)
    raw = read_object_bytes(api, CONFIGMAPS, name=name, namespace=namespace)
    result = rewrite_with_put(api, CONFIGMAPS, body=raw)
    assert result.name == name and result.namespace == namespace
    assert result.old_resource_version == json.loads(raw)["metadata"]["resourceVersion"]
    assert read_object(api, CONFIGMAPS, name=name, namespace=namespace)["data"] == {"k": SENTINEL}
    # Someone writes after our read: the PUT of the old bytes must not win.
    k8s.CoreV1Api(api).patch_namespaced_config_map(name, namespace, {"data": {"k": "x"}})
    with pytest.raises(Conflict):
        rewrite_with_put(api, CONFIGMAPS, body=raw)
    assert read_object(api, CONFIGMAPS, name=name, namespace=namespace)["data"] == {"k": "x"}


def test_discovery_reports_configmaps_hash(api: ApiClient) -> None:
    found = discover(api)
    assert not found.failed
    by_name = {(r.group, r.resource): r for r in pick_preferred(found.resources)}
    configmaps = by_name[("", "configmaps")]
    assert configmaps.storage_version_hash == "qFsyl6wFWjQ="
    assert configmaps.namespaced
    assert {"list", "patch"} <= set(configmaps.verbs)
    assert found.preferred_versions[""] == "v1"


def install_crds(api: ApiClient) -> None:
    for path in sorted(CRD_DIR.glob("*.yaml")):
        with contextlib.suppress(AlreadyExists):
            create_object(api, CRDS_REF, yaml.safe_load(path.read_text()))
    deadline = time.monotonic() + 30
    while True:
        try:
            list_page(api, MIGRATIONS, limit=1)
            return
        except NotFound:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_our_custom_resources_round_trip(api: ApiClient) -> None:
    install_crds(api)
    request = new_storage_version_migration(group="", version="v1", resource="configmaps")
    created = StorageVersionMigration.model_validate(create_object(api, MIGRATIONS, request.to_wire()))
    name = created.metadata.name
    assert name and name.startswith("configmaps-")
    try:
        created.status.conditions = set_condition(
            [],
            condition_type="Running",
            status="True",
            now=datetime.now(UTC),
        )
        created.status.phase = "Running"
        updated = StorageVersionMigration.model_validate(
            replace_object(api, MIGRATIONS, created.to_wire(), subresource="status")
        )
        assert updated.status.phase == "Running"
        assert updated.status.conditions[0].type == "Running"
        with pytest.raises(Conflict):  # the resourceVersion we hold is stale now
            replace_object(api, MIGRATIONS, created.to_wire(), subresource="status")
        patched = patch_object(api, MIGRATIONS, name=name, patch={"spec": {"continueToken": "abc"}})
        assert patched["spec"]["continueToken"] == "abc"
    finally:
        delete_object(api, MIGRATIONS, name=name)
    with pytest.raises(NotFound):
        read_object(api, MIGRATIONS, name=name)


def test_errors_never_carry_object_bodies(api: ApiClient, namespace: str) -> None:
    (name,) = make_configmaps(api, namespace, 1)
    with pytest.raises(KubeError) as caught:
        rewrite_with_patch(api, CONFIGMAPS, name=name, namespace=namespace, resource_version="1")
    assert SENTINEL not in str(caught.value)
    assert SENTINEL not in repr(caught.value)
