"""Seed 000's "Life-cycle of a StorageState object", replayed against kubesim with the
`detect-storage-changes` flow, checking every StorageState field the seed names at
every step. Time is driven by the test: instead of waiting for minutes, it moves
the recorded times (heartbeat, settle deadline) into the past.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import crd_manifest, wait_until
from kubernetes import client as k8s

from storage_migrator.conditions import is_condition_true
from storage_migrator.detection.planner import SETTLE_ANNOTATION, storage_version_hash
from storage_migrator.detection.states import STATES, list_states
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.discovery import discover
from storage_migrator.kube.writing import patch_object
from storage_migrator.migration.requests import list_migrations
from storage_migrator.models import UNKNOWN, StorageState
from storage_migrator.settings import Settings

pytestmark = pytest.mark.usefixtures("migration_crds", "prefect_api")
GROUP, VERSION = "migration.k8s.io", "v1alpha1"
POLL = 600.0  # the seed's 10 minutes; stale after two periods (DESIGN 4.3)
FAST = {"write_rate_per_second": 2000.0}
# seed 000 uses CronJob; hashes as kube-apiserver computes them (sha256 of group/version/kind).
CRONJOBS_V1 = "sd5LIXh4Fjs="


def poll(kubesim: Any, *, settle: float = 0.0) -> Any:
    from flows.detect_storage_changes import detect_storage_changes

    return detect_storage_changes(settle_seconds=settle, poll_seconds=POLL, start_migrations=False,
                                  kubeconfig=kubesim.kubeconfig)  # fmt: skip


def run_requested(kubesim: Any) -> None:
    from flows.run_migrations import run_migrations

    summary = run_migrations(max_parallel=2, kubeconfig=kubesim.kubeconfig, **FAST)
    assert all(outcome == "Completed" for outcome in summary.outcomes.values()), summary.outcomes


@pytest.fixture
def ours(kubesim: Any) -> Iterator[Any]:
    """One client of our access layer for the test's reads and its moves of recorded times
    (issue 29: not a new client, and a TLS handshake, for each of them)."""
    api = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    yield api
    api.close()


def cronjobs_state(api: Any) -> StorageState:
    return next(s for s in list_states(api) if s.metadata.name == "cronjobs.batch")


def move_into_past(api: Any, state: StorageState, *, heartbeat_by: float = 0, settle: bool = False) -> None:
    if settle:
        patch_object(api, STATES, name="cronjobs.batch",
                     patch={"metadata": {"annotations": {SETTLE_ANNOTATION: "2000-01-01T00:00:00Z"}}})  # fmt: skip
    if heartbeat_by:
        assert state.status.last_heartbeat_time is not None
        old = (state.status.last_heartbeat_time - timedelta(seconds=heartbeat_by)).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch_object(api, STATES, name="cronjobs.batch", subresource="status",
                     patch={"status": {"lastHeartbeatTime": old}})  # fmt: skip


def cronjob_migrations(api: Any) -> list[Any]:
    return [
        m for m in list_migrations(api) if (m.spec.resource.group, m.spec.resource.resource) == ("batch", "cronjobs")
    ]


def pending(migrations: list[Any]) -> list[Any]:
    return [m for m in migrations
            if not any(is_condition_true(m.status.conditions, c) for c in ("Succeeded", "Failed"))]  # fmt: skip


def test_life_cycle_of_a_storage_state(
    kubesim: Any, clean_slate: Any, ours: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORAGE_MIGRATOR_INCLUDE_RESOURCES", "cronjobs.batch")  # seed 000's example alone
    api = clean_slate
    # In the test's own namespace, deleted afterwards (the session's cluster is shared).
    k8s.BatchV1Api(api).create_namespaced_cron_job(namespace, {
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly"},
        "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}},
    })  # fmt: skip
    started = datetime.now(UTC) - timedelta(seconds=1)

    # "When the migration triggering controller is installed ... for the first time, there is no
    # StorageState object. The controller creates the StorageState object for CronJob, setting
    # .status.persistedStorageVersionHashes to ["Unknown"] and .status.currentStorageVersionHash to
    # batch/v2alpha1. It also creates a storageVersionMigration object to request a migration."
    poll(kubesim)
    state = cronjobs_state(ours)
    assert state.spec.resource.group == "batch" and state.spec.resource.resource == "cronjobs"
    assert state.status.persisted_storage_version_hashes == [UNKNOWN]
    assert state.status.current_storage_version_hash == CRONJOBS_V1
    assert state.status.last_heartbeat_time and state.status.last_heartbeat_time >= started
    assert len(pending(cronjob_migrations(ours))) == 1

    # "When the migration completed, the migration triggering controller sets
    # .status.persistedStorageVersionHashes to [batch/v2alpha1]."
    run_requested(kubesim)
    poll(kubesim)
    state = cronjobs_state(ours)
    assert state.status.persisted_storage_version_hashes == [CRONJOBS_V1]
    assert state.status.current_storage_version_hash == CRONJOBS_V1

    # "The migration triggering controller crashes and has been offline for less than 10 minutes.
    # ... it considers the storageState still valid. The controller does nothing other than
    # updating the lastHeartbeatTime."
    move_into_past(ours, state, heartbeat_by=POLL - 60)
    before = cronjobs_state(ours)
    summary = poll(kubesim)
    state = cronjobs_state(ours)
    assert state.status.persisted_storage_version_hashes == [CRONJOBS_V1]
    assert state.status.current_storage_version_hash == CRONJOBS_V1
    assert state.status.last_heartbeat_time and before.status.last_heartbeat_time
    assert state.status.last_heartbeat_time > before.status.last_heartbeat_time
    assert summary.applied.created_migrations == []

    # "The cluster admin upgrades the cluster ... the storage version of the cronjob is changed to
    # batch/v2beta1. The migration triggering controller observes the change. It sets
    # currentStorageVersionHash to batch/v2beta1 and persistedStorageVersionHashes to
    # [v2alpha1, v2beta1]. It also creates a migration request for cronjobs" — once the change has
    # settled (seed 004's loose guarantee: a minute here).
    kubesim.admin.set_storage_version("cronjobs", "v2beta1", group="batch")
    v2beta1 = storage_version_hash("batch", "v2beta1", "CronJob")
    served = {(r.group, r.resource): r.storage_version_hash for r in discover(ours).resources}
    assert served[("batch", "cronjobs")] == v2beta1 != CRONJOBS_V1
    summary = poll(kubesim, settle=60)
    state = cronjobs_state(ours)
    assert state.status.current_storage_version_hash == v2beta1
    assert state.status.persisted_storage_version_hashes == [CRONJOBS_V1, v2beta1]
    assert not pending(cronjob_migrations(ours)), "requested before the change settled"
    move_into_past(ours, state, settle=True)
    poll(kubesim, settle=60)
    assert len(pending(cronjob_migrations(ours))) == 1
    run_requested(kubesim)
    poll(kubesim)
    state = cronjobs_state(ours)
    assert state.status.persisted_storage_version_hashes == [v2beta1]

    # "The cluster admin finds a critical issue in 1.15 and downgrades the cluster back to 1.14. The
    # migration triggering controller sets the storageState.status.currentStorageVersionHash to
    # batch/v2alpha1 and recreates the storageVersionMigration object to migrate to v2alpha1."
    kubesim.admin.set_storage_version("cronjobs", "v1", group="batch")
    poll(kubesim)
    state = cronjobs_state(ours)
    assert state.status.current_storage_version_hash == CRONJOBS_V1
    assert state.status.persisted_storage_version_hashes == [v2beta1, CRONJOBS_V1]
    assert len(pending(cronjob_migrations(ours))) == 1
    # The reset below must not be refined by this migration, which started before it. Recorded
    # times have second precision (metav1.Time), and a migration that started in the second a
    # state was reset counts as started after it (storage_migrator.detection.rules.proves:
    # `started >= since`): one PATCH held a second puts the reset at least a second after this
    # migration started (issue 29: with quick flows the two could share a second).
    kubesim.admin.set_faults([{"verb": "patch", "resource": "cronjobs.batch", "namespace": namespace,
                               "latency": 1.0, "times": 1}])  # fmt: skip
    run_requested(kubesim)
    assert kubesim.admin.faults()[0]["fired"] == 1, "the migration held one PATCH"
    kubesim.admin.clear_faults()
    poll(kubesim)
    assert cronjobs_state(ours).status.persisted_storage_version_hashes == [CRONJOBS_V1]

    # "If the controller crash loops and misses storage version changes, ... when the controller
    # bootstraps, for every storageState object, it checks the .status.lastHeartbeatTime, if the
    # timestamp is more than 10 minutes old, it recreates storageState object with
    # persistedStorageVersionHashes set to ["Unknown"]" (stale = two poll periods, DESIGN 4.3).
    move_into_past(ours, cronjobs_state(ours), heartbeat_by=2 * POLL + 60)
    poll(kubesim)
    state = cronjobs_state(ours)
    assert state.status.persisted_storage_version_hashes == [UNKNOWN]
    assert state.status.current_storage_version_hash == CRONJOBS_V1
    assert len(pending(cronjob_migrations(ours))) == 1
    run_requested(kubesim)
    poll(kubesim)
    assert cronjobs_state(ours).status.persisted_storage_version_hashes == [CRONJOBS_V1]


def test_custom_resource_refinement_trims_the_crd_stored_versions(
    kubesim: Any, clean_slate: Any, ours: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DESIGN 4.3: "For custom resources, refinement also trims the CRD's
    status.storedVersions to the storage version, so the old version can be removed
    from the CRD" (reference: storedVersions stays ["v1","v2"] until someone trims it)."""
    # Detection tracks the test's CRD alone (the settings' include list): every other
    # resource would only add migrations to wait for.
    monkeypatch.setenv("STORAGE_MIGRATOR_INCLUDE_RESOURCES", "gadgets.trim.example.com")
    api = clean_slate
    ext = k8s.ApiextensionsV1Api(api)
    crd = crd_manifest("trim.example.com", plural="gadgets", kind="Gadget")
    ext.create_custom_resource_definition(crd)
    try:
        custom = k8s.CustomObjectsApi(api)

        def gadgets_served() -> bool:
            try:
                custom.list_namespaced_custom_object("trim.example.com", "v1", "default", "gadgets", limit=1)
            except k8s.ApiException:
                return False
            return True

        # Issue 29: polled on the event (the CRD served), not retried in a loop with no pause.
        wait_until(gadgets_served, what="the CRD served", timeout=30)
        custom.create_namespaced_custom_object("trim.example.com", "v1", "default", "gadgets", {
            "apiVersion": "trim.example.com/v1", "kind": "Gadget", "metadata": {"name": "g1"}})  # fmt: skip
        poll(kubesim)
        run_requested(kubesim)
        poll(kubesim)
        current = ext.read_custom_resource_definition("gadgets.trim.example.com")
        current.spec.versions[0].storage, current.spec.versions[1].storage = False, True
        ext.replace_custom_resource_definition("gadgets.trim.example.com", current)
        assert ext.read_custom_resource_definition("gadgets.trim.example.com").status.stored_versions == ["v1", "v2"]
        v2 = storage_version_hash("trim.example.com", "v2", "Gadget")

        def serves_v2() -> bool:
            served = {(r.group, r.resource): r.storage_version_hash for r in discover(ours).resources}
            return served.get(("trim.example.com", "gadgets")) == v2

        # kubesim serves the new storage version within 0.25 s (it re-reads CRDs); issue 29: a
        # polled wait on discovery saying so, not a loop of whole discoveries with no pause.
        wait_until(serves_v2, what="discovery serving gadgets' v2 storage version hash", timeout=10)
        poll(kubesim)  # sees v2: persisted [v1-hash, v2-hash], migration requested (settle 0)
        state = next(s for s in list_states(ours) if s.metadata.name == "gadgets.trim.example.com")
        assert state.status.current_storage_version_hash == v2
        assert len(state.status.persisted_storage_version_hashes) == 2
        assert ext.read_custom_resource_definition("gadgets.trim.example.com").status.stored_versions == ["v1", "v2"]
        run_requested(kubesim)
        poll(kubesim)  # refines, and trims the CRD
        state = next(s for s in list_states(ours) if s.metadata.name == "gadgets.trim.example.com")
        assert state.status.persisted_storage_version_hashes == [v2]
        assert ext.read_custom_resource_definition("gadgets.trim.example.com").status.stored_versions == ["v2"]
        value, _ = kubesim.etcd.get(b"/registry/trim.example.com/gadgets/default/g1")
        assert value is not None and b'"apiVersion":"trim.example.com/v2"' in value.value
        printed = subprocess.run(["kubectl", "--kubeconfig", kubesim.kubeconfig, "get", "storagestates.migration.k8s.io",
                                  "gadgets.trim.example.com"], capture_output=True, text=True, timeout=60)  # fmt: skip
        assert printed.returncode == 0 and v2 in printed.stdout
    finally:
        ext.delete_custom_resource_definition("gadgets.trim.example.com")
