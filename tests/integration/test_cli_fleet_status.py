"""`status` and `plan` of a named cluster, and of the fleet (issue 20), against kubesim through real blocks.

A named cluster is reached through its KubernetesClusterConfig block, saved on
the session's real Prefect server, with no other credentials in the
environment. `status --all-clusters` reads the default cluster and every
cluster a run recorded (the Variables `storage-migrator-cluster-<name>`); one
whose block is gone is named on stderr with its error, the others are shown,
and the exit code is 1.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import Kubesim
from kubernetes import client as k8s
from prefect.variables import Variable
from prefect_kubernetes.credentials import KubernetesClusterConfig

from storage_migrator.cli import main
from storage_migrator.fleet.names import identity_variable

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api", "migration_crds")]

GROUP, VERSION = "migration.k8s.io", "v1alpha1"


@pytest.fixture
def kubesim_block(kubesim: Kubesim) -> str:
    """A fresh block name holding kubesim's kubeconfig (a cluster named for this test)."""
    name = f"fleet-{uuid.uuid4().hex[:8]}"
    KubernetesClusterConfig.from_file(Path(kubesim.kubeconfig)).save(name, overwrite=True)
    return name


@pytest.fixture
def no_environment_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No kubeconfig to fall back on and not in a pod: a named cluster can only be reached through its block."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("STORAGE_MIGRATOR_KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


def _state(api: Any, name: str, current: str) -> None:
    custom = k8s.CustomObjectsApi(api)
    custom.create_cluster_custom_object(GROUP, VERSION, "storagestates", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "StorageState", "metadata": {"name": name},
        "spec": {"resource": {"group": "", "resource": name}}})  # fmt: skip
    custom.patch_cluster_custom_object_status(GROUP, VERSION, "storagestates", name, {
        "status": {"currentStorageVersionHash": current, "persistedStorageVersionHashes": [current]}})  # fmt: skip


@pytest.mark.usefixtures("no_environment_credentials")
def test_status_and_plan_of_a_named_cluster_go_through_its_block(
    clean_slate: Any, kubesim_block: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _state(clean_slate, "configmaps", "hC1")

    assert main(["status", "--cluster", kubesim_block, "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["cluster"], r["resource"], r["current_hash"]) for r in rows] == [(kubesim_block, "configmaps", "hC1")]

    assert main(["plan", "--cluster", kubesim_block, "-o", "json"]) == 0
    actions = json.loads(capsys.readouterr().out)
    assert actions and {a["cluster"] for a in actions} == {kubesim_block}
    assert "configmaps" in {a.get("name") for a in actions}  # the StorageState made above, seen through the block

    # The environment has no credentials: without --cluster the default cluster cannot be read.
    assert main(["status", "-o", "json"]) == 1
    assert "kubeconfig" in capsys.readouterr().err


def test_a_cluster_without_a_block_is_named_with_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--cluster", "no-such-cluster"]) == 1
    err = capsys.readouterr().err
    assert "no KubernetesClusterConfig block named 'no-such-cluster'" in err
    assert "KubernetesClusterConfig.from_file(PATH).save('no-such-cluster')" in err


def test_status_and_plan_of_the_fleet_show_every_cluster_they_can_read_and_name_the_one_they_cannot(
    kubesim: Kubesim, clean_slate: Any, kubesim_block: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _state(clean_slate, "secrets", "hS1")
    gone = f"gone-{uuid.uuid4().hex[:8]}"  # a cluster that ran once; its block was deleted since
    Variable.set(identity_variable(kubesim_block), {"uid": "uid-of-kubesim"}, overwrite=True)
    Variable.set(identity_variable(gone), {"uid": "uid-of-gone"}, overwrite=True)

    assert main(["--kubeconfig", kubesim.kubeconfig, "status", "--all-clusters", "-o", "json"]) == 1
    out, err = capsys.readouterr()
    rows = {(r["cluster"], r["resource"]): r for r in json.loads(out)}
    assert rows[("default", "secrets")]["current_hash"] == "hS1"  # the environment's cluster
    assert rows[(kubesim_block, "secrets")]["current_hash"] == "hS1"  # the same cluster, through its block
    assert all(cluster != gone for cluster, _ in rows)
    assert f"cluster {gone!r} could not be read" in err and "no KubernetesClusterConfig block named" in err

    assert main(["--kubeconfig", kubesim.kubeconfig, "status", "--all-clusters"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["CLUSTER", "RESOURCE"]
    assert {(line.split()[0], line.split()[1]) for line in lines[1:]} >= {("default", "secrets"),
                                                                         (kubesim_block, "secrets")}  # fmt: skip

    # plan: the same clusters, each planned; the one whose block is gone named, exit 1.
    assert main(["--kubeconfig", kubesim.kubeconfig, "plan", "--all-clusters", "-o", "json"]) == 1
    out, err = capsys.readouterr()
    assert {"default", kubesim_block} <= {a["cluster"] for a in json.loads(out)}
    assert f"cluster {gone!r} could not be read" in err


@pytest.mark.usefixtures("no_environment_credentials")
def test_a_named_clusters_run_is_in_the_ledger_under_its_name(
    namespace: str, kubesim_block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """migrate-resource with `cluster` records its run as that cluster's; `history --cluster` finds it."""
    from flows.migrate_resource import migrate_resource
    from storage_migrator.ledger.writer import writer_for

    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv("STORAGE_MIGRATOR_DATABASE_URL", ledger)

    state: Any = migrate_resource(resource="configmaps", cluster=kubesim_block, write_rate_per_second=2000.0,
                                  return_state=True)  # fmt: skip

    assert state.is_completed(), state.message
    assert writer_for(ledger).flush(30)
    assert main(["history", "--cluster", kubesim_block, "-o", "json"]) == 0  # cross-checked through the block
    [run] = json.loads(capsys.readouterr().out)
    assert (run["kind"], run["cluster"], run["resource"], run["outcome"]) == ("run", kubesim_block, "configmaps",
                                                                              "succeeded")  # fmt: skip
    assert main(["history", "--no-requests", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == []  # the default cluster ran nothing
