"""The in-tree `storagemigration.k8s.io` API's strategy and validation, and the pure parts of
kcm's controller, as kubesim holds them (issue 36, item 6).

Expectations are the texts kube-apiserver prints (reference/svm-*-422.json for the two recorded
refusals; the rest worded from `pkg/apis/storagemigration/validation/validation.go` and
`metav1validation.ValidateConditions`), and what `pkg/controller/storageversionmigrator/
migrationrunner.go` writes into a CRD's status.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from recorded import REFERENCE

from kubesim import storagemigration as svm
from kubesim.errors import StatusError
from kubesim.resources import builtin_resources
from kubesim.svm_controller import ControllerSettings, gvr_string
from kubesim.svm_runner import finish_crd, storage_migrating

T0 = "2026-11-29T02:07:04Z"


def obj(resource: str = "configmaps", group: str = "", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "storagemigration.k8s.io/v1",
        "kind": "StorageVersionMigration",
        "metadata": {"name": "ref-configmaps", "resourceVersion": "7"},
        "spec": {"resource": {"group": group, "resource": resource}},
        **extra,
    }


def refused(call: Any, *args: Any) -> dict[str, Any]:
    with pytest.raises(StatusError) as err:
        call(*args)
    assert err.value.code == 422, err.value.body()
    return err.value.body()


def cond(kind: str, status: str = "True", reason: str = "R", message: str = "", at: str | None = T0) -> dict[str, Any]:
    return {"type": kind, "status": status, "lastTransitionTime": at, "reason": reason, "message": message}


# ----- create and update: the two recorded refusals ----------------------------------
def test_an_empty_resource_is_refused_as_the_real_server_refuses_it() -> None:
    """reference/svm-empty-resource-422.json, byte for byte but the name."""
    recorded = json.loads((REFERENCE / "svm-empty-resource-422.json").read_text())
    body = refused(svm.admit_create, {**obj(""), "metadata": {"name": "ref-bad"}})
    assert body == recorded


def test_the_spec_is_immutable_as_the_real_server_says() -> None:
    """reference/svm-spec-immutable-422.json: the value printed is the new spec, as Go's JSON of the internal type."""
    recorded = json.loads((REFERENCE / "svm-spec-immutable-422.json").read_text())
    assert refused(svm.admit_update, obj("secrets"), obj("configmaps")) == recorded


def test_a_create_keeps_the_typed_shape_and_drops_what_the_type_does_not_have() -> None:
    created = svm.admit_create(
        {
            "metadata": {"name": "m"},
            "spec": {"resource": {"resource": "secrets", "version": "v1"}, "continueToken": "x"},
            "status": {"conditions": [cond("Succeeded")]},
        }
    )
    # reference/svm-created.json: group written though empty, status {} (cleared on create).
    assert created["spec"] == {"resource": {"group": "", "resource": "secrets"}}
    assert created["status"] == {}


@pytest.mark.parametrize(
    ("resource", "group", "field", "detail"),
    [
        ("Secrets", "", "spec.resource.resource", "a DNS-1035 label must consist of lower case"),
        ("9lives", "", "spec.resource.resource", "start with an alphabetic character"),
        ("x" * 64, "", "spec.resource.resource", "must be no more than 63 characters"),
        ("widgets", "Example.COM", "spec.resource.group", "a lowercase RFC 1123 subdomain"),
    ],
)
def test_resource_and_group_must_be_names(resource: str, group: str, field: str, detail: str) -> None:
    body = refused(svm.admit_create, obj(resource, group))
    (cause,) = body["details"]["causes"]
    assert (cause["reason"], cause["field"]) == ("FieldValueInvalid", field)
    assert detail in cause["message"]


def test_a_field_of_the_wrong_type_is_the_decoders_400() -> None:
    with pytest.raises(StatusError) as err:
        svm.admit_create(obj(resource=5))  # type: ignore[arg-type]
    assert err.value.code == 400
    assert "cannot unmarshal number" in err.value.message


def test_an_update_without_a_resource_version_is_refused() -> None:
    """AllowUnconditionalUpdate is false for both strategies."""
    body = refused(svm.admit_update, {**obj(), "metadata": {"name": "ref-configmaps"}}, obj())
    assert body["message"].endswith("metadata.resourceVersion: Invalid value: 0x0: must be specified for an update")


def test_an_update_keeps_the_stored_status() -> None:
    stored = {**obj(), "status": {"resourceVersion": "40", "conditions": [cond("Running")]}}
    updated = svm.admit_update({**obj(), "status": {"conditions": [cond("Succeeded")]}}, stored)
    assert updated["status"] == stored["status"]


# ----- /status -----------------------------------------------------------------
def test_a_status_write_keeps_the_stored_spec() -> None:
    new = svm.admit_status_update({**obj("secrets"), "status": {"resourceVersion": "12"}}, obj("configmaps"))
    assert new["spec"]["resource"]["resource"] == "configmaps"
    assert new["status"] == {"resourceVersion": "12"}


@pytest.mark.parametrize(
    ("status", "old_status", "field", "message"),
    [
        ({"resourceVersion": "abc"}, {}, "status.resourceVersion",
         'Invalid value: "abc": resource version is not well formed: abc'),
        ({"resourceVersion": "13"}, {"resourceVersion": "12"}, "status.resourceVersion",
         'Invalid value: "13": field is immutable'),
        ({"conditions": [cond("Running", at=None)]}, {}, "status.conditions[0].lastTransitionTime",
         "Required value: must be set"),
        ({"conditions": [cond("Running", reason="")]}, {}, "status.conditions[0].reason",
         "Required value: must be set"),
        ({"conditions": [cond("Running", status="Maybe")]}, {}, "status.conditions[0].status",
         'Unsupported value: "Maybe": supported values: "False", "True", "Unknown"'),
        ({"conditions": [cond("Running"), cond("Running")]}, {}, "status.conditions[1].type",
         'Duplicate value: "Running"'),
        ({"conditions": [cond("Running", reason="not a reason")]}, {}, "status.conditions[0].reason",
         'Invalid value: "not a reason": a condition reason must start with alphabetic character'),
    ],
)  # fmt: skip
def test_a_status_write_is_validated(
    status: dict[str, Any], old_status: dict[str, Any], field: str, message: str
) -> None:
    body = refused(svm.admit_status_update, {**obj(), "status": status}, {**obj(), "status": old_status})
    causes = {c["field"]: c["message"] for c in body["details"]["causes"]}
    assert causes[field].startswith(message), causes


def test_succeeded_and_failed_never_both_true_nor_undone() -> None:
    both = {"conditions": [cond("Succeeded"), cond("Failed")]}
    body = refused(svm.admit_status_update, {**obj(), "status": both}, obj())
    assert "Both success and failed conditions cannot be true at the same time" in body["message"]
    for kind, words in (("Succeeded", "Success"), ("Failed", "Failed")):
        old = {**obj(), "status": {"conditions": [cond(kind)]}}
        body = refused(svm.admit_status_update, {**obj(), "status": {"conditions": [cond(kind, "False")]}}, old)
        assert f"{words} condition cannot be set to false once it is true" in body["message"]


def test_running_may_stay_true_beside_succeeded() -> None:
    """The runner turns Running False only after Succeeded is written (svm-succeeded.json): v1.36 allows it."""
    status = {"conditions": [cond("Running"), cond("Succeeded")]}
    assert svm.admit_status_update({**obj(), "status": status}, obj())["status"]["conditions"][1]["type"] == "Succeeded"


# ----- conditions, as meta.SetStatusCondition sets them -------------------------------
def test_set_condition_moves_the_transition_time_only_when_the_status_changes() -> None:
    o: dict[str, Any] = {"status": {}}
    svm.set_condition(o, "Running", "True", "MigrationRunning", "The migration is running", T0)
    svm.set_condition(o, "Running", "True", "Other", "again", "2026-11-29T03:00:00Z")
    assert o["status"]["conditions"] == [cond("Running", reason="Other", message="again")]
    svm.set_condition(o, "Running", "False", "MigrationCompleted", "Migration completed", "2026-11-29T04:00:00Z")
    assert o["status"]["conditions"][0]["lastTransitionTime"] == "2026-11-29T04:00:00Z"
    assert svm.condition_true(o, "Running") is False


# ----- the CRD at the end of a migration (migrationrunner.go, finishCRDMigration) ---------------
def crd(generation: int, observed: int | None) -> dict[str, Any]:
    c: dict[str, Any] = {
        "metadata": {"name": "widgets.example.com", "generation": generation},
        "spec": {"versions": [{"name": "v1", "storage": False}, {"name": "v2", "storage": True}]},
        "status": {"storedVersions": ["v1", "v2"], "conditions": []},
    }
    if observed is not None:
        storage_migrating(c, "True", "MigrationRunning", "Migration m is running")
        c["status"]["conditions"][0]["observedGeneration"] = observed
    return c


@pytest.mark.parametrize(
    ("success", "generation", "stored", "reason", "message"),
    [
        (True, 2, ["v2"], "MigrationSucceeded", "The migration has succeeded and the stored versions have been updated"),
        (True, 3, ["v1", "v2"], "MigrationSucceeded",
         "The migration has succeeded but the stored versions have not been updated due to a generation mismatch"),
        # The source trims on failure too when the CRD is unchanged: kubesim does what it does.
        (False, 2, ["v2"], "MigrationFailed", "The migration has failed"),
        (False, 3, ["v1", "v2"], "MigrationFailed", "The migration has failed"),
    ],
)  # fmt: skip
def test_the_crd_is_trimmed_only_when_its_generation_did_not_move(
    success: bool, generation: int, stored: list[str], reason: str, message: str
) -> None:
    c = crd(generation, observed=2)
    finish_crd(c, success)
    assert c["status"]["storedVersions"] == stored
    (condition,) = c["status"]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"], condition["message"]) == (
        "StorageMigrating", "False", reason, message,
    )  # fmt: skip
    assert condition["observedGeneration"] == generation


def test_a_crd_never_marked_migrating_is_not_trimmed() -> None:
    c = crd(2, observed=None)
    finish_crd(c, True)
    assert c["status"]["storedVersions"] == ["v1", "v2"]


# ----- the controller's knobs and names ----------------------------------------
def test_settings_refuse_bad_values_naming_the_field() -> None:
    settings = ControllerSettings()
    for body in ({"kubeAPIQPS": 0}, {"gcDelaySeconds": -1}, {"enabled": "yes"}, {"kubeAPIBurst": 1.5}, {"qps": 5}):
        with pytest.raises(StatusError) as err:
            settings.update(body)
        assert err.value.code == 400
        assert next(iter(body)) in err.value.message
    settings.update({"enabled": False, "gcDelaySeconds": 0.2, "kubeAPIQPS": 20, "kubeAPIBurst": 30})
    assert settings.as_dict() == {"enabled": False, "gcDelaySeconds": 0.2, "missingResourceGraceSeconds": 3.0,
                                  "kubeAPIQPS": 20.0, "kubeAPIBurst": 30}  # fmt: skip


def test_a_resource_is_named_as_go_prints_a_group_version_resource() -> None:
    types = {(rt.group, rt.resource): rt for rt in builtin_resources()}
    assert gvr_string(types[("", "secrets")], "v1") == "/v1, Resource=secrets"
    assert gvr_string(types[("apps", "deployments")], "v1") == "apps/v1, Resource=deployments"


def test_the_in_tree_api_is_served_as_v1_and_v1beta1_and_stored_as_v1beta1() -> None:
    """v1.37: v1 GA, v1beta1 still served; the storage version stays v1beta1 for a release, so its
    storageVersionHash is the recorded one (reference/discovery-apis-storagemigration-v1beta1.json)."""
    rt = next(r for r in builtin_resources() if svm.is_svm(r))
    recorded = json.loads((REFERENCE / "discovery-apis-storagemigration-v1beta1.json").read_text())
    assert sorted(rt.served_versions) == ["v1", "v1beta1"]
    assert rt.hash_for(rt.storage_version) == recorded["resources"][0]["storageVersionHash"]
