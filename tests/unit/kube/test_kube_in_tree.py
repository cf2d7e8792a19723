"""Reading kube-controller-manager's own migrations (``storagemigration.k8s.io``, issue 36 item 4).

Against what a real kube-apiserver v1.36.2 answered (tests/reference: svm-created.json,
svm-succeeded.json, svm-unknown-resource.json, discovery-apis-storagemigration-v1beta1.json).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from recorded import REFERENCE

from storage_migrator.kube.discovery import DiscoveredResource, parse_resource_list
from storage_migrator.kube.in_tree import InTreeMigration, creator_of, in_tree_version


def recorded(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((REFERENCE / name).read_text())
    return doc


def test_an_object_as_created_is_pending_with_no_resource_version() -> None:
    m = InTreeMigration.from_object(recorded("svm-created.json"))
    assert m is not None
    assert (m.api_version, m.name, m.uid) == (
        "storagemigration.k8s.io/v1beta1",
        "ref-configmaps",
        "366962f3-5c21-4874-b994-b2f7cc62a597",
    )
    assert (m.group, m.resource, m.group_resource) == ("", "configmaps", "configmaps")
    assert m.phase == "Pending" and not m.finished
    assert m.resource_version is None and m.running_since is None and m.finished_at is None
    assert m.created_at == datetime(2026, 11, 29, 2, 7, 4, tzinfo=UTC)
    assert m.created_by is None, "the recording was printed without managedFields: the object does not say"


def test_a_succeeded_object_says_where_it_migrated_up_to() -> None:
    """kcm's controller: Running=False (MigrationCompleted), Succeeded=True, status.resourceVersion
    the list resourceVersion it migrated up to (40835, after its creation at 40834)."""
    m = InTreeMigration.from_object(recorded("svm-succeeded.json"))
    assert m is not None
    assert m.phase == "Succeeded" and m.finished
    assert m.resource_version == "40835"
    assert m.reason == "StorageVersionMigrationSucceeded" and m.message == ""
    assert m.finished_at == datetime(2026, 11, 29, 2, 8, 26, tzinfo=UTC)
    assert m.running_since == m.finished_at, "Running's last transition: to False, at the end"
    assert m.display_name == "storageversionmigrations.storagemigration.k8s.io/ref-configmaps"


def test_a_failed_object_says_why() -> None:
    m = InTreeMigration.from_object(recorded("svm-unknown-resource.json"))
    assert m is not None
    assert m.phase == "Failed" and m.finished
    assert (m.group_resource, m.reason, m.message) == (
        "nothings.nope.example.com",
        "StorageVersionMigrationFailed",
        "resource does not exist in discovery",
    )
    assert m.resource_version is None


def test_a_running_object() -> None:
    obj = recorded("svm-created.json")
    obj["status"] = {
        "conditions": [{"type": "Running", "status": "True", "lastTransitionTime": "2026-11-29T02:07:10Z",
                        "reason": "", "message": ""}],
        "resourceVersion": "40835",
    }  # fmt: skip
    m = InTreeMigration.from_object(obj)
    assert m is not None and m.phase == "Running" and not m.finished
    assert m.running_since == datetime(2026, 11, 29, 2, 7, 10, tzinfo=UTC) and m.finished_at is None


@pytest.mark.parametrize("broken", [{"metadata": {}}, {"metadata": {"name": "x", "uid": "u"}, "spec": {}}, {}])
def test_an_object_without_name_uid_or_resource_is_left_out(broken: dict[str, Any]) -> None:
    assert InTreeMigration.from_object(broken) is None


def entry(manager: str, *, time: str | None = "2026-11-29T02:07:04Z", spec: bool = True,
          subresource: str | None = None, operation: str = "Update") -> dict[str, Any]:  # fmt: skip
    fields: dict[str, Any] = {"f:spec": {"f:resource": {}}} if spec else {"f:metadata": {"f:labels": {}}}
    found: dict[str, Any] = {"manager": manager, "operation": operation, "apiVersion": "storagemigration.k8s.io/v1beta1",
                             "fieldsType": "FieldsV1", "fieldsV1": fields}  # fmt: skip
    if time is not None:
        found["time"] = time
    if subresource:
        found["subresource"] = subresource
        found["fieldsV1"] = {"f:status": {}}
    return found


@pytest.mark.parametrize(
    ("managed", "creator"),
    [
        # `kubectl create -f`: its manager, then kcm's status writes through /status.
        ([entry("kubectl-create"), entry("kube-controller-manager", subresource="status")], "kubectl-create"),
        # Listed in another order (kube-apiserver sorts them): still the owner of spec.
        (
            [entry("kube-controller-manager", subresource="status"), entry("kubectl-client-side-apply")],
            "kubectl-client-side-apply",
        ),
        # A server-side apply (kubectl apply --server-side; Gardener's clients apply too).
        ([entry("gardenlet", operation="Apply")], "gardenlet"),
        # Someone labelled it later: the creator owns spec, the labeller does not.
        ([entry("labeller", spec=False, time="2026-11-29T02:09:00Z"), entry("provider-tool")], "provider-tool"),
        # Two owners of spec (the same spec applied again): the earlier.
        ([entry("second", time="2026-11-29T03:00:00Z"), entry("first")], "first"),
        # Nobody owns spec (an entry shape we do not know): the earliest manager that is not status's.
        ([entry("late", spec=False, time="2026-11-29T03:00:00Z"), entry("early", spec=False)], "early"),
        # Only the controller's status writes, or nothing: the object does not say.
        ([entry("kube-controller-manager", subresource="status")], None),
        ([], None),
    ],
)
def test_the_creator_is_the_field_manager_that_owns_spec(managed: list[dict[str, Any]], creator: str | None) -> None:
    assert creator_of({"managedFields": managed}) == creator
    obj = recorded("svm-created.json")
    obj["metadata"]["managedFields"] = managed
    found = InTreeMigration.from_object(obj)
    assert found is not None and found.created_by == creator


def resources_of(*versions: str) -> list[DiscoveredResource]:
    doc = recorded("discovery-apis-storagemigration-v1beta1.json")
    out: list[DiscoveredResource] = []
    for version in versions:
        out += parse_resource_list({**doc, "groupVersion": f"storagemigration.k8s.io/{version}"})  # type: ignore[typeddict-item]
    return out


@pytest.mark.parametrize(
    ("served", "read"),
    [
        (("v1beta1",), "v1beta1"),  # 1.35, 1.36 with the gate and runtime-config
        (("v1",), "v1"),  # 1.37
        (("v1", "v1beta1"), "v1"),  # both served: v1, the GA one
        ((), None),  # not served: nothing to read (no error)
    ],
)
def test_v1_is_read_where_it_is_served(served: tuple[str, ...], read: str | None) -> None:
    assert in_tree_version(resources_of(*served)) == read
