"""kubesim's in-tree `storagemigration.k8s.io` API held to what a real kube-apiserver answers
(issue 36, item 6).

Every expectation that a recording covers is read from `tests/reference/` (a real v1.36.2 with
`StorageVersionMigrator` on): discovery, an object as created, the two recorded 422s. What no
recording covers follows `pkg/registry/storagemigration/storagemigration/strategy.go` and
`pkg/apis/storagemigration/validation/validation.go` (sim/kubesim/storagemigration.py says
which rule comes from where). v1.37 serves the same API as `v1` (GA) beside `v1beta1`, and
stores `v1beta1`. Raw HTTP, so the JSON compared is the JSON sent.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Kubesim
from kube_http import Http
from recorded import REFERENCE

pytestmark = pytest.mark.integration

GROUP = "storagemigration.k8s.io"
V1 = f"/apis/{GROUP}/v1/storageversionmigrations"
V1BETA1 = f"/apis/{GROUP}/v1beta1/storageversionmigrations"
MERGE = "application/merge-patch+json"


def recorded(name: str) -> Any:
    return json.loads((REFERENCE / name).read_text())


@pytest.fixture
def http(kubesim: Kubesim) -> Iterator[Http]:
    """The in-tree API served, its controller off (these tests are about the API alone); the
    migrations made are deleted, the controller switched back on."""
    kubesim.admin.set_feature_gates({"StorageVersionMigrator": True})
    kubesim.admin.set_svm_controller(enabled=False)
    client = Http(kubesim.url)
    try:
        yield client
    finally:
        client.ok("DELETE", V1)
        kubesim.admin.set_svm_controller(enabled=True)  # the kubesim fixture puts the gate back


def svm(name: str, resource: str = "configmaps", group: str = "", api_version: str = "v1beta1") -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{api_version}",
        "kind": "StorageVersionMigration",
        "metadata": {"name": name},
        "spec": {"resource": {"group": group, "resource": resource}},
    }


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ----- discovery -------------------------------------------------------------------
def test_both_versions_are_discovered_as_the_real_server_lists_them(http: Http) -> None:
    """reference/discovery-apis-storagemigration-v1beta1.json for v1beta1; v1 (v1.37) is the same
    document under its own group version, with the hash of the storage version, v1beta1."""
    reference = recorded("discovery-apis-storagemigration-v1beta1.json")
    assert http.ok("GET", f"/apis/{GROUP}/v1beta1") == reference
    assert http.ok("GET", f"/apis/{GROUP}/v1") == {**reference, "groupVersion": f"{GROUP}/v1"}
    group = http.ok("GET", f"/apis/{GROUP}")
    assert [v["version"] for v in group["versions"]] == ["v1", "v1beta1"]
    assert group["preferredVersion"] == {"groupVersion": f"{GROUP}/v1", "version": "v1"}


def test_the_api_goes_with_its_feature_gate(http: Http, kubesim: Kubesim) -> None:
    kubesim.admin.set_feature_gates({"StorageVersionMigrator": False})
    try:
        assert http("GET", V1)[0] == 404
        assert GROUP not in {g["name"] for g in http.ok("GET", "/apis")["groups"]}
    finally:
        kubesim.admin.set_feature_gates({"StorageVersionMigrator": True})


# ----- writes ----------------------------------------------------------------------
def test_a_created_object_is_shaped_and_stored_as_the_real_one(http: Http, kubesim: Kubesim) -> None:
    """reference/svm-created.json: `spec.resource` with its group written out, `status: {}`, no
    generation; stored under /registry/storageversionmigrations/ in the storage version."""
    reference = recorded("svm-created.json")
    name = unique("ref-configmaps")
    created = http.ok("POST", V1BETA1, svm(name))
    assert {k: created[k] for k in ("apiVersion", "kind", "spec", "status")} == {
        k: reference[k] for k in ("apiVersion", "kind", "spec", "status")
    }
    assert set(reference["metadata"]) <= set(created["metadata"])
    assert "generation" not in created["metadata"]
    as_v1 = http.ok("GET", f"{V1}/{name}")
    assert as_v1["apiVersion"] == f"{GROUP}/v1"
    assert as_v1["spec"] == reference["spec"]
    kv, _ = kubesim.etcd.get(f"/registry/storageversionmigrations/{name}".encode())
    assert kv is not None
    assert json.loads(kv.value)["apiVersion"] == f"{GROUP}/v1beta1"


def test_an_empty_resource_is_the_recorded_422(http: Http) -> None:
    body = svm("ref-bad")
    body["spec"]["resource"]["resource"] = ""
    assert http("POST", V1BETA1, body) == (422, recorded("svm-empty-resource-422.json"))


def test_a_changed_spec_is_the_recorded_422_by_put_and_by_patch(http: Http) -> None:
    expected = recorded("svm-spec-immutable-422.json")
    created = http.ok("POST", V1BETA1, svm("ref-configmaps"))
    changed = {**created, "spec": {"resource": {"group": "", "resource": "secrets"}}}
    assert http("PUT", f"{V1BETA1}/ref-configmaps", changed) == (422, expected)
    patch = {"spec": {"resource": {"resource": "secrets"}}}
    assert http("PATCH", f"{V1BETA1}/ref-configmaps", patch, ctype=MERGE) == (422, expected)


def test_an_update_must_name_the_resource_version_it_read(http: Http) -> None:
    created = http.ok("POST", V1, svm(unique("m"), api_version="v1"))
    name = created["metadata"]["name"]
    unconditional = {**created, "metadata": {"name": name, "labels": {"a": "b"}}}
    code, body = http("PUT", f"{V1}/{name}", unconditional)
    assert code == 422
    assert body["message"].endswith("metadata.resourceVersion: Invalid value: 0x0: must be specified for an update")
    labelled = http.ok("PATCH", f"{V1}/{name}", {"metadata": {"labels": {"a": "b"}}}, ctype=MERGE)
    assert labelled["metadata"]["labels"] == {"a": "b"}


def test_status_is_written_through_status_only(http: Http) -> None:
    name = unique("m")
    created = http.ok("POST", V1, {**svm(name, api_version="v1"), "status": {"resourceVersion": "5"}})
    assert created["status"] == {}  # cleared on create
    condition = {"type": "Running", "status": "True", "lastTransitionTime": "2026-11-29T02:07:04Z",
                 "reason": "MigrationRunning", "message": "The migration is running"}  # fmt: skip
    ignored = http.ok("PATCH", f"{V1}/{name}", {"status": {"conditions": [condition]}}, ctype=MERGE)
    assert ignored["status"] == {}
    # Through /status: the status is taken and a spec change is not.
    patch = {
        "spec": {"resource": {"resource": "secrets"}},
        "status": {"conditions": [condition], "resourceVersion": "5"},
    }
    written = http.ok("PATCH", f"{V1}/{name}/status", patch, ctype=MERGE)
    assert written["status"] == {"conditions": [condition], "resourceVersion": "5"}
    assert written["spec"]["resource"]["resource"] == "configmaps"


def test_status_writes_are_validated(http: Http) -> None:
    name = unique("m")
    http.ok("POST", V1, svm(name, api_version="v1"))
    status = f"{V1}/{name}/status"
    http.ok("PATCH", status, {"status": {"resourceVersion": "12"}}, ctype=MERGE)
    code, body = http("PATCH", status, {"status": {"resourceVersion": "13"}}, ctype=MERGE)
    assert code == 422
    assert body["details"]["causes"] == [
        {"reason": "FieldValueInvalid", "message": 'Invalid value: "13": field is immutable',
         "field": "status.resourceVersion"},
    ]  # fmt: skip
    when = "2026-11-29T02:07:04Z"
    both = [
        {"type": t, "status": "True", "lastTransitionTime": when, "reason": "Done"} for t in ("Succeeded", "Failed")
    ]
    code, body = http("PATCH", status, {"status": {"conditions": both}}, ctype=MERGE)
    assert code == 422
    assert "Both success and failed conditions cannot be true at the same time" in body["message"]
    code, body = http("PATCH", status, {"status": {"conditions": [{"type": "Running", "status": "True"}]}}, ctype=MERGE)
    assert code == 422
    assert {c["field"] for c in body["details"]["causes"]} == {
        "status.conditions[0].lastTransitionTime", "status.conditions[0].reason",
    }  # fmt: skip


def test_a_status_write_is_a_managed_fields_entry_of_its_own(http: Http) -> None:
    """As kube-apiserver keeps managedFields: one entry per manager, operation and subresource. The
    controller's write through /status is `"subresource": "status"` and owns `f:status` only, so the
    creator stays the manager that owns `f:spec` (detection names it: storage_migrator/kube/in_tree.py)."""
    name = f"mf-{uuid.uuid4().hex[:8]}"
    http.ok("POST", f"{V1}?fieldManager=kubectl-create", svm(name, api_version="v1"))
    running = {"type": "Running", "status": "True", "lastTransitionTime": "2026-11-29T02:07:05Z",
               "reason": "MigrationRunning", "message": "The migration is running"}  # fmt: skip
    http.ok("PATCH", f"{V1}/{name}/status?fieldManager=kube-controller-manager",
            {"status": {"resourceVersion": "1", "conditions": [running]}}, ctype=MERGE)  # fmt: skip
    entries = {e["manager"]: e for e in http.ok("GET", f"{V1}/{name}")["metadata"]["managedFields"]}
    assert set(entries) == {"kubectl-create", "kube-controller-manager"}
    assert "subresource" not in entries["kubectl-create"] and "f:spec" in entries["kubectl-create"]["fieldsV1"]
    controller = entries["kube-controller-manager"]
    assert controller["subresource"] == "status" and controller["operation"] == "Update"
    assert set(controller["fieldsV1"]) == {"f:status"}
