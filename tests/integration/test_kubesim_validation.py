"""kubesim refuses what kube-apiserver refuses for CRDs and custom resources, judged by HTTP answers and etcd.

A real kube-apiserver refused our CRDs while every test passed against kubesim:
these tests hold kubesim to the real server's answers (reference/
crd-protected-group-422.json, apiextensions-apiserver's validation) with the
official client, kubectl and raw HTTP, and read etcd to see what was stored.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Kubectl
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from recorded import REFERENCE

from kubesim import codec, tls

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "deployments" / "crds"
PROTECTED_GROUP_422 = REFERENCE / "crd-protected-group-422.json"
GROUP, VERSION = "migration.k8s.io", "v1alpha1"
SVMS, STATES = "storageversionmigrations", "storagestates"


def call(url: str, method: str, path: str, body: Any, *, content_type: str = "application/json") -> tuple[int, Any]:
    conn = tls.connection(url)
    try:
        conn.request(method, path, body=json.dumps(body).encode(), headers={"Content-Type": content_type})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


@pytest.fixture
def custom(kubesim: Any, migration_crds: None) -> Iterator[k8s.CustomObjectsApi]:
    api = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    try:
        yield k8s.CustomObjectsApi(api)
    finally:
        api.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def svm_body(name: str, resource: str = "secrets") -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "StorageVersionMigration",
        "metadata": {"name": name},
        "spec": {"resource": {"group": "", "version": "v1", "resource": resource}},
    }


def stored_svm(kubesim: Any, name: str) -> tuple[int, dict[str, Any]]:
    kv, _ = kubesim.etcd.get(f"/registry/{GROUP}/{SVMS}/{name}".encode())
    assert kv is not None, f"{name} is not in etcd"
    return kv.mod_revision, codec.decode(kv.value, read_keys=["key1"]).obj


# ----- CRDs -------------------------------------------------------------------


def test_crd_in_a_protected_group_without_approval_is_refused_as_the_reference(kubesim: Any) -> None:
    """reference/crd-protected-group-422.json: "creating a CRD in a protected group (`*.k8s.io`,
    `*.kubernetes.io`) without the `api-approved.kubernetes.io` annotation is refused with 422
    `Invalid` and this body." Compared field by field, then whole."""
    reference = json.loads(PROTECTED_GROUP_422.read_text())
    doc = yaml.safe_load((CRD_DIR / "storageversionmigrations.yaml").read_text())
    doc["metadata"] = {"name": "gadgets.bars.k8s.io"}
    doc["spec"]["group"] = "bars.k8s.io"
    doc["spec"]["names"] = {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"}
    status, body = call(kubesim.url, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)
    assert status == 422
    for key in ("kind", "apiVersion", "status", "message", "reason", "code"):
        assert body[key] == reference[key], key
    for key in ("name", "group", "kind"):
        assert body["details"][key] == reference["details"][key], key
    assert body["details"]["causes"] == reference["details"]["causes"]
    assert body == reference
    assert kubesim.etcd.get(b"/registry/apiextensions.k8s.io/customresourcedefinitions/gadgets.bars.k8s.io")[0] is None


def test_removing_the_approval_of_an_installed_crd_is_refused(kubesim: Any, migration_crds: None) -> None:
    """validateAPIApproval on update: only an unchanged approval state passes; Approved →
    Missing is `Required value`."""
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{STATES}.{GROUP}"
    patch = {"metadata": {"annotations": {"api-approved.kubernetes.io": None}}}
    status, body = call(kubesim.url, "PATCH", path, patch, content_type="application/merge-patch+json")
    assert status == 422, body
    assert body["details"]["causes"][0]["field"] == "metadata.annotations[api-approved.kubernetes.io]"


# ----- custom resources -------------------------------------------------------


def test_changing_spec_resource_of_a_migration_is_refused_and_etcd_unchanged(
    kubesim: Any, custom: k8s.CustomObjectsApi
) -> None:
    """Our CRD's transition rule on spec.resource (immutable, an omitted group or version equal to
    ""); the real server answers field.Invalid(path, "object", message): `spec.resource: Invalid
    value: "object": spec.resource is immutable; create another StorageVersionMigration to migrate
    another resource`."""
    name = unique("immutable")
    custom.create_cluster_custom_object(GROUP, VERSION, SVMS, svm_body(name))
    try:
        before = stored_svm(kubesim, name)
        patch = {"spec": {"resource": {"resource": "configmaps"}}}
        with pytest.raises(k8s.ApiException) as caught:
            custom.patch_cluster_custom_object(GROUP, VERSION, SVMS, name, patch)
        assert caught.value.status == 422
        body = json.loads(caught.value.body)
        assert body["reason"] == "Invalid"
        assert body["message"] == (
            f'StorageVersionMigration.migration.k8s.io "{name}" is invalid: spec.resource: Invalid value: "object": '
            "spec.resource is immutable; create another StorageVersionMigration to migrate another resource"
        )
        assert body["details"]["causes"] == [
            {
                "reason": "FieldValueInvalid",
                "message": 'Invalid value: "object": spec.resource is immutable; create another '
                "StorageVersionMigration to migrate another resource",
                "field": "spec.resource",
            }
        ]
        assert stored_svm(kubesim, name) == before
        # Other spec fields stay writable: only spec.resource is immutable.
        custom.patch_cluster_custom_object(GROUP, VERSION, SVMS, name, {"spec": {"continueToken": "abc"}})
        assert stored_svm(kubesim, name)[1]["spec"]["continueToken"] == "abc"
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, SVMS, name)


IMMUTABLE = "spec.resource is immutable; create another StorageVersionMigration to migrate another resource"


def put_raw(url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """A PUT whose JSON is exactly `body`: no client fills in a missing key."""
    return call(url, "PUT", path, body)


def test_an_update_without_the_empty_group_is_accepted_as_a_go_client_sends_it(
    kubesim: Any, custom: k8s.CustomObjectsApi
) -> None:
    """Issue 19, item 6: "Our CRD's rule that `spec.resource` is immutable (`x-kubernetes-validations:
    - rule: self == oldSelf`, in both CRDs) treats an omitted `group` and `group: ""` as different.
    Go clients omit empty strings (`omitempty`), so an update from the kube-storage-version-migrator
    (a Go program) to a request created with `group: ""` is refused: we saw it on every checkpoint
    it tried. Compare with the defaults applied (an empty group equals no group), as apimachinery's
    semantic equality does."

    kube-storage-version-migrator checkpoints as pkg/migrator/progress.go does: GET, set
    spec.continueToken, PUT the whole object, which Go serializes without `group` (and without
    `version` when it is ""). A real change of the group is still a 422 naming spec.resource,
    and etcd keeps what it had."""
    name = unique("omitempty")
    custom.create_cluster_custom_object(GROUP, VERSION, SVMS, svm_body(name))  # group: ""
    path = f"/apis/{GROUP}/{VERSION}/{SVMS}/{name}"
    try:
        assert stored_svm(kubesim, name)[1]["spec"]["resource"] == {"group": "", "version": "v1", "resource": "secrets"}
        # The checkpoint as the Go migrator sends it: raw JSON, no `group` key.
        current = custom.get_cluster_custom_object(GROUP, VERSION, SVMS, name)
        go_body = copy.deepcopy(current)
        del go_body["spec"]["resource"]["group"]
        go_body["spec"]["continueToken"] = "chunk-1"
        status, answer = put_raw(kubesim.url, path, go_body)
        assert status == 200, answer
        assert '"group"' not in json.dumps(answer["spec"])
        _, stored = stored_svm(kubesim, name)
        assert stored["spec"] == {"resource": {"version": "v1", "resource": "secrets"}, "continueToken": "chunk-1"}

        # And back: a Python client's update that writes `group: ""` again (omitted -> "").
        current = custom.get_cluster_custom_object(GROUP, VERSION, SVMS, name)
        current["spec"]["resource"]["group"] = ""
        current["spec"]["continueToken"] = "chunk-2"
        custom.replace_cluster_custom_object(GROUP, VERSION, SVMS, name, current)
        assert stored_svm(kubesim, name)[1]["spec"]["resource"]["group"] == ""

        # A merge patch that removes the empty group (null deletes a key) is the same request.
        patch = {"spec": {"resource": {"group": None}, "continueToken": "chunk-3"}}
        status, answer = call(kubesim.url, "PATCH", path, patch, content_type="application/merge-patch+json")
        assert status == 200, answer
        assert stored_svm(kubesim, name)[1]["spec"]["resource"] == {"version": "v1", "resource": "secrets"}

        # A real change of the group (no group -> "apps") is refused, etcd unchanged.
        before = stored_svm(kubesim, name)
        changed = custom.get_cluster_custom_object(GROUP, VERSION, SVMS, name)
        changed["spec"]["resource"]["group"] = "apps"
        with pytest.raises(k8s.ApiException) as caught:
            custom.replace_cluster_custom_object(GROUP, VERSION, SVMS, name, changed)
        assert caught.value.status == 422
        body = json.loads(caught.value.body)
        assert body["reason"] == "Invalid"
        assert body["message"] == (
            f'StorageVersionMigration.migration.k8s.io "{name}" is invalid: '
            f'spec.resource: Invalid value: "object": {IMMUTABLE}'
        )
        assert body["details"]["causes"] == [
            {
                "reason": "FieldValueInvalid",
                "message": f'Invalid value: "object": {IMMUTABLE}',
                "field": "spec.resource",
            }
        ]
        assert stored_svm(kubesim, name) == before
        # So is dropping the version (v1 -> omitted, that is ""), though the group stays omitted.
        go_body = copy.deepcopy(changed)
        go_body["spec"]["resource"] = {"resource": "secrets"}
        status, answer = put_raw(kubesim.url, path, go_body)
        assert status == 422, answer
        assert answer["details"]["causes"][0]["field"] == "spec.resource"
        assert stored_svm(kubesim, name) == before
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, SVMS, name)


def test_a_storage_state_update_without_the_empty_group_is_accepted(kubesim: Any, custom: k8s.CustomObjectsApi) -> None:
    """The same rule on StorageState's spec.resource {group, resource} (issue 19, item 6)."""
    resource = unique("widgets")
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "StorageState", "metadata": {"name": resource},
            "spec": {"resource": {"group": "", "resource": resource}}}  # fmt: skip
    custom.create_cluster_custom_object(GROUP, VERSION, STATES, body)
    path = f"/apis/{GROUP}/{VERSION}/{STATES}/{resource}"
    try:
        current = custom.get_cluster_custom_object(GROUP, VERSION, STATES, resource)
        del current["spec"]["resource"]["group"]
        status, answer = put_raw(kubesim.url, path, current)
        assert status == 200, answer
        current = custom.get_cluster_custom_object(GROUP, VERSION, STATES, resource)
        assert current["spec"]["resource"] == {"resource": resource}
        current["spec"]["resource"]["group"] = "apps"
        status, answer = put_raw(kubesim.url, path, current)
        assert status == 422, answer
        # The root's name rule fails too (and first: a node's rules run before its children's).
        assert [(c["field"], c["message"]) for c in answer["details"]["causes"]] == [
            ("<nil>", 'Invalid value: "object": metadata.name must be "<spec.resource.resource>.<spec.resource.group>", '
             'or "<spec.resource.resource>" for the core group'),
            ("spec.resource", 'Invalid value: "object": spec.resource is immutable; create another StorageState, '
             "named after the other resource"),
        ]  # fmt: skip
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, STATES, resource)


def test_kubectl_apply_changing_spec_resource_is_refused(
    kubesim: Any, migration_crds: None, kubectl: Kubectl, tmp_path: Path
) -> None:
    name = unique("apply")
    manifest = tmp_path / "svm.yaml"
    manifest.write_text(yaml.safe_dump(svm_body(name)))
    assert kubectl("apply", "-f", str(manifest), check=False).returncode == 0
    try:
        before = stored_svm(kubesim, name)
        manifest.write_text(yaml.safe_dump(svm_body(name, resource="configmaps")))
        done = kubectl("apply", "-f", str(manifest), check=False)
        assert done.returncode != 0
        assert 'spec.resource: Invalid value: "object": spec.resource is immutable' in done.stderr
        assert stored_svm(kubesim, name) == before
    finally:
        kubectl("delete", "-f", str(manifest), check=False)


def test_a_storage_state_named_after_another_resource_is_refused(kubesim: Any, custom: k8s.CustomObjectsApi) -> None:
    """Our StorageState root rule: metadata.name must be <resource>.<group>. A root rule has a nil
    field path, which the real server prints `<nil>`."""
    name = unique("wrong")
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "StorageState", "metadata": {"name": name},
            "spec": {"resource": {"group": "apps", "resource": "deployments"}}}  # fmt: skip
    with pytest.raises(k8s.ApiException) as caught:
        custom.create_cluster_custom_object(GROUP, VERSION, STATES, body)
    assert caught.value.status == 422
    doc = json.loads(caught.value.body)
    assert doc["message"] == (
        f'StorageState.migration.k8s.io "{name}" is invalid: <nil>: Invalid value: "object": metadata.name must be '
        '"<spec.resource.resource>.<spec.resource.group>", or "<spec.resource.resource>" for the core group'
    )
    assert kubesim.etcd.get(f"/registry/{GROUP}/{STATES}/{name}".encode())[0] is None


def test_an_unknown_spec_field_is_pruned_before_storing(kubesim: Any, custom: k8s.CustomObjectsApi) -> None:
    """Structural schemas prune: a field not in `properties` is not stored (nor is an unknown
    metadata field: metadata is decoded as ObjectMeta)."""
    name = unique("pruned")
    body = svm_body(name)
    body["spec"]["bogus"] = {"deep": 1}
    body["spec"]["resource"]["extra"] = "x"
    body["metadata"]["unknownMeta"] = "y"
    created = custom.create_cluster_custom_object(GROUP, VERSION, SVMS, copy.deepcopy(body))
    try:
        assert "bogus" not in created["spec"]
        _, stored = stored_svm(kubesim, name)
        assert stored["spec"] == {"resource": {"group": "", "version": "v1", "resource": "secrets"}}
        assert "unknownMeta" not in stored["metadata"]
        assert stored["metadata"]["name"] == name
        # A patch adding an unknown field is pruned too, and then changes nothing: no write.
        rev = stored_svm(kubesim, name)[0]
        custom.patch_cluster_custom_object(GROUP, VERSION, SVMS, name, {"spec": {"bogus": 2}})
        assert stored_svm(kubesim, name)[0] == rev
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, SVMS, name)


def test_an_invalid_phase_through_the_status_subresource_is_refused(kubesim: Any, custom: k8s.CustomObjectsApi) -> None:
    """`enum` on status.phase: kubeOpenAPIResultToFieldErrors maps EnumFailCode to field.NotSupported."""
    name = unique("phase")
    custom.create_cluster_custom_object(GROUP, VERSION, SVMS, svm_body(name))
    try:
        before = stored_svm(kubesim, name)
        with pytest.raises(k8s.ApiException) as caught:
            custom.patch_cluster_custom_object_status(GROUP, VERSION, SVMS, name, {"status": {"phase": "Bogus"}})
        assert caught.value.status == 422
        doc = json.loads(caught.value.body)
        assert doc["message"] == (
            f'StorageVersionMigration.migration.k8s.io "{name}" is invalid: status.phase: Unsupported value: '
            '"Bogus": supported values: "Pending", "Running", "Succeeded", "Failed"'
        )
        assert doc["details"]["causes"][0]["reason"] == "FieldValueNotSupported"
        assert stored_svm(kubesim, name) == before
        custom.patch_cluster_custom_object_status(GROUP, VERSION, SVMS, name, {"status": {"phase": "Running"}})
        assert stored_svm(kubesim, name)[1]["status"] == {"phase": "Running"}
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, SVMS, name)


def test_a_lease_the_real_server_refuses_is_refused_alike(kubesim: Any) -> None:
    """pkg/apis/coordination/validation: "leaseDurationSeconds ... must be greater than 0",
    "leaseTransitions ... must be greater than or equal to 0", and "preferredHolder ... may only
    be specified if `strategy` is defined". The writer Leases (issue 37) are written through
    kubesim: a Lease the real server would refuse must not pass here."""
    api = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    leases = k8s.CoordinationV1Api(api)
    name, namespace = unique("refused"), "default"

    def lease(**spec: Any) -> dict[str, Any]:
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}, "spec": spec}

    try:
        with pytest.raises(k8s.ApiException) as refused:
            leases.create_namespaced_lease(namespace, lease(leaseDurationSeconds=0, leaseTransitions=-1))
        assert refused.value.status == 422
        assert json.loads(refused.value.body)["message"] == (
            f'Lease.coordination.k8s.io "{name}" is invalid: [spec.leaseDurationSeconds: Invalid value: 0: must be '
            "greater than 0, spec.leaseTransitions: Invalid value: -1: must be greater than or equal to 0]"
        )
        with pytest.raises(k8s.ApiException) as forbidden:
            leases.create_namespaced_lease(namespace, lease(holderIdentity="a", preferredHolder="b"))
        assert json.loads(forbidden.value.body)["message"].endswith(
            "spec.preferredHolder: Forbidden: may only be specified if `strategy` is defined"
        )
        leases.create_namespaced_lease(namespace, lease(holderIdentity="a", leaseDurationSeconds=15))
        with pytest.raises(k8s.ApiException) as patched:
            leases.patch_namespaced_lease(name, namespace, {"spec": {"leaseDurationSeconds": -5}})
        assert patched.value.status == 422
        assert leases.read_namespaced_lease(name, namespace).spec.lease_duration_seconds == 15
    finally:
        if any(item.metadata.name == name for item in leases.list_namespaced_lease(namespace).items):
            leases.delete_namespaced_lease(name, namespace)
        api.close()
