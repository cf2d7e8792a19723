"""A rolling upgrade of three API servers, end to end, judged by etcd (issue 10).

Issue 10: "The same rolling upgrade on kubesim with three servers and writers
sending objects to every server throughout: at the end etcd holds only the final
version, and no migration was ever marked `Succeeded` while the servers
disagreed. Once with the StorageVersion API and once without it."

Seed 000, "Extending the work flow of the triggering controller": the leader
"creates a storageVersionMigration object to start migration, if
persistedStorageVersionHashes has "Unknown" or has more than one version, AND
the lastHeartbeatTime in all items of the CurrentStorageVersionHashes are no
older than 1 polling period (10 mins) AND the hashes in
currentStorageVersionHashes have been identical". The polls are the
`detect-storage-changes` flow, run by the test between the upgrade's steps.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import install_migration_crds, wait_until
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.codec import decode
from kubesim.etcd import prefix_end
from storage_migrator.kube.crds import storage_version_hash

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]

V1, V2 = storage_version_hash("", "v1", "ConfigMap"), storage_version_hash("", "v2", "ConfigMap")
GROUP, VERSION = "migration.k8s.io", "v1alpha1"


class Writers(threading.Thread):
    """Creates and updates ConfigMaps through every API server in turn, until stopped.

    One create and one update every PACE_SECONDS: writes all through the upgrade, at a pace
    that does not make a slow machine slower (issue 29; the test waits on their count), and
    `write_through` one server at once when the test asks."""

    PACE_SECONDS = 0.15

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        super().__init__(daemon=True)
        assert cluster.kubeconfig is not None
        self.apis = [
            k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig), context=f"kubesim-{i}")
            for i in range(len(cluster.servers))
        ]
        self.namespace = namespace
        self.stop = threading.Event()
        self.writes = [0] * len(self.apis)

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            i = n % len(self.apis)
            core = k8s.CoreV1Api(self.apis[i])
            try:
                core.create_namespaced_config_map(
                    self.namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"w-{n:05d}"), data={"n": str(n)})
                )
                if n >= 3:  # and touch an older one, so updates too go through every server
                    core.patch_namespaced_config_map(f"w-{n - 3:05d}", self.namespace, {"data": {"touched": str(n)}})
                self.writes[i] += 1
            except k8s.ApiException:
                pass  # a write lost to a race is not what this test is about
            n += 1
            self.stop.wait(self.PACE_SECONDS)

    def write_through(self, i: int, name: str) -> None:
        """A ConfigMap created through server `i` now (not counted: `writes` are the loop's)."""
        k8s.CoreV1Api(self.apis[i]).create_namespaced_config_map(
            self.namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name), data={"server": str(i)})
        )

    def close(self) -> None:
        self.stop.set()
        self.join(timeout=30)
        for api in self.apis:
            api.close()


class SucceededLog(threading.Thread):
    """When each StorageVersionMigration was first seen Succeeded (polled every 0.1 s)."""

    def __init__(self, api: Any) -> None:
        super().__init__(daemon=True)
        self.custom = k8s.CustomObjectsApi(api)
        self.seen: dict[str, float] = {}
        self.created: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for item in self.custom.list_cluster_custom_object(GROUP, VERSION, "storageversionmigrations")["items"]:
                name = item["metadata"]["name"]
                self.created.setdefault(name, time.monotonic())
                conditions = (item.get("status") or {}).get("conditions") or []
                if any(c["type"] == "Succeeded" and c["status"] == "True" for c in conditions):
                    self.seen.setdefault(name, time.monotonic())
            time.sleep(0.1)


@pytest.fixture(scope="module", params=["storage-version-api", "discovery-per-server"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three servers, with our CRDs; without the StorageVersion API detection finds them through
    the EndpointSlices. One per source for the module's tests (issue 29: two starts, not four);
    each test puts back what it changed (`put_back`)."""
    gates = {} if request.param == "storage-version-api" else {"StorageVersionAPI": False}
    with Cluster(servers=3, feature_gates=gates) as own:
        own.write_kubeconfig(tmp_path_factory.mktemp("rolling") / "kubeconfig")
        with k8s_config.new_client_from_config(config_file=str(own.kubeconfig)) as api:
            install_migration_crds(api)
        yield own


@pytest.fixture(autouse=True)
def put_back(cluster: Cluster) -> Iterator[None]:
    """After each test: every server's storage versions as before, no StorageStates nor migrations."""
    admins = [Admin(server.url) for server in cluster.servers]
    before = [admin.config()["storageVersions"] for admin in admins]
    yield
    for admin, versions in zip(admins, before, strict=True):
        now = admin.config()["storageVersions"]
        for group_resource, version in versions.items():
            if now.get(group_resource) != version:  # each switch republishes the StorageVersions: the changed only
                resource, _, group = group_resource.partition(".")
                admin.set_storage_version(resource, version, group=group)
    with k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig)) as api:
        custom = k8s.CustomObjectsApi(api)
        for plural in ("storageversionmigrations", "storagestates"):
            for item in custom.list_cluster_custom_object(GROUP, VERSION, plural)["items"]:
                custom.delete_cluster_custom_object(GROUP, VERSION, plural, item["metadata"]["name"])


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A namespace of the test's own, deleted with its objects afterwards (the cluster is shared)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    with k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig)) as api:
        k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    yield name
    with k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig)) as api:
        k8s.CoreV1Api(api).delete_namespace(name)


def configmap_versions(cluster: Cluster, namespace: str) -> dict[str, str]:
    etcd = cluster.etcd()
    try:
        prefix = f"/registry/configmaps/{namespace}/".encode()
        return {
            kv.key.decode().rsplit("/", 1)[1]: decode(kv.value, read_keys=[]).api_version
            for kv in etcd.range(prefix, prefix_end(prefix)).kvs
        }
    finally:
        etcd.close()


def test_a_rolling_upgrade_migrates_only_once_every_server_agrees(
    cluster: Cluster, namespace: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.detect_storage_changes import detect_storage_changes

    # The runs detection starts read their settings from the environment, as a worker does.
    monkeypatch.setenv("STORAGE_MIGRATOR_WRITE_RATE_PER_SECOND", "2000")
    monkeypatch.setenv("STORAGE_MIGRATOR_CHUNK_SIZE", "100")
    # Detection tracks ConfigMaps only: the other resources would only add migrations to wait for.
    monkeypatch.setenv("STORAGE_MIGRATOR_INCLUDE_RESOURCES", "configmaps")
    source = request.node.callspec.params["cluster"]
    kubeconfig = str(cluster.kubeconfig)
    api = k8s_config.new_client_from_config(config_file=kubeconfig)
    core = k8s.CoreV1Api(api)
    for i in range(60):
        core.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"cm-{i:03d}")))
    custom = k8s.CustomObjectsApi(api)

    def poll() -> Any:
        # settle 0 and a long period: the test's polls come seconds apart, and each
        # of them hears every server (seed 000: "no older than 1 polling period").
        return detect_storage_changes(settle_seconds=0, poll_seconds=300, kubeconfig=kubeconfig)

    def state() -> dict[str, Any]:
        return dict(custom.get_cluster_custom_object(GROUP, VERSION, "storagestates", "configmaps")["status"])

    writers, log = Writers(cluster, namespace), SucceededLog(api)
    writers.start()
    log.start()
    try:
        first = poll()  # new StorageStates: migrate to learn what is stored, then refine
        assert first.agreement_source == source
        assert len(first.api_servers) == 3
        assert state()["persistedStorageVersionHashes"] == [V1]

        upgraded_at = time.monotonic()
        for i in range(3):
            Admin(cluster.servers[i].url).set_storage_version("configmaps", "v2")
            # Writers go through the upgraded server: one write through it now, beside the
            # background writers (issue 29: the write itself, not a 0.5 s sleep for one).
            writers.write_through(i, f"upgraded-{i}")
            if i < 2:
                during = poll()
                assert not during.applied.created_migrations, "a migration was requested while servers disagreed"
                hashes = sorted(e["currentStorageVersionHash"] for e in state()["currentStorageVersionHashes"])
                assert hashes == sorted([V2] * (i + 1) + [V1] * (2 - i))
                assert sorted(state()["persistedStorageVersionHashes"]) == sorted([V1, V2])
        agreed_at = time.monotonic()

        last = poll()  # all agree: request, run, and (run-migrations' closing poll) refine
        assert last.applied.created_migrations
        final = state()
        assert final["persistedStorageVersionHashes"] == [V2]
        assert final["currentStorageVersionHash"] == V2
        assert [e["currentStorageVersionHash"] for e in final["currentStorageVersionHashes"]] == [V2] * 3
        # Writers run from before the first poll to after the last; a quick run waits here for
        # the writes the assertion below asks of each server (a count, not a guess at a duration).
        wait_until(lambda: min(writers.writes) > 10, what="more than 10 writes through each server")
    finally:
        writers.close()
        log.stop.set()
        log.join(timeout=10)
        api.close()

    assert min(writers.writes) > 10, f"every server took writes throughout: {writers.writes}"
    versions = configmap_versions(cluster, namespace)
    assert len(versions) >= 60 + sum(writers.writes) - 3
    assert set(versions.values()) == {"v2"}, "etcd holds only the final version"
    during_disagreement = {n: t for n, t in log.seen.items() if upgraded_at <= t <= agreed_at}
    assert not during_disagreement, f"marked Succeeded while the servers disagreed: {during_disagreement}"


def test_discover_names_the_source_and_each_servers_hash(
    cluster: Cluster, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 10: "`storage-migrator discover` shows which source is in use and, per
    resource, each server's hash". Each server is asked on its own, with the
    kubeconfig's credentials (the token-refresh hook of the kubernetes client must
    not send it back to the kubeconfig's server)."""
    import json

    from storage_migrator.cli import main

    Admin(cluster.servers[1].url).set_storage_version("configmaps", "v2")
    assert main(["--kubeconfig", str(cluster.kubeconfig), "discover", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    agreement = doc["agreement"]
    assert agreement["source"] == request.node.callspec.params["cluster"]
    assert len(agreement["servers"]) == 3
    heard = sorted(r["hash"] for r in agreement["reporters"] if r["resource"] == "configmaps" and r["group"] == "")
    assert heard == sorted([V1, V1, V2])

    assert main(["--kubeconfig", str(cluster.kubeconfig), "discover"]) == 0
    table = capsys.readouterr().out
    assert f"agreement among API servers from: {agreement['source']}" in table
    configmaps = next(line for line in table.splitlines() if line.startswith("configmaps "))
    # discovery's own column (server 0, still v1), then one column per server
    assert configmaps.count(V1) == 3 and configmaps.count(V2) == 1
