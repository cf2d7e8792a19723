"""The `migrate-resource` flow on an HA control plane mid-upgrade: seed 001's rules.

Seed 001 "Consuming the StorageVersion API": the storage migrator "starts
migration if the storageVersion.status.agreedEncodingVersion differs from the
storageState.status.persistedStorageVersionHashes, aborts ongoing migration if
the storageVersion.status.agreedEncodingVersion is empty" (as shipped:
`status.commonEncodingVersion`). "Version Skew Strategy": "the migrator can
determine if the storage version has changed in the middle of migration by
comparing the RV of the storageVersion object before and after the migration."

The tests share one cluster (three API servers over one etcd; issue 29: one start per
module, not five), each in a namespace of its own, and judge by what etcd holds; each puts
back what it changed (see `api`). A change of the servers' storage versions "while the flow
runs" is made while one PATCH of the flow is held by an injected latency, so it
lands inside a chunk, never between two of the flow's reads.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import install_migration_crds
from kubernetes import client as k8s
from kubernetes.client import ApiClient

from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.codec import decode
from kubesim.etcd import prefix_end
from storage_migrator.conditions import is_condition_true
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.migration.requests import list_migrations
from storage_migrator.models import CONDITION_FAILED, CONDITION_RUNNING, CONDITION_SUCCEEDED, StorageVersionMigration
from storage_migrator.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]

#: Twelve chunks: a change inside the 6th leaves chunks 1-5 written before it and 7-12 after
#: (issue 29: chunks of 5 rather than 10; the rule needs chunks on both sides, not their size).
COUNT = 60
CHUNK = 5
#: How long the PATCH of HELD is held while the test changes the servers: the watcher sees the
#: fault fire (within 0.02 s) and makes one to three admin calls, well inside it on a loaded
#: machine. kubesim's latency fault cannot be released early, so this is a duration, not an event.
HOLD_SECONDS = 3.0
HELD = "cm-0027"  # in the 6th of 12 chunks
GROUP, VERSION = "migration.k8s.io", "v1alpha1"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three API servers over one etcd, with our CRDs, shared by the module's tests.

    Every test puts back what it changed (the `api` fixture): each server's storage
    versions and faults, the StorageStates and migrations; its namespace goes with its
    ConfigMaps (`namespace`), so each migration lists the test's own objects alone.
    """
    with Cluster(servers=3) as own:
        own.write_kubeconfig(tmp_path_factory.mktemp("ha") / "kubeconfig")
        client = api_client_from_settings(Settings(kubeconfig=own.kubeconfig))
        try:
            install_migration_crds(client)
        finally:
            client.close()  # type: ignore[no-untyped-call]
        yield own


@pytest.fixture
def api(cluster: Cluster) -> Iterator[ApiClient]:
    """A client of the shared cluster; afterwards the cluster as the test found it."""
    assert cluster.kubeconfig is not None
    before = [admin.config()["storageVersions"] for admin in admins(cluster)]
    client = api_client_from_settings(Settings(kubeconfig=cluster.kubeconfig))
    yield client
    for admin, versions_before in zip(admins(cluster), before, strict=True):
        admin.clear_faults()
        now = admin.config()["storageVersions"]
        for group_resource, version in versions_before.items():
            if now.get(group_resource) != version:  # each switch republishes the StorageVersions: the changed only
                resource, _, group = group_resource.partition(".")
                admin.set_storage_version(resource, version, group=group)
    custom = k8s.CustomObjectsApi(client)
    for plural in ("storageversionmigrations", "storagestates"):
        for item in custom.list_cluster_custom_object(GROUP, VERSION, plural)["items"]:
            custom.delete_cluster_custom_object(GROUP, VERSION, plural, item["metadata"]["name"])
    client.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def namespace(api: ApiClient) -> Iterator[str]:
    """COUNT ConfigMaps, written while every server stores configmaps in v1; deleted with them after."""
    core = k8s.CoreV1Api(api)
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))

    def create(i: int) -> None:
        core.create_namespaced_config_map(
            name, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"cm-{i:04d}"), data={"k": str(i)})
        )

    with ThreadPoolExecutor(max_workers=4) as pool:  # the data set, not the subject: made at once
        list(pool.map(create, range(COUNT)))
    yield name
    core.delete_namespace(name)  # kubesim deletes its objects at once, as the namespace controller does


def admins(cluster: Cluster) -> list[Admin]:
    return [Admin(s.url) for s in cluster.servers]


def set_all(cluster: Cluster, version: str) -> None:
    for admin in admins(cluster):
        admin.set_storage_version("configmaps", version)


def server_ids(cluster: Cluster) -> list[str]:
    return [s.registry.config.server_id for s in cluster.servers]


def stored(cluster: Cluster, namespace: str) -> dict[str, tuple[str, int]]:
    """name -> (stored apiVersion, mod_revision) of every ConfigMap of the namespace, from etcd."""
    etcd = cluster.etcd()
    try:
        prefix = f"/registry/configmaps/{namespace}/".encode()
        kvs = etcd.range(prefix, prefix_end(prefix)).kvs
    finally:
        etcd.close()
    return {
        kv.key.decode().rsplit("/", 1)[1]: (decode(kv.value, read_keys=[]).api_version, kv.mod_revision) for kv in kvs
    }


def versions(cluster: Cluster, namespace: str) -> set[str]:
    return {version for version, _ in stored(cluster, namespace).values()}


def requests_of(cluster: Cluster, *verbs: str) -> int:
    """Requests on configmaps with these verbs, summed over every API server."""
    total = 0
    for admin in admins(cluster):
        by_resource = admin.counters()["requestsByResource"]
        total += sum(by_resource.get(f"{verb} configmaps", 0) for verb in verbs)
    return total


def run_flow(cluster: Cluster, **params: Any) -> Any:
    from flows.migrate_resource import migrate_resource

    return migrate_resource(resource="configmaps", kubeconfig=str(cluster.kubeconfig), chunk_size=CHUNK,
                            write_rate_per_second=400.0, write_concurrency=4, return_state=True,
                            **params)  # fmt: skip


def the_request(api: ApiClient, *, state: Any) -> StorageVersionMigration:
    name = state.message.split(":", 1)[0] if state.is_failed() else state.result().migration
    (request,) = [m for m in list_migrations(api) if m.metadata.name == name]
    return request


def condition(request: StorageVersionMigration, kind: str) -> tuple[str | None, str | None]:
    (found,) = [c for c in request.status.conditions if c.type == kind and c.status == "True"]
    return found.reason, found.message


class WhileHeld(threading.Thread):
    """Holds the PATCH of HELD on API server 0 for HOLD_SECONDS and runs `change` meanwhile."""

    def __init__(self, cluster: Cluster, namespace: str, change: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.admin = Admin(cluster.servers[0].url)
        self.change = change
        self.done = threading.Event()
        self.stop = threading.Event()
        self.admin.set_faults([{"verb": "patch", "resource": "configmaps", "namespace": namespace, "name": HELD,
                                "latency": HOLD_SECONDS, "times": 1}])  # fmt: skip

    def run(self) -> None:
        while not self.stop.is_set():
            if self.admin.faults()[0]["fired"]:
                self.change()
                self.done.set()
                return
            time.sleep(0.02)

    def __enter__(self) -> WhileHeld:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join(timeout=30)
        self.admin.clear_faults()


def test_servers_that_disagree_at_the_start_fail_the_request_and_write_nothing(
    cluster: Cluster, api: ApiClient, namespace: str
) -> None:
    """Seed 001: the migrator "starts migration if the ... agreedEncodingVersion" is
    set; one server of three mid-upgrade to v2 leaves it empty, so the request ends
    Failed (`NoCommonEncodingVersion`, naming what each server encodes) and no
    object is written: etcd is byte-for-byte where it was."""
    Admin(cluster.servers[2].url).set_storage_version("configmaps", "v2")
    before = stored(cluster, namespace)
    writes_before = requests_of(cluster, "patch", "update")

    state = run_flow(cluster)

    assert state.is_failed(), state.message
    request = the_request(api, state=state)
    reason, message = condition(request, CONDITION_FAILED)
    assert reason == "NoCommonEncodingVersion"
    ids = server_ids(cluster)
    each = ", ".join(f"{server}: {'v2' if server == ids[2] else 'v1'}" for server in sorted(ids))
    assert f"configmaps ({each}): not started" in (message or "")
    assert not is_condition_true(request.status.conditions, CONDITION_RUNNING)
    assert requests_of(cluster, "patch", "update") == writes_before
    assert stored(cluster, namespace) == before
    assert versions(cluster, namespace) == {"v1"}


def test_a_rollback_during_a_running_migration_stops_it_and_the_next_one_completes(
    cluster: Cluster, api: ApiClient, namespace: str
) -> None:
    """Seed 001: the migrator "aborts ongoing migration if the ... agreedEncodingVersion
    is empty". Issue 10: "A rollback during a running migration aborts it; the
    migration that follows completes". Server 1 goes back to v1 while the run is in
    its 6th chunk: the run ends Failed (`CommonEncodingVersionLost`) with its
    checkpoint kept; once server 1 is on v2 again a new request re-encodes all."""
    set_all(cluster, "v2")

    with WhileHeld(cluster, namespace, lambda: Admin(cluster.servers[1].url).set_storage_version("configmaps", "v1")):
        state = run_flow(cluster)

    assert state.is_failed(), state.message
    request = the_request(api, state=state)
    reason, message = condition(request, CONDITION_FAILED)
    assert reason == "CommonEncodingVersionLost"
    assert "the checkpoint is kept" in (message or "")
    assert request.spec.continue_token, "the checkpoint's token is kept"
    assert request.status.progress is not None
    assert request.status.progress.listed == 6 * CHUNK, "stopped right after the chunk the rollback happened in"
    assert versions(cluster, namespace) == {"v1", "v2"}, "the stopped run left objects in v1"

    Admin(cluster.servers[1].url).set_storage_version("configmaps", "v2")
    again = run_flow(cluster)

    assert again.is_completed(), again.message
    follow_up = the_request(api, state=again)
    assert follow_up.metadata.name != request.metadata.name
    assert is_condition_true(follow_up.status.conditions, CONDITION_SUCCEEDED)
    assert versions(cluster, namespace) == {"v2"}


def test_a_migration_whose_storage_version_moved_mid_run_is_run_again(
    cluster: Cluster, api: ApiClient, namespace: str
) -> None:
    """Seed 001 "Version Skew Strategy": compare "the RV of the storageVersion object
    before and after the migration". All three servers switch v1 -> v2 inside the
    6th chunk (agreement holds at every check): the objects of chunks 1-5 were
    written in v1, so the run makes a second pass from the beginning, which
    re-encodes them, and only then ends Succeeded with every object in v2."""
    lists_before = requests_of(cluster, "list")

    with WhileHeld(cluster, namespace, lambda: set_all(cluster, "v2")) as held:
        state = run_flow(cluster)

    assert held.done.is_set(), "the storage version moved while the flow ran"
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary.passes == 2
    assert summary.progress.listed == COUNT
    assert summary.progress.rewritten >= 5 * CHUNK, "the second pass re-encoded what the first wrote in v1"
    assert requests_of(cluster, "list") - lists_before >= 2 * COUNT // CHUNK
    request = the_request(api, state=state)
    _, message = condition(request, CONDITION_SUCCEEDED)
    assert "pass 2" in (message or "")
    assert versions(cluster, namespace) == {"v2"}


def configmaps_state(api: ApiClient) -> dict[str, Any]:
    custom = k8s.CustomObjectsApi(api)
    items = custom.list_cluster_custom_object("migration.k8s.io", "v1alpha1", "storagestates")["items"]
    (state,) = [s for s in items if s["spec"]["resource"] == {"group": "", "resource": "configmaps"}]
    return dict(state)


def test_run_migrations_ends_with_a_detection_poll_that_refines_at_once(
    cluster: Cluster, api: ApiClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 10: "when `run-migrations` ends, it runs one detection poll, so a
    succeeded migration refines its StorageState at once (today it waits for the
    next scheduled poll)". Detection sees the servers move to v2 and requests a
    migration; the run-migrations that runs it leaves the StorageState refined to
    the v2 hash alone, with no other poll in between."""
    from flows.detect_storage_changes import detect_storage_changes
    from flows.run_migrations import run_migrations

    kubeconfig = str(cluster.kubeconfig)
    monkeypatch.setenv("STORAGE_MIGRATOR_INCLUDE_RESOURCES", "configmaps")  # detection tracks ConfigMaps alone
    detect_storage_changes(kubeconfig=kubeconfig, settle_seconds=0, start_migrations=False)
    set_all(cluster, "v2")
    polled = detect_storage_changes(kubeconfig=kubeconfig, settle_seconds=0, start_migrations=False)
    if not polled.applied.created_migrations:  # the change is requested on the poll after it is seen
        polled = detect_storage_changes(kubeconfig=kubeconfig, settle_seconds=0, start_migrations=False)
    assert polled.applied.created_migrations, polled
    v2_hash = configmaps_state(api)["status"]["currentStorageVersionHash"]
    assert configmaps_state(api)["status"]["persistedStorageVersionHashes"] != [v2_hash]

    summary = run_migrations(kubeconfig=kubeconfig, chunk_size=CHUNK, write_rate_per_second=400.0)

    assert set(summary.outcomes.values()) == {"Completed"}, summary
    assert summary.polled is not None and any("refined" in done for done in summary.polled), summary.polled
    assert configmaps_state(api)["status"]["persistedStorageVersionHashes"] == [v2_hash]
    assert versions(cluster, namespace) == {"v2"}


def test_a_failing_poll_at_the_end_does_not_fail_run_migrations(
    cluster: Cluster, api: ApiClient, namespace: str
) -> None:
    """Issue 10's poll is a convenience: the migrations are done whatever it meets,
    so a poll that cannot read the StorageStates is a warning and the run ends
    Completed (the next scheduled poll refines)."""
    from flows.migrate_resource import migrate_resource
    from flows.run_migrations import run_migrations

    set_all(cluster, "v2")
    custom = k8s.CustomObjectsApi(api)
    custom.create_cluster_custom_object(
        "migration.k8s.io", "v1alpha1", "storageversionmigrations",
        {"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
         "metadata": {"name": "configmaps-by-hand"}, "spec": {"resource": {"version": "v1", "resource": "configmaps"}}},
    )  # fmt: skip
    Admin(cluster.servers[0].url).set_faults(
        [{"verb": "list", "resource": "storagestates.migration.k8s.io", "code": 403}]
    )
    try:
        # An explicit budget: the session's shared one may be at its default of 10 writes/s.
        state = run_migrations(kubeconfig=str(cluster.kubeconfig), chunk_size=CHUNK, write_rate_per_second=400.0,
                               return_state=True)  # fmt: skip
        fired = Admin(cluster.servers[0].url).faults()[0]["fired"]
    finally:
        Admin(cluster.servers[0].url).clear_faults()

    assert state.is_completed(), state.message
    summary = state.result()
    assert summary.outcomes == {"configmaps-by-hand": "Completed"}
    assert fired > 0, "the poll ran and met the fault"
    assert summary.polled is None
    assert versions(cluster, namespace) == {"v2"}
    assert migrate_resource(migration="configmaps-by-hand", kubeconfig=str(cluster.kubeconfig)).phase == "Succeeded"
