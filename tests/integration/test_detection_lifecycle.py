"""Seed 000's "Life-cycle of a StorageState object", replayed against kubesim with the
`detect-storage-changes` flow, checking every StorageState field the seed names at
every step. Time is driven by the test: instead of waiting for minutes, it moves
the recorded times (heartbeat, settle deadline) into the past.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import crd_manifest, wait_until
from kubernetes import client as k8s
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter

from storage_migrator.conditions import is_condition_true
from storage_migrator.detection.planner import SETTLE_ANNOTATION, SINCE_ANNOTATION, storage_version_hash
from storage_migrator.detection.states import STATES, list_states
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.discovery import discover
from storage_migrator.kube.in_tree import IN_TREE_GROUP, IN_TREE_RESOURCE
from storage_migrator.kube.listing import current_resource_version
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.writing import delete_object, patch_object, rewrite_with_patch
from storage_migrator.ledger.writer import writer_for
from storage_migrator.migration.requests import MIGRATIONS, create_migration, list_migrations, read_migration
from storage_migrator.models import UNKNOWN, StorageState, format_time, new_storage_version_migration
from storage_migrator.settings import Settings

pytestmark = pytest.mark.usefixtures("migration_crds", "prefect_api")
GROUP, VERSION = "migration.k8s.io", "v1alpha1"
POLL = 600.0  # the seed's 10 minutes; stale after two periods (DESIGN 4.3)
FAST = {"write_rate_per_second": 2000.0}
# seed 000 uses CronJob; hashes as kube-apiserver computes them (sha256 of group/version/kind).
CRONJOBS_V1 = "sd5LIXh4Fjs="
#: The in-tree API's version kubesim serves today (1.36's); v1 once kubesim serves it (part 36sim).
IN_TREE_V = "v1"


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
    # Issue 36: the migration records its first LIST's resourceVersion; refinement is ordered by it,
    # not by times cut to the second (no PATCH held a second here any more to keep them apart).
    run_requested(kubesim)
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


def make_cronjob(api: Any, namespace: str) -> None:
    k8s.BatchV1Api(api).create_namespaced_cron_job(namespace, {
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly"},
        "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}},
    })  # fmt: skip


def stored_as(kubesim: Any, namespace: str) -> str:
    """The apiVersion the CronJob is stored as, read in etcd."""
    value, _ = kubesim.etcd.get(f"/registry/cronjobs/{namespace}/nightly".encode())
    assert value is not None
    return str(json.loads(value.value)["apiVersion"])


def test_the_one_second_tie_is_ordered_by_resource_version(
    kubesim: Any, clean_slate: Any, ours: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36 item 5: "a migration that started in the same second as the switch, before it, does
    not refine; one after it does". Times are cut to the second (metav1.Time), so the test puts both
    migrations' startedAt in the second the switch was recorded (as quick flows do: issue 29); their
    first LISTs' resourceVersions, the switch's before one and after the other, decide."""
    monkeypatch.setenv("STORAGE_MIGRATOR_INCLUDE_RESOURCES", "cronjobs.batch")
    monkeypatch.setenv("STORAGE_MIGRATOR_SETTLE_SECONDS", "0")  # run-migrations' closing poll too
    make_cronjob(clean_slate, namespace)
    poll(kubesim)  # the state, recording v1; its request is not needed here
    (first,) = cronjob_migrations(ours)
    delete_object(ours, MIGRATIONS, name=str(first.metadata.name))

    # Upgraded: a migration (someone's request, kubectl's) runs to the new version before a poll
    # records it; run-migrations' closing poll then records the switch (and requests one more).
    kubesim.admin.set_storage_version("cronjobs", "v2beta1", group="batch")
    v2beta1 = storage_version_hash("batch", "v2beta1", "CronJob")
    early = create_migration(ours, new_storage_version_migration(group="batch", version="v1", resource="cronjobs",
                                                                 name=f"early-{namespace}"))  # fmt: skip
    run_requested(kubesim)
    assert stored_as(kubesim, namespace) == "batch/v2beta1"
    state = cronjobs_state(ours)
    since = (state.metadata.annotations or {})[SINCE_ANNOTATION]
    switch = state.status.current_hash_resource_version
    assert state.status.current_storage_version_hash == v2beta1 and switch is not None
    before = read_migration(ours, str(early.metadata.name))
    assert before.status.target_storage_version_hash == v2beta1
    assert before.status.resource_version is not None and int(before.status.resource_version) < int(switch)

    def started_in_the_switchs_second(name: str) -> None:
        patch_object(ours, MIGRATIONS, name=name, subresource="status", patch={"status": {"startedAt": since}})

    # Before the switch, in its second: not proof (the old `started >= since` took it for one).
    started_in_the_switchs_second(str(early.metadata.name))
    summary = poll(kubesim)
    assert cronjobs_state(ours).status.persisted_storage_version_hashes == [UNKNOWN, v2beta1]
    (after,) = pending(cronjob_migrations(ours))
    assert summary.applied.created_migrations == [] and after.metadata.labels, "the poll that recorded it asked"

    # After the switch, in the same second by the clock: proof.
    assert (after.metadata.labels or {}).get("migration.k8s.io/requested-by") == "detection"
    run_requested(kubesim)
    started_in_the_switchs_second(str(after.metadata.name))
    done = read_migration(ours, str(after.metadata.name))
    tie = read_migration(ours, str(early.metadata.name)).status.started_at
    assert done.status.started_at == tie and tie is not None and format_time(tie) == since, "one second, both"
    assert done.status.resource_version is not None and int(done.status.resource_version) > int(switch)
    poll(kubesim)
    state = cronjobs_state(ours)
    assert state.status.persisted_storage_version_hashes == [v2beta1]
    assert state.status.current_hash_resource_version == switch
    kubesim.admin.set_storage_version("cronjobs", "v1", group="batch")  # the session's cluster as it was


@pytest.fixture
def in_tree(kubesim: Any, clean_slate: Any) -> Iterator[InTree]:
    """kube-controller-manager's migration API served (kubesim's StorageVersionMigrator gate) with
    kubesim's own controller off and this test standing in for its status writes, so that each
    phase happens exactly where the test needs it (before or after the switch); every in-tree
    object the test made deleted afterwards (the kubesim fixture then puts the gate back)."""
    kubesim.admin.set_svm_controller(enabled=False)
    kubesim.admin.set_feature_gates({"StorageVersionMigrator": True})
    made = InTree(kubesim=kubesim, custom=k8s.CustomObjectsApi(clean_slate))
    yield made
    for name in made.names:
        made.custom.delete_cluster_custom_object(IN_TREE_GROUP, IN_TREE_V, IN_TREE_RESOURCE, name)


@dataclass
class InTree:
    kubesim: Any
    custom: Any
    names: list[str] = field(default_factory=list)

    def create(self, name: str) -> None:
        """As an operator does: `kubectl create -f -` (its field manager, kubectl-create)."""
        body = {"apiVersion": f"{IN_TREE_GROUP}/{IN_TREE_V}", "kind": "StorageVersionMigration",
                "metadata": {"name": name}, "spec": {"resource": {"group": "batch", "resource": "cronjobs"}}}  # fmt: skip
        made = subprocess.run(["kubectl", "--kubeconfig", self.kubesim.kubeconfig, "create", "-f", "-"],
                              input=json.dumps(body), capture_output=True, text=True, timeout=60)  # fmt: skip
        assert made.returncode == 0, made.stderr
        self.names.append(name)

    def status(self, name: str, status: dict[str, Any]) -> None:
        """What kcm's controller writes through /status (its field manager)."""
        self.custom.patch_cluster_custom_object_status(IN_TREE_GROUP, IN_TREE_V, IN_TREE_RESOURCE, name,
                                                       {"status": status}, field_manager="kube-controller-manager")  # fmt: skip

    def start(self, name: str, api: Any) -> str:
        """kcm's start: the resource's current resourceVersion (a LIST with limit 1), Running."""
        rv = current_resource_version(api, ResourceRef(group="batch", version="v1", resource="cronjobs"))
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.status(name, {"resourceVersion": rv, "conditions": [
            {"type": "Running", "status": "True", "lastTransitionTime": now, "reason": "MigrationRunning",
             "message": "The migration is running"}]})  # fmt: skip
        return rv

    def succeed(self, name: str, api: Any, namespace: str) -> None:
        """kcm's work and end: a no-op patch of every object not newer than its resourceVersion, then
        Running=False and Succeeded=True (tests/reference/svm-succeeded.json)."""
        read = k8s.BatchV1Api(api).read_namespaced_cron_job("nightly", namespace)
        rewrite_with_patch(api, ResourceRef(group="batch", version="v1", resource="cronjobs"), name="nightly",
                           namespace=namespace, resource_version=read.metadata.resource_version)  # fmt: skip
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.status(name, {"conditions": [
            {"type": "Running", "status": "False", "lastTransitionTime": now, "reason": "MigrationCompleted",
             "message": "Migration completed"},
            {"type": "Succeeded", "status": "True", "lastTransitionTime": now,
             "reason": "StorageVersionMigrationSucceeded", "message": ""}]})  # fmt: skip


def test_an_in_tree_migration_made_by_kubectl_is_observed_and_refines_the_state(
    kubesim: Any, clean_slate: Any, ours: Any, namespace: str, in_tree: InTree, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Issue 36 item 4: storagemigration.k8s.io objects made by anyone are observed: no request of ours
    while one runs for the resource, a ledger row and an event once per object and phase, `history`
    naming who made it, and a StorageState refined by one that succeeded after the switch (by
    resourceVersion), never by one that began before it."""
    from storage_migrator.cli import main

    monkeypatch.setenv("STORAGE_MIGRATOR_INCLUDE_RESOURCES", "cronjobs.batch")
    began = datetime.now(UTC)
    make_cronjob(clean_slate, namespace)
    first, second = f"by-kubectl-{namespace}", f"again-{namespace}"
    in_tree.create(first)

    # Not picked up yet: our first look records the state and requests nothing beside it.
    summary = poll(kubesim)
    assert cronjob_migrations(ours) == []
    assert any("waiting for kube-controller-manager's controller" in d and first in d for d in summary.applied.done)
    assert any(first in line and "Pending" in line for line in summary.in_tree)
    # kcm starts it (before the upgrade below is recorded), then the cluster is upgraded.
    started_at = int(in_tree.start(first, ours))
    kubesim.admin.set_storage_version("cronjobs", "v2beta1", group="batch")
    v2beta1 = storage_version_hash("batch", "v2beta1", "CronJob")
    summary = poll(kubesim)
    state = cronjobs_state(ours)
    assert state.status.current_storage_version_hash == v2beta1
    assert int(str(state.status.current_hash_resource_version)) > started_at
    assert cronjob_migrations(ours) == [], "no second migration while one of them runs"
    assert any("is running: no request of ours beside it" in d for d in summary.applied.done)
    assert writer_for(Settings().database_url).flush(30), "the ledger writer did not catch up"
    assert poll(kubesim).in_tree == [], "once per object and phase, not every poll"

    # It succeeds; it began before the switch was recorded: no proof, and our request follows.
    in_tree.succeed(first, ours, namespace)
    poll(kubesim)
    assert cronjobs_state(ours).status.persisted_storage_version_hashes == [UNKNOWN, v2beta1]
    assert len(pending(cronjob_migrations(ours))) == 1

    # Someone makes another; kcm runs it after the switch: it refines the state.
    in_tree.create(second)
    in_tree.start(second, ours)
    in_tree.succeed(second, ours, namespace)
    summary = poll(kubesim)
    assert cronjobs_state(ours).status.persisted_storage_version_hashes == [v2beta1]
    assert any(f"refined: in-tree migration storageversionmigrations.storagemigration.k8s.io/{second} "
               "(created by kubectl-create)" in d for d in summary.applied.done), summary.applied.done  # fmt: skip
    assert stored_as(kubesim, namespace) == "batch/v2beta1"

    # The record: `history` shows both, with who made them; an event for each phase seen. A poll waits 5 s
    # for the ledger's writer; under load it may still be writing, so the test waits for it first.
    assert writer_for(Settings().database_url).flush(30), "the ledger writer did not catch up"
    assert main(["--kubeconfig", kubesim.kubeconfig, "history", "cronjobs.batch", "--no-requests", "-o", "json"]) == 0
    rows = {r["migration"]: r for r in json.loads(capsys.readouterr().out) if r["kind"] == "in-tree"}
    assert rows[first]["requested_by"] == "kubectl-create" and rows[first]["outcome"] == "succeeded"
    assert rows[first]["phases_seen"] == ["Pending", "Running", "Succeeded"]
    assert rows[second]["phases_seen"] == ["Succeeded"] and rows[second]["resource_version"]
    assert main(["--kubeconfig", kubesim.kubeconfig, "history", "cronjobs.batch", "--no-requests"]) == 0
    assert f"{first} (in-tree)" in capsys.readouterr().out

    def events() -> set[tuple[str, str]] | None:
        with get_client(sync_client=True) as client:
            page = client.read_events(filter=EventFilter(
                occurred=EventOccurredFilter(since=began),
                event=EventNameFilter(prefix=["storage-migrator.in-tree-migration."])), limit=50)  # fmt: skip
        seen = {(e.resource.get("prefect.resource.name", ""), e.event) for e in page.events}
        wanted = {(first, f"storage-migrator.in-tree-migration.{p}") for p in ("pending", "running", "succeeded")}
        wanted.add((second, "storage-migrator.in-tree-migration.succeeded"))
        return seen if wanted <= seen else None

    seen = wait_until(events, what="an event for each in-tree migration and phase", timeout=60)
    assert len([n for n, _ in seen if n in (first, second)]) == 4


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
