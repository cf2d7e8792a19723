"""A cluster is a named thing (issue 20), against two kubesim clusters, each over its own etcd.

Issue 20: "The cluster's identity is the UID of the kube-system namespace, read at the
start of every run and recorded. A block whose identity changed (its kubeconfig now points
at another cluster) fails the run before any write, and the message names both
identities" and "a run for cluster A can never write to cluster B. Prove it with a test
that points a block at the wrong cluster." Judged by what cluster B's etcd holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Kubesim, wait_until
from crd_install import cluster_with_crds
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
from prefect.variables import Variable
from prefect_kubernetes.credentials import KubernetesClusterConfig

from kubesim.cluster import Cluster
from kubesim.etcd import prefix_end
from storage_migrator.fleet.names import identity_variable

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api", "migration_crds")]

MIGRATIONS = b"/registry/migration.k8s.io/storageversionmigrations/"
#: Every ConfigMap of the session's cluster is migrated: at 10 writes/s (the default) a minute of pacing.
FAST: dict[str, Any] = {"write_rate_per_second": 2000.0, "write_concurrency": 8, "chunk_size": 500}


@pytest.fixture(scope="module")
def shared_cluster_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Path]]:
    """A second cluster, with its own etcd and our CRDs, and one ConfigMap to migrate: one for
    the module (issue 29); `cluster_b` puts back what each test wrote there."""
    kubeconfig = tmp_path_factory.mktemp("fleet") / "cluster-b.kubeconfig"
    with cluster_with_crds(kubeconfig) as other, k8s_config.new_client_from_config(config_file=str(kubeconfig)) as api:
        k8s.CoreV1Api(api).create_namespaced_config_map(
            "default", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="only-in-b"), data={"k": "v"})
        )
        yield other, kubeconfig


@pytest.fixture
def cluster_b(shared_cluster_b: tuple[Cluster, Path]) -> Iterator[tuple[Cluster, Path]]:
    """Cluster B as the test found it afterwards: no StorageStates, no migrations (a run there
    made them; the next test asserts none was made by its own run)."""
    yield shared_cluster_b
    with k8s_config.new_client_from_config(config_file=str(shared_cluster_b[1])) as api:
        custom = k8s.CustomObjectsApi(api)
        for plural in ("storageversionmigrations", "storagestates"):
            for item in custom.list_cluster_custom_object("migration.k8s.io", "v1alpha1", plural)["items"]:
                custom.delete_cluster_custom_object("migration.k8s.io", "v1alpha1", plural, item["metadata"]["name"])


@pytest.fixture
def block_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A fresh block name, and no other credentials to fall back on (no kubeconfig, not in a pod)."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("STORAGE_MIGRATOR_KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return f"fleet-{uuid.uuid4().hex[:8]}"


def kube_system_uid(kubeconfig: str | Path) -> str:
    with k8s_config.new_client_from_config(config_file=str(kubeconfig)) as api:
        return str(k8s.CoreV1Api(api).read_namespace("kube-system").metadata.uid)


def stored(cluster: Cluster, prefix: bytes) -> dict[bytes, int]:
    """key -> mod_revision under `prefix`, read from the cluster's etcd."""
    etcd = cluster.etcd()
    try:
        return {kv.key: kv.mod_revision for kv in etcd.range(prefix, prefix_end(prefix)).kvs}
    finally:
        etcd.close()


def test_a_block_pointed_at_another_cluster_fails_before_any_write(
    kubesim: Kubesim, namespace: str, cluster_b: tuple[Cluster, Path], block_only: str
) -> None:
    from flows.migrate_resource import migrate_resource

    other, other_kubeconfig = cluster_b
    uid_a, uid_b = kube_system_uid(kubesim.kubeconfig), kube_system_uid(other_kubeconfig)
    assert uid_a != uid_b
    KubernetesClusterConfig.from_file(Path(kubesim.kubeconfig)).save(block_only, overwrite=True)

    first: Any = migrate_resource(resource="configmaps", cluster=block_only, return_state=True, **FAST)

    assert first.is_completed(), first.message
    assert Variable.get(identity_variable(block_only)) == {"uid": uid_a}
    # Issue 37: the write budget is counted in each cluster (its writer Leases), never in a Prefect limit.
    with get_client(sync_client=True) as client:
        limits = [limit.name for limit in client.read_global_concurrency_limits(limit=200, offset=0)]
    assert not [name for name in limits if block_only in name], limits

    # The block's kubeconfig now points at cluster B: its identity is not the one recorded.
    KubernetesClusterConfig.from_file(other_kubeconfig).save(block_only, overwrite=True)
    before = stored(other, b"/registry/")

    second: Any = migrate_resource(resource="configmaps", cluster=block_only, return_state=True, **FAST)

    assert second.is_failed()
    assert uid_a in second.message and uid_b in second.message, second.message
    assert f"prefect variable delete {identity_variable(block_only)}" in second.message
    after = stored(other, b"/registry/")
    assert not [k for k in after if k.startswith(MIGRATIONS)], "no request was created in cluster B"
    assert not [k for k in after if k.startswith(b"/registry/leases/storage-migrator/")], "no writer Lease in B"
    configmaps = b"/registry/configmaps/"
    assert {k: r for k, r in after.items() if k.startswith(configmaps)} == {
        k: r for k, r in before.items() if k.startswith(configmaps)
    }, "no ConfigMap of cluster B was written"
    assert Variable.get(identity_variable(block_only)) == {"uid": uid_a}, "the record stays cluster A's"


def test_the_environments_cluster_is_read_and_never_judged(kubesim: Kubesim, namespace: str) -> None:
    """No block named: as before names, each worker's kubeconfig may be another cluster's."""
    from flows.migrate_resource import migrate_resource

    state: Any = migrate_resource(resource="configmaps", kubeconfig=kubesim.kubeconfig, return_state=True, **FAST)

    assert state.is_completed(), state.message
    assert Variable.get(identity_variable("default")) is None


def test_a_detection_poll_for_a_named_cluster_migrates_that_cluster_only(
    kubesim: Kubesim, namespace: str, cluster_b: tuple[Cluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20: "Every flow takes `cluster`, the block's name." The worker's own kubeconfig is
    cluster A (its default cluster); the poll for the block's cluster B records B's StorageState,
    requests B's migration and runs it there, with every run and event saying B; A is not touched."""
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    from flows.detect_storage_changes import detect_storage_changes

    other, other_kubeconfig = cluster_b
    name = f"fleet-{uuid.uuid4().hex[:8]}"
    KubernetesClusterConfig.from_file(other_kubeconfig).save(name, overwrite=True)
    monkeypatch.setenv("STORAGE_MIGRATOR_KUBECONFIG", kubesim.kubeconfig)
    monkeypatch.setenv("STORAGE_MIGRATOR_INCLUDE_RESOURCES", "configmaps")
    ours = b"/registry/migration.k8s.io/"
    a_before = stored(kubesim.cluster, ours)

    state: Any = detect_storage_changes(cluster=name, return_state=True)

    assert state.is_completed(), state.message
    b_after = stored(other, ours)
    assert [k for k in b_after if k.startswith(ours + b"storagestates/")], "B's StorageState was written"
    assert [k for k in b_after if k.startswith(ours + b"storageversionmigrations/")], "B's request was made"
    with k8s_config.new_client_from_config(config_file=str(other_kubeconfig)) as api:
        made = k8s.CustomObjectsApi(api).list_cluster_custom_object("migration.k8s.io", "v1alpha1",
                                                                   "storageversionmigrations")["items"]  # fmt: skip
    assert [(m["spec"]["resource"]["resource"], m["status"]["phase"], m["status"]["progress"]["listed"] >= 1)
            for m in made] == [("configmaps", "Succeeded", True)], "B's request ran there, over B's ConfigMaps"  # fmt: skip
    assert stored(kubesim.cluster, ours) == a_before, "nothing of ours was written to A"
    requests = [k.rsplit(b"/", 1)[1].decode() for k in b_after if k.startswith(ours + b"storageversionmigrations/")]
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"cluster:{name}"])))

        def succeeded() -> list[str]:
            return [e.resource.id for e in client.read_events(filter=EventFilter(
                event=EventNameFilter(name=["storage-migrator.migration.succeeded"]),
                resource=EventResourceFilter(labels={"storage-migrator.cluster": [name]})), limit=50).events]  # fmt: skip

        events = wait_until(succeeded, what=f"the migration's event labelled cluster {name}", timeout=60)
    # The poll, its dispatcher and the migration, each tagged; the migration also named for the cluster.
    assert len(runs) >= 3 and [r for r in runs if r.name.startswith(f"{name}:migrate-configmaps-v1-")], runs
    assert events == [f"storage-migrator.storageversionmigration.{name}.{r}" for r in requests]
