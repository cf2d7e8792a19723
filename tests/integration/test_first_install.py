"""First install (issue 24): `initialize` and detection's first poll are one path.

"Tried on a real kube-apiserver v1.36: `initialize` requested and ran 62
migrations ...; `run-migrations` then ended with its detection poll. That poll
found no StorageState for any resource, created each with `persisted:
[Unknown]`, and requested 62 new migrations": every object rewritten twice.
Seed 000's rule is kept: "a migration refines a state only if it started after
that state recorded the hash"; `initialize` now writes the states first.

Judged by what the cluster holds: the requests made (one per resource), each
object's mod_revision in etcd (nothing rewritten after the first migration),
the StorageStates (the current hash alone). The flows are called in-process
against kubesim over a real etcd, as tests/integration/test_detection_lifecycle.py does.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import crd_manifest, install_migration_crds
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.codec import decode
from kubesim.etcd import EtcdStore, prefix_end
from storage_migrator.cli import main
from storage_migrator.detection.states import list_states
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.crds import storage_version_hash
from storage_migrator.migration.dispatch import migration_resource
from storage_migrator.migration.requests import list_migrations
from storage_migrator.models import UNKNOWN, StorageState, StorageVersionMigration
from storage_migrator.settings import Settings

pytestmark = pytest.mark.usefixtures("migration_crds", "prefect_api")

# A generous budget: the tests judge what is written, not how fast (no timing asserts).
FAST = {"write_rate_per_second": 5000.0, "write_concurrency": 8, "max_parallel": 2}
#: Objects per LIST page of every migration the tests run: the data sets span several chunks
#: and pages with tens of objects (issue 29), not the default 500 with thousands.
CHUNK = 10
CM_COUNT, CR_COUNT = 35, 15
CM_V1 = storage_version_hash("", "v1", "ConfigMap")
CM_V2 = storage_version_hash("", "v2", "ConfigMap")


def first_install_env(monkeypatch: pytest.MonkeyPatch, resources: list[str]) -> None:
    """The worker's settings, which every flow of the test reads (initialize, run-migrations and
    its closing poll, detection): these resources alone, no settle delay, a generous budget,
    chunks of CHUNK objects."""
    monkeypatch.setenv("STORAGE_MIGRATOR_INCLUDE_RESOURCES", ",".join(resources))
    monkeypatch.setenv("STORAGE_MIGRATOR_SETTLE_SECONDS", "0")
    monkeypatch.setenv("STORAGE_MIGRATOR_WRITE_RATE_PER_SECOND", "5000")
    monkeypatch.setenv("STORAGE_MIGRATOR_CHUNK_SIZE", str(CHUNK))


def revisions(etcd: EtcdStore, prefix: str) -> dict[str, tuple[str, int]]:
    """key -> (stored apiVersion, mod_revision) of every object under `prefix`, read in etcd."""
    raw = prefix.encode()
    return {kv.key.decode(): (decode(kv.value, read_keys=["key1", "key2"]).api_version, kv.mod_revision)
            for kv in etcd.range(raw, prefix_end(raw)).kvs}  # fmt: skip


def requests_by_resource(kubeconfig: str) -> Counter[str]:
    return Counter(migration_resource(m) for m in our_migrations(kubeconfig))


def our_migrations(kubeconfig: str) -> list[StorageVersionMigration]:
    return list_migrations(api_client_from_settings(Settings(kubeconfig=kubeconfig)))


def states_of(kubeconfig: str) -> dict[str, StorageState]:
    return {s.metadata.name or "": s for s in list_states(api_client_from_settings(Settings(kubeconfig=kubeconfig)))}


def create_all(count: int, create: Any) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(create, range(count)))


def detection_poll(kubeconfig: str) -> Any:
    from flows.detect_storage_changes import detect_storage_changes

    return detect_storage_changes(settle_seconds=0, kubeconfig=kubeconfig)


@pytest.fixture
def widgets(clean_slate: Any) -> Iterator[tuple[str, str]]:
    """A CRD of the test's own (unique group), served; (group, "widgets")."""
    import time

    group = f"f{uuid.uuid4().hex[:8]}.example.com"
    ext = k8s.ApiextensionsV1Api(clean_slate)
    ext.create_custom_resource_definition(crd_manifest(group))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                k8s.CustomObjectsApi(clean_slate).list_cluster_custom_object(group, "v1", "widgets", limit=1)
                break
            except k8s.ApiException:
                assert time.monotonic() < deadline, "the CRD was never served"
                time.sleep(0.05)
        yield group, "widgets"
    finally:
        ext.delete_custom_resource_definition(f"widgets.{group}")


def test_first_install_rewrites_every_object_once(
    kubesim: Any, clean_slate: Any, namespace: str, widgets: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The issue's case (it counted 1,000 ConfigMaps and 500 custom resources): `initialize`, then
    `run-migrations` (its closing poll included), then another detection poll: one request
    per resource, nothing rewritten after the first migration, each state the current hash alone.
    Issue 29: 35 ConfigMaps and 15 custom resources, in chunks of CHUNK, so each migration spans
    several chunks and pages as the issue's did; the scale is bench/scale.py's."""
    from flows.initialize import initialize
    from flows.run_migrations import run_migrations

    group, plural = widgets
    first_install_env(monkeypatch, ["configmaps", f"{plural}.{group}"])
    core, custom = k8s.CoreV1Api(clean_slate), k8s.CustomObjectsApi(clean_slate)
    create_all(CM_COUNT, lambda i: core.create_namespaced_config_map(
        namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"cm-{i:04d}"), data={"i": str(i)})))  # fmt: skip
    create_all(CR_COUNT, lambda i: custom.create_namespaced_custom_object(group, "v1", namespace, plural, {
        "apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": f"w-{i:03d}"}, "spec": {"i": i}}))  # fmt: skip
    # An upgrade before the install: the ConfigMaps are stored in v1, the servers now write v2.
    kubesim.admin.set_storage_version("configmaps", "v2")
    cm_prefix, cr_prefix = f"/registry/configmaps/{namespace}/", f"/registry/{group}/{plural}/{namespace}/"
    created = revisions(kubesim.etcd, cm_prefix)
    assert len(created) == CM_COUNT and {v for v, _ in created.values()} == {"v1"}

    summary = initialize(start_migrations=False, kubeconfig=kubesim.kubeconfig)
    assert sorted(migration_resource(m) for m in our_migrations(kubesim.kubeconfig)) == sorted(
        ["configmaps", f"{plural}.{group}"]
    )
    assert len(summary.created) == 2
    states = states_of(kubesim.kubeconfig)
    for migration in our_migrations(kubesim.kubeconfig):
        state = states[migration_resource(migration)]
        assert state.status.persisted_storage_version_hashes == [UNKNOWN]
        # etcd's revisions order the writes: the state was recorded before its request.
        assert int(state.metadata.resource_version or 0) < int(migration.metadata.resource_version or 0)
        assert migration.metadata.labels == {"migration.k8s.io/requested-by": "initialize"}

    ran = run_migrations(kubeconfig=kubesim.kubeconfig, **FAST)
    assert set(ran.outcomes.values()) == {"Completed"} and len(ran.outcomes) == 2, ran.outcomes
    assert ran.polled is not None, "run-migrations ends with a detection poll"
    migrated_cms, migrated_crs = revisions(kubesim.etcd, cm_prefix), revisions(kubesim.etcd, cr_prefix)
    assert {v for v, _ in migrated_cms.values()} == {"v2"}
    assert all(migrated_cms[k][1] > created[k][1] for k in created), "the first migration rewrote every ConfigMap"
    assert len(migrated_crs) == CR_COUNT
    # more than one chunk each, as at the size (the rule is about pages, not their number)
    assert all(m.status.progress and m.status.progress.chunks > 1 for m in our_migrations(kubesim.kubeconfig))

    polled = detection_poll(kubesim.kubeconfig)
    assert polled.applied.created_migrations == [] and polled.runnable == []
    assert requests_by_resource(kubesim.kubeconfig) == {"configmaps": 1, f"{plural}.{group}": 1}
    assert revisions(kubesim.etcd, cm_prefix) == migrated_cms, "a ConfigMap was rewritten after the first migration"
    assert revisions(kubesim.etcd, cr_prefix) == migrated_crs
    states = states_of(kubesim.kubeconfig)
    assert {n: s.status.persisted_storage_version_hashes for n, s in states.items()} == {
        "configmaps": [CM_V2], f"{plural}.{group}": [storage_version_hash(group, "v1", "Widget")]}  # fmt: skip
    assert all(s.status.current_storage_version_hash == s.status.persisted_storage_version_hashes[0]
               for s in states.values())  # fmt: skip

    # docs/operator-guide.md: `storage-migrator plan` after initialize shows nothing to do.
    assert main(["--kubeconfig", kubesim.kubeconfig, "plan"]) == 0
    assert capsys.readouterr().out.startswith("nothing to do (2 StorageState(s) unchanged: heartbeat only)")


def test_a_hash_that_changes_after_initialize_gets_its_one_more_migration(
    kubesim: Any, clean_slate: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24 item 2: seed 000's safety rule is unchanged. ConfigMaps' storage version
    changes after `initialize` recorded v1: the migration it requested started before the state
    recorded v2, so it refines nothing, and exactly one more migration is requested and run;
    Secrets, unchanged, are migrated once."""
    from flows.initialize import initialize
    from flows.run_migrations import run_migrations

    first_install_env(monkeypatch, ["configmaps", "secrets"])
    core = k8s.CoreV1Api(clean_slate)
    create_all(20, lambda i: core.create_namespaced_config_map(
        namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"cm-{i:02d}"), data={"i": str(i)})))  # fmt: skip
    create_all(5, lambda i: core.create_namespaced_secret(
        namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=f"s-{i:02d}"), string_data={"i": str(i)})))  # fmt: skip

    summary = initialize(start_migrations=False, kubeconfig=kubesim.kubeconfig)
    assert len(summary.created) == 2
    assert states_of(kubesim.kubeconfig)["configmaps"].status.current_storage_version_hash == CM_V1
    kubesim.admin.set_storage_version("configmaps", "v2")
    # Issue 36: the migration began listing before run-migrations' closing poll recorded v2, maybe in
    # the same second; ordered by resourceVersion it proves nothing (no PATCH held a second any more).
    ran = run_migrations(kubeconfig=kubesim.kubeconfig, **FAST)
    assert set(ran.outcomes.values()) == {"Completed"}, ran.outcomes
    assert requests_by_resource(kubesim.kubeconfig) == {"configmaps": 2, "secrets": 1}
    secrets = revisions(kubesim.etcd, f"/registry/secrets/{namespace}/")

    detection_poll(kubesim.kubeconfig)  # runs the one more migration, whose closing poll refines
    last = detection_poll(kubesim.kubeconfig)
    assert last.applied.created_migrations == []
    assert requests_by_resource(kubesim.kubeconfig) == {"configmaps": 2, "secrets": 1}
    assert {v for v, _ in revisions(kubesim.etcd, f"/registry/configmaps/{namespace}/").values()} == {"v2"}
    assert revisions(kubesim.etcd, f"/registry/secrets/{namespace}/") == secrets
    states = states_of(kubesim.kubeconfig)
    assert states["configmaps"].status.persisted_storage_version_hashes == [CM_V2]
    assert states["secrets"].status.persisted_storage_version_hashes == [
        states["secrets"].status.current_storage_version_hash
    ]


@pytest.fixture
def two_servers(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(servers=2) as own:
        own.write_kubeconfig(tmp_path / "kubeconfig")
        yield own


def test_initialize_requests_nothing_while_api_servers_disagree(
    two_servers: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 000 (HA): a migration starts only while every API server encodes the resource
    alike; `initialize` is a detection poll, so the rule holds on this path too. It records
    the state (each server's hash) and requests nothing until they agree."""
    from flows.initialize import initialize

    first_install_env(monkeypatch, ["configmaps"])
    kubeconfig = str(two_servers.kubeconfig)
    api = k8s_config.new_client_from_config(config_file=kubeconfig)
    try:
        install_migration_crds(api)
        namespace = f"t-{uuid.uuid4().hex[:8]}"
        core = k8s.CoreV1Api(api)
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
        create_all(20, lambda i: core.create_namespaced_config_map(
            namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"cm-{i:02d}"))))  # fmt: skip
    finally:
        api.close()
    Admin(two_servers.servers[1].url).set_storage_version("configmaps", "v2")  # one server upgraded

    summary = initialize(kubeconfig=kubeconfig)  # would start run-migrations, had it requested anything
    assert summary.created == []
    reason = {s.group_resource: s.reason for s in summary.skipped}["configmaps"]
    assert "disagree" in reason, reason
    assert our_migrations(kubeconfig) == []
    state = states_of(kubeconfig)["configmaps"]
    assert state.status.persisted_storage_version_hashes == [UNKNOWN]
    assert sorted(e.current_storage_version_hash for e in state.status.current_storage_version_hashes) == sorted(
        [CM_V1, CM_V2]
    )

    Admin(two_servers.servers[0].url).set_storage_version("configmaps", "v2")  # they agree
    polled = detection_poll(kubeconfig)  # requests, runs, and the closing poll refines
    assert len(polled.applied.created_migrations) == 1
    assert requests_by_resource(kubeconfig) == {"configmaps": 1}
    etcd = two_servers.etcd()
    try:
        assert {v for v, _ in revisions(etcd, f"/registry/configmaps/{namespace}/").values()} == {"v2"}
    finally:
        etcd.close()
    assert states_of(kubeconfig)["configmaps"].status.persisted_storage_version_hashes == [CM_V2]


def test_no_request_is_made_whose_storage_state_was_not_written(
    kubesim: Any, clean_slate: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order is the fix: a migration that starts before its state recorded the hash can never
    refine it (seed 000). When the state write fails (here the status of `secrets`, 422), its
    request is not made either; the next poll writes the state and then requests it, once."""
    from flows.detect_storage_changes import detect_storage_changes
    from flows.initialize import initialize

    first_install_env(monkeypatch, ["configmaps", "secrets"])
    kubesim.admin.set_faults([{"resource": "storagestates.migration.k8s.io", "verb": "patch", "name": "secrets",
                               "subresource": "status", "code": 422}])  # fmt: skip
    summary = initialize(start_migrations=False, kubeconfig=kubesim.kubeconfig)
    assert requests_by_resource(kubesim.kubeconfig) == {"configmaps": 1}
    assert len(summary.created) == 1
    assert any("not requested for secrets" in e for e in summary.poll.applied.errors), summary.poll.applied.errors

    kubesim.admin.clear_faults()
    detect_storage_changes(settle_seconds=0, start_migrations=False, kubeconfig=kubesim.kubeconfig)
    assert requests_by_resource(kubesim.kubeconfig) == {"configmaps": 1, "secrets": 1}
    assert states_of(kubesim.kubeconfig)["secrets"].status.persisted_storage_version_hashes == [UNKNOWN]
