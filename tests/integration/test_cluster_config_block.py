"""Credentials from a Prefect KubernetesClusterConfig block (issue 14, DESIGN 4.1).

Issue 14: "the kube credentials from a Prefect `KubernetesClusterConfig` block
when one is named, otherwise kubeconfig or in-cluster." A flow run on the
session's Prefect test server reaches kubesim through a block holding kubesim's
kubeconfig, with no other kubeconfig to fall back on.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Kubesim
from prefect import flow
from prefect_kubernetes.credentials import KubernetesClusterConfig

from storage_migrator.kube.connection import ConnectionConfigError
from storage_migrator.settings import Settings
from tasks.common import api_client
from tasks.detecting import Observations, observe

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api", "migration_crds")]


@flow(name="observe-through-a-block")
def observe_through(block: str) -> Observations:
    return observe(Settings(cluster_config_block=block))


def test_a_flow_reaches_kubesim_through_a_named_block(kubesim: Kubesim, monkeypatch: pytest.MonkeyPatch) -> None:
    KubernetesClusterConfig.from_file(Path(kubesim.kubeconfig)).save("kubesim-install", overwrite=True)
    # Nothing else to connect with: no kubeconfig, not in a pod.
    monkeypatch.setenv("KUBECONFIG", str(Path(kubesim.kubeconfig).with_name("absent")))
    monkeypatch.delenv("STORAGE_MIGRATOR_KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    observed = observe_through("kubesim-install")

    assert {"configmaps", "secrets", "storageversionmigrations"} <= {r.resource for r in observed.discovered}
    assert observed.api_servers == [] or observed.agreement_source != "discovery-per-server"


def test_a_missing_block_is_named_with_the_fix() -> None:
    with pytest.raises(ConnectionConfigError) as exc:
        api_client(Settings(cluster_config_block="no-such-block"))
    assert "no KubernetesClusterConfig block named 'no-such-block'" in str(exc.value)
    assert "STORAGE_MIGRATOR_CLUSTER_CONFIG_BLOCK" in str(exc.value)


def test_a_block_with_kubeconfig_or_in_cluster_set_is_refused() -> None:
    with pytest.raises(ValueError, match="cluster_config_block"):
        Settings(cluster_config_block="kubesim-install", kubeconfig=Path("/tmp/kubeconfig"))
