"""`storage-migrator plan` against kubesim: the next poll's actions, and nothing written.

Issue 12 item 2: "`plan`: what the next detection poll would do, without doing it."
Seed 000: "If the hash has changed, the controller ... as a single operation,
updates the status.lastHeartbeatTime, sets .status.currentStorageVersionHash to
the new hash, and appends the hash to .status.persistedStorageVersionHashes".
Judged by what etcd holds: nothing is put or deleted while `plan` runs.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from kubesim.leases import NAMESPACE as LEASE_NAMESPACE
from storage_migrator.cli import main
from storage_migrator.detection.actions import CreateState
from storage_migrator.detection.planner import SETTLE_ANNOTATION
from storage_migrator.detection.states import create_state
from storage_migrator.kube.crds import storage_version_hash

V1 = storage_version_hash("", "v1", "ConfigMap")
V2 = storage_version_hash("", "v2", "ConfigMap")


def _plan(kubesim: Any, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[list[dict[str, Any]], list[str]]:
    """`plan -o json`, and what etcd wrote or deleted meanwhile."""
    before = kubesim.etcd.revision()
    assert main(["--kubeconfig", kubesim.kubeconfig, "plan", "-o", "json", *extra]) == 0
    return json.loads(capsys.readouterr().out), _written(kubesim, before, kubesim.etcd.revision())


def _written(kubesim: Any, before: int, after: int) -> list[str]:
    """Keys put or deleted in etcd after revision `before` up to `after`, but for the API
    servers' identity leases: a server renews its own every 10 s (sim/kubesim/leases.py, as
    kube-apiserver does), which may fall while `plan` runs."""
    keys: list[str] = []
    if after == before:
        return keys
    events, cancel = kubesim.etcd.watch(b"/", start_revision=before + 1)
    try:
        for batch in events:
            if isinstance(batch, Exception):
                raise batch
            keys += [f"{e.type} {e.kv.key.decode()}" for e in batch if e.kv.mod_revision <= after]
            if any(e.kv.mod_revision >= after for e in batch):
                break
    finally:
        cancel()
    return [k for k in keys if not k.split(" ", 1)[1].startswith(f"/registry/leases/{LEASE_NAMESPACE}/apiserver-")]


def test_plan_after_a_storage_version_switch_lists_the_state_update_and_writes_nothing(
    kubesim: Any, clean_slate: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORAGE_MIGRATOR_INCLUDE_RESOURCES", "configmaps")
    custom = k8s.CustomObjectsApi(clean_slate)

    # A first install: the poll would create the StorageState and request a migration.
    actions, writes = _plan(kubesim, capsys)
    assert writes == []
    assert [(a["kind"], a.get("name"), a.get("resource")) for a in actions] == [
        ("CreateState", "configmaps", "configmaps"),
        ("CreateMigration", None, "configmaps"),
    ]
    assert (actions[0]["current_hash"], actions[0]["persisted"]) == (V1, ["Unknown"])
    assert actions[1]["target_hash"] == V1
    assert custom.list_cluster_custom_object("migration.k8s.io", "v1alpha1", "storagestates")["items"] == []

    # The state as a poll creates it, refined by a migration (persisted [V1]); then the "upgrade".
    created = CreateState.model_validate(actions[0])
    api = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    try:
        state = create_state(api, name=created.name, group=created.group, resource=created.resource,
                             current_hash=V1, persisted=[V1], heartbeat=created.heartbeat,
                             annotations=created.annotations, current_hashes=created.current_hashes)  # fmt: skip
    finally:
        api.close()
    kubesim.admin.set_storage_version("configmaps", "v2")

    actions, writes = _plan(kubesim, capsys)
    assert writes == [], "plan wrote to etcd"
    (update,) = actions  # within the settle delay: the state update only, no request yet
    assert update["kind"] == "UpdateState" and update["name"] == "configmaps"
    assert (update["current_hash"], update["persisted"]) == (V2, [V1, V2])
    assert update["resource_version"] == state.metadata.resource_version
    assert update["heartbeat"].endswith("Z")
    assert f"changed from {V1} to {V2}" in update["reason"]
    assert SETTLE_ANNOTATION in update["annotations"]  # the request waits for the settle delay

    # Nothing changed in the cluster: the state as it was, no migration requested.
    now = custom.get_cluster_custom_object("migration.k8s.io", "v1alpha1", "storagestates", "configmaps")
    assert now["metadata"]["resourceVersion"] == state.metadata.resource_version
    assert (now["status"]["currentStorageVersionHash"], now["status"]["persistedStorageVersionHashes"]) == (V1, [V1])
    assert custom.list_cluster_custom_object("migration.k8s.io", "v1alpha1", "storageversionmigrations")["items"] == []

    # -o yaml: the same actions; the table: one row per action.
    assert main(["--kubeconfig", kubesim.kubeconfig, "plan", "-o", "yaml"]) == 0
    assert [a["kind"] for a in yaml.safe_load(capsys.readouterr().out)] == ["UpdateState"]
    assert main(["--kubeconfig", kubesim.kubeconfig, "plan"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ACTION", "OBJECT", "REASON"]
    assert lines[1].split()[:2] == ["UpdateState", "storagestates.migration.k8s.io/configmaps"]
