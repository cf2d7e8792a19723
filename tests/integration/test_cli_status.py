"""`storage-migrator status` against kubesim, from real StorageStates and StorageVersionMigrations.

Issue 12 item 2: "`status`: one row per resource — current hash, persisted
hashes, the last migration's phase, progress, rate and ETA — like `kubectl
get` ... JSON output is a list of objects with stable keys, documented."
The values are judged, not the layout (tests/unit/operations/test_overview.py has the rules).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from storage_migrator.cli import main
from storage_migrator.models import format_time

GROUP, VERSION = "migration.k8s.io", "v1alpha1"


def _state(custom: Any, name: str, group: str, resource: str, current: str, persisted: list[str]) -> None:
    custom.create_cluster_custom_object(GROUP, VERSION, "storagestates", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "StorageState", "metadata": {"name": name},
        "spec": {"resource": {"group": group, "resource": resource}}})  # fmt: skip
    custom.patch_cluster_custom_object_status(GROUP, VERSION, "storagestates", name, {
        "status": {"currentStorageVersionHash": current, "persistedStorageVersionHashes": persisted}})  # fmt: skip


def _migration(custom: Any, name: str, resource: str, status: dict[str, Any]) -> None:
    custom.create_cluster_custom_object(GROUP, VERSION, "storageversionmigrations", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "StorageVersionMigration", "metadata": {"name": name},
        "spec": {"resource": {"group": "", "version": "v1", "resource": resource}}})  # fmt: skip
    if status:
        custom.patch_cluster_custom_object_status(GROUP, VERSION, "storageversionmigrations", name, {"status": status})


def _condition(kind: str, value: str, at: datetime) -> dict[str, str]:
    return {"type": kind, "status": value, "lastUpdateTime": format_time(at), "reason": "Test"}


def test_status_lists_each_resource_with_its_last_migration(
    kubesim: Any, clean_slate: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    custom = k8s.CustomObjectsApi(clean_slate)
    now = datetime.now(UTC).replace(microsecond=0)
    _state(custom, "secrets", "", "secrets", "hS2", ["hS1", "hS2"])
    _state(custom, "configmaps", "", "configmaps", "hC1", ["hC1"])
    _state(custom, "widgets.example.com", "example.com", "widgets", "hW", ["Unknown"])
    # secrets: an older finished migration, then the one Running now (300 listed in ~100 s, 700 left).
    # Created in the same second or later; within a second the name decides (tests/unit/operations/test_overview.py
    # has creationTimestamp first).
    started, done = now - timedelta(hours=2), now - timedelta(hours=2) + timedelta(seconds=50)
    _migration(custom, "secrets-1", "secrets", {
        "phase": "Succeeded", "targetStorageVersionHash": "hS1", "startedAt": format_time(started),
        "finishedAt": format_time(done), "progress": {"listed": 1000},
        "conditions": [_condition("Running", "False", done), _condition("Succeeded", "True", done)]})  # fmt: skip
    running_since = now - timedelta(seconds=100)
    _migration(custom, "secrets-2", "secrets", {
        "phase": "Running", "targetStorageVersionHash": "hS2", "startedAt": format_time(running_since),
        "progress": {"listed": 300, "remainingItemCount": 700, "chunks": 3},
        "conditions": [_condition("Running", "True", now)]})  # fmt: skip
    # configmaps: finished in 50 s with 1000 objects: 20 objects/s. jobs: requested by hand, not started.
    _migration(custom, "configmaps-a", "configmaps", {
        "phase": "Succeeded", "targetStorageVersionHash": "hC1", "startedAt": format_time(started),
        "finishedAt": format_time(done), "progress": {"listed": 1000},
        "conditions": [_condition("Running", "False", done), _condition("Succeeded", "True", done)]})  # fmt: skip
    _migration(custom, "jobs-a", "jobs", {})

    before = datetime.now(UTC)
    assert main(["--kubeconfig", kubesim.kubeconfig, "status", "-o", "json"]) == 0
    after = datetime.now(UTC)
    rows = json.loads(capsys.readouterr().out)
    by_name = {(r["group"], r["resource"]): r for r in rows}
    assert list(by_name) == [("", "configmaps"), ("", "jobs"), ("", "secrets"), ("example.com", "widgets")]

    secrets = by_name[("", "secrets")]
    # Rate and ETA depend on the clock: bounded by the instants before and after the command.
    slow, fast = 300 / (after - running_since).total_seconds(), 300 / (before - running_since).total_seconds()
    assert slow - 0.01 <= secrets.pop("rate") <= fast + 0.01
    assert 700 / fast - 1 <= secrets.pop("eta_seconds") <= 700 / slow + 1
    assert secrets == {
        "cluster": "default", "resource": "secrets", "group": "", "current_hash": "hS2",
        "persisted_hashes": ["hS1", "hS2"],
        "migration": "secrets-2", "phase": "Running", "target_hash": "hS2", "listed": 300, "remaining": 700,
        "started_at": format_time(running_since), "finished_at": None, "engine": "client",
    }  # fmt: skip
    assert by_name[("", "configmaps")] == {
        "cluster": "default", "resource": "configmaps", "group": "", "current_hash": "hC1",
        "persisted_hashes": ["hC1"],
        "migration": "configmaps-a", "phase": "Succeeded", "target_hash": "hC1", "listed": 1000, "remaining": None,
        "started_at": format_time(started), "finished_at": format_time(done), "rate": 20.0, "eta_seconds": None,
        "engine": "client",
    }  # fmt: skip
    jobs = by_name[("", "jobs")]
    assert (jobs["current_hash"], jobs["persisted_hashes"], jobs["migration"], jobs["phase"], jobs["rate"]) == (
        None, [], "jobs-a", "Pending", None)  # fmt: skip
    widgets = by_name[("example.com", "widgets")]
    assert (widgets["persisted_hashes"], widgets["migration"], widgets["phase"]) == (["Unknown"], None, None)

    # -o yaml: the same data.
    assert main(["--kubeconfig", kubesim.kubeconfig, "status", "-o", "yaml"]) == 0
    again = yaml.safe_load(capsys.readouterr().out)
    assert [{k: v for k, v in r.items() if k not in ("rate", "eta_seconds")} for r in again] == [
        {k: v for k, v in r.items() if k not in ("rate", "eta_seconds")} for r in rows
    ]

    # The table: one row per resource, named as kubectl names them.
    assert main(["--kubeconfig", kubesim.kubeconfig, "status"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["RESOURCE", "CURRENT", "HASH"]
    table = {line.split()[0]: line.split() for line in lines[1:]}
    assert table["configmaps"] == ["configmaps", "hC1", "hC1", "configmaps-a", "Succeeded", "client", "1000", "20/s",
                                   "-"]  # fmt: skip
    assert table["secrets"][:7] == ["secrets", "hS2", "hS1,hS2", "secrets-2", "Running", "client", "300/1000"]
    assert table["widgets.example.com"] == ["widgets.example.com", "hW", "Unknown", "-", "-", "-", "-", "-", "-"]


def test_status_of_a_first_install(kubesim: Any, clean_slate: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing yet: an empty list for scripts; kubectl's "No resources found" on stderr for people."""
    assert main(["--kubeconfig", kubesim.kubeconfig, "status", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["--kubeconfig", kubesim.kubeconfig, "status"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "No resources found" in err
