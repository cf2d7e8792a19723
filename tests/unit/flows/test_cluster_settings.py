"""Issue 20: "Every flow takes `cluster`, the block's name. Left out, it means 'the cluster from
the environment', as today." One worker serves the fleet: its own credentials are its default cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cluster_scope import cluster_settings


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
