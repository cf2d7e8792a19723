"""kubesim's `dryRun`, held to kube-apiserver's rules (issue 14: `kubectl apply --dry-run=server`).

apimachinery's ValidateDryRun: "dryRun: Unsupported value" unless every value is
`All`, refused by the handlers as `errors.NewInvalid(meta.k8s.io/<Verb>Options, "")`;
registry's DryRunnableStorage: a dry run checks what the write would (an existing
name on create) and answers with the object as it would be stored, writing nothing.
Judged by etcd.
"""

from __future__ import annotations

import json

import pytest
from conftest import Kubesim
from kubernetes import client as k8s
from kubernetes import config as k8s_config

pytestmark = pytest.mark.integration


def test_dry_run_create_update_delete_store_nothing_and_unknown_values_are_refused(
    kubesim: Kubesim, namespace: str
) -> None:
    api = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    core = k8s.CoreV1Api(api)
    key = f"/registry/configmaps/{namespace}/cfg".encode()
    body = {"metadata": {"name": "cfg"}, "data": {"a": "1"}}
    try:
        would_be = core.create_namespaced_config_map(namespace, body, dry_run="All")
        assert would_be.metadata.uid and would_be.metadata.creation_timestamp
        assert would_be.metadata.resource_version is None  # not stored: no revision yet
        assert kubesim.etcd.get(key)[0] is None

        with pytest.raises(k8s.ApiException) as refused:
            core.create_namespaced_config_map(namespace, body, dry_run="Bogus")
        assert refused.value.status == 422
        status = json.loads(refused.value.body)
        assert status["message"] == (
            'CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: []string{"Bogus"}: '
            'supported values: "All"'
        )
        assert status["details"]["causes"][0]["reason"] == "FieldValueNotSupported"

        created = core.create_namespaced_config_map(namespace, body)
        stored = kubesim.etcd.get(key)[0]
        assert stored is not None
        with pytest.raises(k8s.ApiException) as exists:
            core.create_namespaced_config_map(namespace, body, dry_run="All")
        assert exists.value.status == 409

        patched = core.patch_namespaced_config_map("cfg", namespace, {"data": {"a": "2"}}, dry_run="All")
        assert patched.data == {"a": "2"}
        assert patched.metadata.resource_version == created.metadata.resource_version
        core.delete_namespaced_config_map("cfg", namespace, dry_run="All")
        after = kubesim.etcd.get(key)[0]
        assert after is not None and (after.mod_revision, after.value) == (stored.mod_revision, stored.value)
        with pytest.raises(k8s.ApiException) as delete_refused:
            core.delete_namespaced_config_map("cfg", namespace, dry_run="Bogus")
        assert delete_refused.value.status == 422
        assert json.loads(delete_refused.value.body)["message"].startswith('DeleteOptions.meta.k8s.io "" is invalid')
    finally:
        api.close()
