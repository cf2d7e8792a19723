"""Discovery parsing against documents recorded from kube-apiserver v1.36.2."""

from __future__ import annotations

import json
from typing import Any

import pytest
from recorded import REFERENCE

from storage_migrator.kube.discovery import (
    APIGroupListDoc,
    APIResourceListDoc,
    APIVersionsDoc,
    DiscoveredResource,
    parse_group_list,
    parse_resource_list,
    pick_preferred,
    preferred_versions,
)


def load(name: str) -> Any:
    return json.loads((REFERENCE / name).read_text())


@pytest.fixture(scope="module")
def core_v1() -> dict[str, DiscoveredResource]:
    doc: APIResourceListDoc = load("discovery-api-v1.json")
    return {r.resource: r for r in parse_resource_list(doc, preferred=True)}


def test_configmaps_and_events_hashes(core_v1: dict[str, DiscoveredResource]) -> None:
    configmaps = core_v1["configmaps"]
    assert (configmaps.group, configmaps.version, configmaps.kind) == (
        "",
        "v1",
        "ConfigMap",
    )
    assert configmaps.storage_version_hash == "qFsyl6wFWjQ="
    assert configmaps.namespaced
    assert {"list", "patch", "update"} <= set(configmaps.verbs)
    assert configmaps.persisted and not configmaps.is_subresource
    assert core_v1["events"].storage_version_hash == "r2yiGXH7wu8="
    assert core_v1["secrets"].storage_version_hash == "S6u1pOWzb84="


def test_subresources_and_virtual_resources_have_no_hash(
    core_v1: dict[str, DiscoveredResource],
) -> None:
    status = core_v1["pods/status"]
    assert status.is_subresource
    assert status.storage_version_hash == ""
    assert not status.persisted
    bindings = core_v1["bindings"]
    assert not bindings.is_subresource
    assert bindings.storage_version_hash == ""
    assert not bindings.persisted
    assert core_v1["componentstatuses"].storage_version_hash == ""
    assert not core_v1["namespaces"].namespaced


def test_group_version_document() -> None:
    resources = parse_resource_list(load("discovery-apis-apps-v1.json"))
    deployments = next(r for r in resources if r.resource == "deployments")
    assert (deployments.group, deployments.version) == ("apps", "v1")
    assert deployments.storage_version_hash == "8aSe+NMegvE="
    assert deployments.group_resource == "deployments.apps"
    scale = next(r for r in resources if r.resource == "deployments/scale")
    assert (scale.group, scale.version, scale.is_subresource) == ("apps", "v1", True)


def test_crd_hash_after_storage_flip() -> None:
    (widgets,) = parse_resource_list(load("discovery-crd-after-flip.json"))
    assert (widgets.group, widgets.version, widgets.resource) == (
        "bars.example.com",
        "v1",
        "widgets",
    )
    assert widgets.storage_version_hash == "dcbo7X9Z3o4="


def test_group_list_and_preferred_versions() -> None:
    groups: APIGroupListDoc = load("discovery-apis.json")
    core: APIVersionsDoc = load("discovery-api.json")
    pairs = parse_group_list(groups)
    assert ("apps", "v1") in pairs
    assert ("autoscaling", "v2") in pairs and ("autoscaling", "v1") in pairs
    preferred = preferred_versions(core=core, groups=groups)
    assert preferred[""] == "v1"
    assert preferred["autoscaling"] == "v2"
    assert preferred["events.k8s.io"] == "v1"


def entry(version: str, *, preferred: bool, resource: str = "hpa") -> DiscoveredResource:
    return DiscoveredResource(
        group="autoscaling",
        version=version,
        resource=resource,
        kind="X",
        namespaced=True,
        verbs=("list",),
        storage_version_hash="h",
        is_subresource=False,
        preferred=preferred,
    )


def test_pick_preferred_keeps_one_entry_per_group_resource() -> None:
    picked = pick_preferred(
        [
            entry("v1", preferred=False),
            entry("v2", preferred=True),
            entry("v1", preferred=False, resource="only-in-v1"),
        ]
    )
    by_resource = {r.resource: r.version for r in picked}
    assert by_resource == {"hpa": "v2", "only-in-v1": "v1"}
