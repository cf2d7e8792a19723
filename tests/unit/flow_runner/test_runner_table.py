"""The runner's table of shipped flows is prefect.yaml's (issue 35: "the entrypoint is one of the
flows the image ships (the set prefect.yaml deploys)"), and it checks parameters with each
flow's own signature."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from flow_runner import shipped
from storage_migrator.fleet.deployments import FLEET_FLOWS

ROOT = Path(__file__).resolve().parents[3]
DEPLOYMENTS: list[dict[str, Any]] = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]


def test_the_table_is_what_prefect_yaml_deploys() -> None:
    assert set(shipped.SHIPPED) == {d["entrypoint"] for d in DEPLOYMENTS}
    assert {d["name"] for d in DEPLOYMENTS} == set(FLEET_FLOWS)


@pytest.mark.parametrize("entrypoint", sorted(shipped.SHIPPED))
def test_each_entry_imports_the_flow_the_entrypoint_names(entrypoint: str) -> None:
    flow = shipped.load(entrypoint)
    assert flow.fn.__name__ == entrypoint.split(":")[1]
    assert Path(flow.fn.__code__.co_filename).resolve() == ROOT / entrypoint.split(":")[0]


def test_the_install_directory_is_where_the_flows_are() -> None:
    """A checkout's root here; /opt/prefect in the image (its WORKDIR, where uv installs the project)."""
    assert shipped.INSTALL_DIRECTORY == ROOT
    assert "WORKDIR /opt/prefect" in (ROOT / "Dockerfile").read_text()


def test_the_parameters_are_checked_with_the_flows_own_signature() -> None:
    migrate = "flows/migrate_resource.py:migrate_resource"
    assert shipped.parameter_problem(migrate, {"resource": "configmaps", "cluster": "a", "chunk_size": 50}) is None
    unknown = shipped.parameter_problem(migrate, {"resource": "configmaps", "command": "sh -c id"})
    assert unknown is not None and "command" in unknown and "\n" not in unknown
    wrong = shipped.parameter_problem(migrate, {"chunk_size": "many"})
    assert wrong is not None and "chunk_size" in wrong
    missing = shipped.parameter_problem("flows/rotate_encryption_key.py:rotate_encryption_key", {})
    assert missing is not None and "key" in missing


def test_the_install_reads_its_cluster_from_its_own_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORAGE_MIGRATOR_CLUSTER_CONFIG_BLOCK", raising=False)
    monkeypatch.setenv("STORAGE_MIGRATOR_CLUSTER", "prod-eu")
    assert shipped.install().cluster == "prod-eu"
    monkeypatch.setenv("STORAGE_MIGRATOR_CLUSTER_CONFIG_BLOCK", "prod-eu")  # push mode: the block is the way in
    assert shipped.install().cluster is None
    monkeypatch.delenv("STORAGE_MIGRATOR_CLUSTER_CONFIG_BLOCK")
    monkeypatch.setenv("STORAGE_MIGRATOR_CHUNK_SIZE", "not-a-number")
    with pytest.raises(shipped.InstallUnreadable, match="STORAGE_MIGRATOR_"):
        shipped.install()


@pytest.mark.parametrize("entrypoint", sorted(shipped.SHIPPED))
def test_no_flow_has_crash_or_cancellation_hooks(entrypoint: str) -> None:
    """`storage-migrator worker` runs no hook in the worker (Prefect's would load the flow through the
    API's pull steps there: cli/workers.py): our flows must have none to lose."""
    flow = shipped.load(entrypoint)
    assert not flow.on_crashed_hooks and not flow.on_cancellation_hooks
