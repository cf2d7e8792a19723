"""kubesim evaluates ValidatingAdmissionPolicies as kube-apiserver does, beyond what our own policy uses
(issue 35: "make it evaluate ValidatingAdmissionPolicies with their bindings if it can honestly do so").

dispatcher.go and validator.go (k8s.io/apiserver/pkg/admission/plugin/policy/validating): a
binding's `matchResources` (a namespace selector: every namespace carries
`kubernetes.io/metadata.name`), `messageExpression` before `message`, a validation's `reason`
deciding the code (Forbidden: 403), `failurePolicy: Ignore` admitting a policy whose expression
fails, `validationActions` without Deny admitting, and `oldObject` on update. The session's
kubesim (no authentication: the anonymous user), a namespace of the test's own.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Kubesim
from kubernetes import client as k8s
from kubernetes import config as k8s_config

pytestmark = [pytest.mark.integration]

GROUP, VERSION = "admissionregistration.k8s.io", "v1"


@pytest.fixture
def api(kubesim: Kubesim) -> Iterator[Any]:
    with k8s_config.new_client_from_config(config_file=kubesim.kubeconfig) as client:
        yield client


def _create(api: Any, plural: str, body: dict[str, Any]) -> None:
    k8s.CustomObjectsApi(api).create_cluster_custom_object(GROUP, VERSION, plural, body)


def _delete(api: Any, plural: str, name: str) -> None:
    k8s.CustomObjectsApi(api).delete_cluster_custom_object(GROUP, VERSION, plural, name)


def test_selectors_messages_reasons_and_failure_policies(api: Any, namespace: str) -> None:
    name = f"t-{uuid.uuid4().hex[:6]}"
    rules = {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                                "resources": ["configmaps"]}]}  # fmt: skip
    policies = {
        f"{name}-size": {"failurePolicy": "Fail", "matchConstraints": rules, "validations": [{
            "expression": "!has(object.data) || size(object.data) <= 1", "reason": "Forbidden",
            "messageExpression": "'at most one key, not ' + string(size(object.data))"}]},
        f"{name}-broken": {"failurePolicy": "Ignore", "matchConstraints": rules,
                           "validations": [{"expression": "object.nothing.here == 1"}]},
        f"{name}-immutable": {"failurePolicy": "Fail", "matchConstraints": rules, "validations": [{
            "expression": "oldObject == null || !has(oldObject.data) || !has(object.data) || "
                          "oldObject.data == object.data", "message": "data is immutable"}]},
    }  # fmt: skip
    bindings = {
        f"{name}-size": {"validationActions": ["Deny"], "matchResources": {"namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": namespace}}}},
        f"{name}-broken": {"validationActions": ["Deny"]},
        f"{name}-immutable": {"validationActions": ["Audit"]},  # not Deny: admitted
    }  # fmt: skip
    core = k8s.CoreV1Api(api)
    try:
        for policy, spec in policies.items():
            _create(api, "validatingadmissionpolicies", {"apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "ValidatingAdmissionPolicy", "metadata": {"name": policy}, "spec": spec})  # fmt: skip
            _create(api, "validatingadmissionpolicybindings", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": policy}, "spec": {"policyName": policy, **bindings[policy]}})  # fmt: skip
        two = k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="two"), data={"a": "1", "b": "2"})
        with pytest.raises(k8s.ApiException) as refused:
            core.create_namespaced_config_map(namespace, two)
        status = json.loads(refused.value.body)
        inner = f"ValidatingAdmissionPolicy '{name}-size' with binding '{name}-size' denied request: at most one " \
                "key, not 2"  # fmt: skip
        assert (refused.value.status, status["reason"]) == (403, "Forbidden")
        assert status["message"] == f'configmaps "two" is forbidden: {inner}'
        assert status["details"] == {"name": "two", "kind": "configmaps", "causes": [{"message": inner}]}
        # Another namespace is not selected by the binding: admitted there (and the broken policy is Ignore).
        core.create_namespaced_config_map("default", two)
        core.delete_namespaced_config_map("two", "default")
        # An update: oldObject is the stored object; the immutable policy's binding only audits.
        core.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="one"),
                                                                     data={"a": "1"}))  # fmt: skip
        core.patch_namespaced_config_map("one", namespace, {"data": {"a": "changed"}})
        assert core.read_namespaced_config_map("one", namespace).data == {"a": "changed"}
    finally:
        for policy in policies:
            _delete(api, "validatingadmissionpolicybindings", policy)
            _delete(api, "validatingadmissionpolicies", policy)
    core.create_namespaced_config_map(namespace, two)  # no policy left: admitted
