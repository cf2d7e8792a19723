"""Issue 20: "Every flow takes `cluster`, the block's name. Left out, it means 'the cluster from
the environment', as today." One worker serves the fleet: its own credentials are its default cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cluster_scope import cluster_settings
from storage_migrator.fleet.identity import WrongCluster


def test_a_named_cluster_uses_its_block_whatever_the_workers_kubeconfig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("STORAGE_MIGRATOR_KUBECONFIG", str(tmp_path / "default-cluster"))
    monkeypatch.setenv("STORAGE_MIGRATOR_CHUNK_SIZE", "77")

    named = cluster_settings("prod-eu", write_rate_per_second=3.0)
    assert (named.cluster_config_block, named.kubeconfig, named.in_cluster) == ("prod-eu", None, None)
    assert (named.chunk_size, named.write_rate_per_second) == (77, 3.0)

    for default in (None, "default"):
        own = cluster_settings(default)
        assert (own.cluster_config_block, own.kubeconfig) == (None, tmp_path / "default-cluster")


def test_a_named_cluster_with_a_kubeconfig_too_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match=r"cluster .prod-eu. names its credentials.*leave out kubeconfig"):
        cluster_settings("prod-eu", kubeconfig="/etc/kubeconfig")
    with pytest.raises(ValueError, match="not a KubernetesClusterConfig block name"):
        cluster_settings("Prod EU")


def test_a_pull_mode_worker_runs_for_its_own_cluster_with_its_own_credentials(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 30: "Only a worker running inside that cluster serves that pool ... using its
    in-cluster ServiceAccount. No block is needed"; "Everything scoped by cluster today stays
    scoped" (settings.cluster names it)."""
    monkeypatch.setenv("STORAGE_MIGRATOR_CLUSTER", "prod-eu")
    monkeypatch.setenv("STORAGE_MIGRATOR_KUBECONFIG", str(tmp_path / "prod-eu-only"))
    own = cluster_settings("prod-eu", chunk_size=5)
    assert (own.cluster, own.cluster_config_block, own.kubeconfig, own.chunk_size) == (
        "prod-eu", None, tmp_path / "prod-eu-only", 5)  # fmt: skip
    with pytest.raises(ValueError, match="with its own credentials"):
        cluster_settings("prod-eu", kubeconfig="/elsewhere")


@pytest.mark.parametrize("other", ["prod-us", None, "default"])
def test_a_run_for_another_cluster_fails_on_a_pull_mode_worker_naming_both(
    monkeypatch: pytest.MonkeyPatch, other: str | None
) -> None:
    """Issue 30: "A flow run for cluster B that reaches a worker of cluster A fails before any
    write, naming both." cluster_settings is each flow's first step: nothing is read before it."""
    monkeypatch.setenv("STORAGE_MIGRATOR_CLUSTER", "prod-eu")
    with pytest.raises(WrongCluster) as stopped:
        cluster_settings(other)
    wanted = other or "default"
    assert f"for cluster {wanted!r}" in str(stopped.value) and "serves cluster 'prod-eu'" in str(stopped.value)
    assert "Nothing was read or written" in str(stopped.value)


def test_push_mode_scopes_by_the_blocks_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORAGE_MIGRATOR_CLUSTER", raising=False)
    assert cluster_settings("prod-eu").cluster == "prod-eu"
    assert cluster_settings(None).cluster is None
    monkeypatch.setenv("STORAGE_MIGRATOR_CLUSTER", "prod-us")
    monkeypatch.setenv("STORAGE_MIGRATOR_CLUSTER_CONFIG_BLOCK", "prod-eu")
    with pytest.raises(ValueError, match="name two clusters"):
        cluster_settings("prod-us")


def test_a_worker_whose_environment_names_a_block_is_not_in_pull_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """STORAGE_MIGRATOR_CLUSTER_CONFIG_BLOCK (a single cluster's credentials in a block, before
    there were fleets) keeps working: its runs are for that block's cluster, scoped by its name."""
    monkeypatch.delenv("STORAGE_MIGRATOR_CLUSTER", raising=False)
    monkeypatch.setenv("STORAGE_MIGRATOR_CLUSTER_CONFIG_BLOCK", "lab")
    own = cluster_settings(None)
    assert (own.cluster, own.cluster_config_block) == ("lab", "lab")
    assert cluster_settings("prod-eu").cluster_config_block == "prod-eu"


def test_the_engine_is_the_installs_in_pull_mode_and_the_runs_in_push_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 36, "the cluster decides": in pull mode the install (its ConfigMap storage-migrator-cluster) says which
    engine writes; a run may repeat it, never change it. In push mode the Prefect server already holds the
    cluster's credentials: the run's parameter (`fleet add --engine` on its deployment) chooses."""
    monkeypatch.setenv("STORAGE_MIGRATOR_ENGINE", "in-tree")
    monkeypatch.delenv("STORAGE_MIGRATOR_CLUSTER", raising=False)
    assert cluster_settings(None).engine == "in-tree"
    assert cluster_settings("prod-eu", engine="client").engine == "client"
    with pytest.raises(ValueError, match="engine"):
        cluster_settings(None, engine="sideways")
    monkeypatch.setenv("STORAGE_MIGRATOR_CLUSTER", "prod-eu")
    assert cluster_settings("prod-eu", engine="in-tree").engine == "in-tree"
    with pytest.raises(ValueError, match=r"asks for engine client.*install runs engine in-tree.*the cluster decides"):
        cluster_settings("prod-eu", engine="client")
