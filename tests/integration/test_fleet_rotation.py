"""A fleet rotation (issue 20, item 4), against two kubesim clusters, each over its own etcd.

Issue 20: "`rotate-encryption-key` accepts several clusters. It runs them side by side with
a limit (a parameter), and gives one verdict per cluster and one summary table. One failing
or unreachable cluster never blocks or fails the others' verdicts." And its test: "A fleet
rotation of both clusters. Cluster b has a failing Secret: the verdict is per cluster, a is
`Completed`, b is `Failed`, and the summary says so." Judged by what each etcd holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crd_install import cluster_with_crds
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
from prefect_kubernetes.credentials import KubernetesClusterConfig

from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.etcd import prefix_end

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]

SECRETS = ("good", "other", "bad")
FAST: dict[str, Any] = {"write_rate_per_second": 5000.0, "write_concurrency": 4, "chunk_size": 100}


def encrypted_with(cluster: Cluster) -> dict[str, str]:
    """The key each Secret of the `default` namespace is stored under, read from the cluster's etcd."""
    prefix = b"/registry/secrets/default/"
    etcd = cluster.etcd()
    try:
        values = {bytes(kv.key).decode().rsplit("/", 1)[1]: bytes(kv.value)
                  for kv in etcd.range(prefix, prefix_end(prefix)).kvs}  # fmt: skip
    finally:
        etcd.close()
    return {name: v.split(b":")[4].decode() if v.startswith(b"k8s:enc:") else "plaintext" for name, v in values.items()}


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, tuple[Cluster, Admin]]]:
    """Clusters a and b, each a block of its own, Secrets stored under key1 and key2 made the write key
    on every server (seed 003's order); no environment's cluster to fall back on."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("STORAGE_MIGRATOR_KUBECONFIG", raising=False)
    suffix = uuid.uuid4().hex[:6]
    a, b = f"a-{suffix}", f"b-{suffix}"
    with cluster_with_crds(tmp_path / f"{a}.kubeconfig") as first, \
            cluster_with_crds(tmp_path / f"{b}.kubeconfig") as second:  # fmt: skip
        clusters = {}
        for name, cluster in ((a, first), (b, second)):
            kubeconfig = tmp_path / f"{name}.kubeconfig"
            admin = Admin.from_kubeconfig(kubeconfig)
            admin.set_encryption(["key1"], resources=["secrets"])
            with k8s_config.new_client_from_config(config_file=str(kubeconfig)) as api:
                for secret in SECRETS:
                    k8s.CoreV1Api(api).create_namespaced_secret("default", k8s.V1Secret(
                        metadata=k8s.V1ObjectMeta(name=secret), string_data={"v": secret}))  # fmt: skip
            admin.set_encryption(["key1", "key2"], resources=["secrets"])
            admin.set_encryption(["key2", "key1"], resources=["secrets"])
            KubernetesClusterConfig.from_file(Path(kubeconfig)).save(name, overwrite=True)
            clusters[name] = (cluster, admin)
        yield clusters


def test_each_cluster_gets_its_own_verdict_and_the_summary_names_them(
    fleet: dict[str, tuple[Cluster, Admin]],
) -> None:
    from flows.rotate_encryption_key import rotate_encryption_key

    a, b = sorted(fleet)
    ghost = f"ghost-{uuid.uuid4().hex[:6]}"  # no such block: unreachable
    (cluster_a, _), (cluster_b, admin_b) = fleet[a], fleet[b]
    admin_b.set_faults([{"verb": "patch", "resource": "secrets", "namespace": "default", "name": "bad",
                         "code": 422, "message": "denied by webhook"}])  # fmt: skip

    state: Any = rotate_encryption_key(key="key2", resources=["secrets"], clusters=[a, b, ghost],
                                       max_parallel_clusters=3, return_state=True, **FAST)  # fmt: skip

    assert state.is_failed()
    message = state.message or ""
    assert "Completed on 1 of 3 clusters" in message, message
    assert f"{b}: Failed" in message and "default/bad" in message, message
    assert f"{ghost}: Failed" in message and f"no KubernetesClusterConfig block named '{ghost}'" in message
    assert f"{a}:" not in message.split("not on", 1)[1], "a's verdict is its own"
    assert "Do not remove the old key from those clusters yet" in message
    # What etcd holds: a is wholly under key2; b keeps key1 only for the Secret it could not rewrite.
    assert encrypted_with(cluster_a) == dict.fromkeys(SECRETS, "key2")
    assert encrypted_with(cluster_b) == {"good": "key2", "other": "key2", "bad": "key1"}
    with get_client(sync_client=True) as client:
        table = client.read_latest_artifacts()
        runs = {c: client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"cluster:{c}"])))
                for c in (a, b)}  # fmt: skip
    summary = [t for t in table if t.key == "rotate-encryption-key-key2-fleet"]
    assert summary and str(summary[0].description).startswith("rotation to key key2: Completed on 1 of 3")
    # Each cluster's migrations are its own runs, named and tagged for it (issue 20: "run names and tags"):
    # a's request and its verification pass; b's request only (it failed, so nothing to verify).
    migrations = {c: [r.name for r in runs[c] if r.name.startswith(f"{c}:migrate-secrets-v1-")] for c in (a, b)}
    assert (len(migrations[a]), len(migrations[b])) == (2, 1), migrations
