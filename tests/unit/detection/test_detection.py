"""The detection poll's plan (seed 000 "Storage migration triggering controller", DESIGN 4.3).

Table tests quote the seed's rules; the seed's "Life-cycle of a StorageState
object" is replayed as a sequence of polls with a simulated clock, applying each
plan to in-memory objects with the tiny pure applier below; hypothesis checks
the invariants over random histories.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import migration_requested_by_detection
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from storage_migrator.conditions import is_condition_true, set_condition
from storage_migrator.detection.planner import (
    DETECTION_LABEL,
    DISCOVERY_REPORTER,
    SETTLE_ANNOTATION,
    SINCE_ANNOTATION,
    CrdObservation,
    CreateMigration,
    CreateState,
    DeleteMigration,
    DetectionPlan,
    DetectionSettings,
    ReporterHash,
    TrimStoredVersions,
    UpdateState,
    format_time,
    parse_time,
    plan_detection,
    retry_delay_seconds,
    storage_version_hash,
)
from storage_migrator.kube.discovery import DiscoveredResource
from storage_migrator.kube.in_tree import InTreeMigration
from storage_migrator.migration.dispatch import is_finished, migration_resource
from storage_migrator.models import (
    CONDITION_FAILED,
    CONDITION_RUNNING,
    CONDITION_SUCCEEDED,
    UNKNOWN,
    GroupResource,
    GroupVersionResource,
    ObjectMeta,
    StorageState,
    StorageStateSpec,
    StorageStateStatus,
    StorageVersionHash,
    StorageVersionMigration,
    new_storage_version_migration,
    storage_state_name,
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)
RW = ("create", "delete", "get", "list", "patch", "update", "watch")
SETTINGS = DetectionSettings(settle_seconds=60, stale_after_seconds=1200)
NO_SETTLE = DetectionSettings(settle_seconds=0, stale_after_seconds=1200)

# Seed 000's example: CronJob, stored as batch/v2alpha1 in 1.14 and batch/v2beta1 in 1.15.
V2ALPHA1 = storage_version_hash("batch", "v2alpha1", "CronJob")
V2BETA1 = storage_version_hash("batch", "v2beta1", "CronJob")
A, B, C = "hashA=", "hashB=", "hashC="


# --- builders ---------------------------------------------------------------------------
#: Issue 36: refinement is ordered by resourceVersion. The builders give a state's switch and a
#: migration's first LIST the resourceVersion etcd would have had at that time, a second apart
#: (from ONE_SECOND before T0 - 1 day); a test of the order within one second passes its own.
AUTO: Any = object()


def rv_at(when: datetime) -> str:
    """The resourceVersion at `when` in these tests: ten revisions a second."""
    return str(int((when - T0).total_seconds() + 86400 + 1) * 10)


def disc(
    resource: str = "cronjobs",
    hash_: str = A,
    *,
    group: str = "batch",
    version: str = "v1",
    kind: str = "CronJob",
    verbs: tuple[str, ...] = RW,
) -> DiscoveredResource:
    return DiscoveredResource(
        group=group,
        version=version,
        resource=resource,
        kind=kind,
        namespaced=True,
        verbs=verbs,
        storage_version_hash=hash_,
        is_subresource="/" in resource,
        preferred=True,
    )


def state(
    current: str | None = A,
    persisted: list[str] | None = None,
    *,
    heartbeat: datetime | None = T0,
    since: datetime | None = T0,
    settle: datetime | None = None,
    group: str = "batch",
    resource: str = "cronjobs",
    rv: str = "7",
    extra_annotations: dict[str, str] | None = None,
    switch_rv: str | None = AUTO,
) -> StorageState:
    annotations = dict(extra_annotations or {})
    if since is not None:
        annotations[SINCE_ANNOTATION] = format_time(since)
    if settle is not None:
        annotations[SETTLE_ANNOTATION] = format_time(settle)
    return StorageState(
        metadata=ObjectMeta(name=storage_state_name(group, resource), resource_version=rv, annotations=annotations),
        spec=StorageStateSpec(resource=GroupResource(group=group, resource=resource)),
        status=StorageStateStatus(
            persisted_storage_version_hashes=[current or ""] if persisted is None else persisted,
            current_storage_version_hash=current,
            last_heartbeat_time=heartbeat,
            current_hash_resource_version=(rv_at(since) if since else None) if switch_rv is AUTO else switch_rv,
        ),
    )


def migration(
    name: str,
    *,
    phase: str = "Pending",
    target: str | None = None,
    started: datetime | None = None,
    finished: datetime | None = None,
    ours: bool = True,
    group: str = "batch",
    resource: str = "cronjobs",
    rv: str | None = AUTO,
) -> StorageVersionMigration:
    m = new_storage_version_migration(
        group=group,
        version="v1",
        resource=resource,
        name=name,
        labels={DETECTION_LABEL: "detection"} if ours else None,
    )
    m.metadata.uid = f"uid-{name}"
    m.status.target_storage_version_hash = target
    m.status.started_at = started
    m.status.finished_at = finished
    m.status.resource_version = (rv_at(started) if started else None) if rv is AUTO else rv
    when = finished or started or T0
    if phase in ("Running", "Succeeded", "Failed"):
        m.status.conditions = set_condition(
            m.status.conditions, condition_type=CONDITION_RUNNING, status="True", now=when
        )
    if phase in ("Succeeded", "Failed"):
        kind = CONDITION_SUCCEEDED if phase == "Succeeded" else CONDITION_FAILED
        m.status.conditions = set_condition(
            m.status.conditions, condition_type=CONDITION_RUNNING, status="False", now=when
        )
        m.status.conditions = set_condition(m.status.conditions, condition_type=kind, status="True", now=when)
    return m


def crd(
    storage: str = "v2", stored: list[str] | None = None, *, kind: str = "Widget", rv: str = "41"
) -> CrdObservation:
    return CrdObservation(
        name="widgets.example.com",
        group="example.com",
        plural="widgets",
        kind=kind,
        storage_version=storage,
        stored_versions=["v1", "v2"] if stored is None else stored,
        resource_version=rv,
    )


def plan(
    discovered: list[DiscoveredResource],
    states: list[StorageState] = (),  # type: ignore[assignment]
    migrations: list[StorageVersionMigration] = (),  # type: ignore[assignment]
    crds: list[CrdObservation] = (),  # type: ignore[assignment]
    *,
    now: datetime = T0 + 10 * MIN,
    settings: DetectionSettings = SETTINGS,
    in_tree: list[InTreeMigration] = (),  # type: ignore[assignment]
) -> DetectionPlan:
    return plan_detection(
        discovered=discovered, states=states, migrations=migrations, crds=crds, now=now, settings=settings,
        in_tree=in_tree,
    )  # fmt: skip


def in_tree(
    name: str,
    phase: str = "Running",
    *,
    rv: str | None = None,
    created: datetime = T0,
    by: str | None = "kubectl-create",
    group: str = "batch",
    resource: str = "cronjobs",
) -> InTreeMigration:
    """A storagemigration.k8s.io migration someone made (issue 36), as kube/in_tree.py reads it."""
    return InTreeMigration(
        api_version="storagemigration.k8s.io/v1beta1", name=name, uid=f"uid-{name}", group=group, resource=resource,
        created_at=created, phase=phase, resource_version=rv, running_since=created if phase != "Pending" else None,
        finished_at=created + MIN if phase in ("Succeeded", "Failed") else None, created_by=by,
    )  # fmt: skip


def kinds(p: DetectionPlan) -> list[str]:
    return [a.kind for a in p.actions]


def the_update(p: DetectionPlan) -> UpdateState:
    (update,) = p.of_kind(UpdateState)
    return update


# --- the in-memory cluster and its pure applier ------------------------------------------


@dataclass
class Cluster:
    """StorageStates, migrations and CRDs as a poll would list them."""

    states: dict[str, StorageState] = field(default_factory=dict)
    migrations: dict[str, StorageVersionMigration] = field(default_factory=dict)
    crds: dict[str, CrdObservation] = field(default_factory=dict)
    serial: itertools.count[int] = field(default_factory=lambda: itertools.count(100))

    def poll(
        self, discovered: list[DiscoveredResource], now: datetime, s: DetectionSettings = SETTINGS
    ) -> DetectionPlan:
        return plan_detection(
            discovered=discovered,
            states=list(self.states.values()),
            migrations=list(self.migrations.values()),
            crds=list(self.crds.values()),
            now=now,
            settings=s,
        )

    def apply(self, p: DetectionPlan, now: datetime) -> list[str]:
        """Apply like the flow does; CAS preconditions are checked. Returns created migration names."""
        created: list[str] = []
        for action in p.actions:
            if isinstance(action, CreateState):
                assert action.name not in self.states, "CreateState of an existing state"
                self.states[action.name] = StorageState(
                    metadata=ObjectMeta(
                        name=action.name, resource_version=str(next(self.serial)), annotations=dict(action.annotations)
                    ),
                    spec=StorageStateSpec(resource=GroupResource(group=action.group, resource=action.resource)),
                    status=StorageStateStatus(
                        persisted_storage_version_hashes=list(action.persisted),
                        current_storage_version_hash=action.current_hash,
                        last_heartbeat_time=action.heartbeat,
                        current_hash_resource_version=self.switch(action),
                    ),
                )
            elif isinstance(action, UpdateState):
                old = self.states[action.name]
                assert old.metadata.resource_version == action.resource_version, "CAS conflict"
                self.states[action.name] = old.model_copy(
                    update={
                        "metadata": old.metadata.model_copy(
                            update={
                                "resource_version": str(next(self.serial)),
                                "annotations": dict(action.annotations),
                            }
                        ),
                        "status": StorageStateStatus(
                            persisted_storage_version_hashes=list(action.persisted),
                            current_storage_version_hash=action.current_hash,
                            last_heartbeat_time=action.heartbeat,
                            current_hash_resource_version=self.switch(action),
                        ),
                    }
                )
            elif isinstance(action, DeleteMigration):
                assert self.migrations[action.name].metadata.uid == action.uid
                del self.migrations[action.name]
            elif isinstance(action, CreateMigration):
                name = f"{action.group_resource}-{next(self.serial)}"
                self.migrations[name] = migration_requested_by_detection(action, name=name, now=now)
                created.append(name)
            elif isinstance(action, TrimStoredVersions):
                old_crd = self.crds[action.crd_name]
                assert old_crd.resource_version == action.resource_version, "CAS conflict"
                self.crds[action.crd_name] = old_crd.model_copy(
                    update={"stored_versions": list(action.stored_versions), "resource_version": str(next(self.serial))}
                )
        return created

    def switch(self, action: CreateState | UpdateState) -> str | None:
        """What tasks/detecting.py writes as status.currentHashResourceVersion: the revision now (issue 36)."""
        return str(next(self.serial)) if action.record_switch is not None else action.switch_resource_version

    def run_migration(self, name: str, *, target: str, started: datetime, finished: datetime, succeed: bool) -> None:
        """What run-migrations does: record the target hash, the start time and its first LIST's
        resourceVersion (the revision now: it runs after every write applied so far), then end it."""
        old = self.migrations[name]
        done = migration(
            name,
            phase="Succeeded" if succeed else "Failed",
            target=target,
            started=started,
            finished=finished,
            ours=DETECTION_LABEL in (old.metadata.labels or {}),
            group=old.spec.resource.group,
            resource=old.spec.resource.resource,
            rv=str(next(self.serial)),
        )
        done.metadata = old.metadata
        self.migrations[name] = done

    def pending(self, group_resource: str) -> list[StorageVersionMigration]:
        return [m for m in self.migrations.values() if migration_resource(m) == group_resource and not is_finished(m)]

    def status(self, name: str) -> tuple[str | None, list[str]]:
        s = self.states[name].status
        return s.current_storage_version_hash, s.persisted_storage_version_hashes


# --- table tests -------------------------------------------------------------------------


def test_hash_is_the_api_servers() -> None:
    # tests/reference: core events (stored as /v1/Event) report r2yiGXH7wu8=.
    assert storage_version_hash("", "v1", "Event") == "r2yiGXH7wu8="
    assert V2ALPHA1 != V2BETA1


@pytest.mark.parametrize(
    ("pending", "expected"),
    [
        # Seed 000: "if the storageState doesn't exist for the resource, the controller
        # ... creates a new storageVersionMigration for this resource, creates the
        # storageState for the resource, setting .status.persistedStorageVersionHashes
        # to ["Unknown"], and setting status.currentStorageVersionHash to the value
        # shown in the discovery document."
        ([], ["CreateState", "CreateMigration"]),
        # A request already pending (anyone's) is not doubled: seed 003 runs them serially.
        ([migration("by-kubectl", ours=False)], ["CreateState"]),
        ([migration("ours", phase="Running", target=A, started=T0)], ["CreateState"]),
        # Finished ones do not count.
        ([migration("old", phase="Succeeded", target=A, started=T0, finished=T0)], ["CreateState", "CreateMigration"]),
    ],
)
def test_new_resource(pending: list[StorageVersionMigration], expected: list[str]) -> None:
    now = T0 + 10 * MIN
    p = plan([disc(hash_=A)], migrations=pending, now=now)
    assert kinds(p) == expected
    (create,) = p.of_kind(CreateState)
    assert (create.name, create.group, create.resource) == ("cronjobs.batch", "batch", "cronjobs")
    assert create.persisted == [UNKNOWN]
    assert create.current_hash == A
    assert create.heartbeat == now
    assert create.annotations == {SINCE_ANNOTATION: format_time(now)}
    for request in p.of_kind(CreateMigration):
        assert (request.group, request.version, request.resource, request.target_hash) == ("batch", "v1", "cronjobs", A)
    assert p.creates_migrations == ("CreateMigration" in expected)


def test_core_resource_state_name() -> None:
    p = plan([disc("configmaps", group="", kind="ConfigMap")])
    assert p.of_kind(CreateState)[0].name == "configmaps"


@pytest.mark.parametrize(
    ("persisted", "annotations"),
    [
        ([A], {}),
        ([UNKNOWN, A], {}),
        ([B, A], {"team": "x"}),
        ([A], {SETTLE_ANNOTATION: format_time(T0 + MIN)}),
    ],
)
def test_same_hash_only_touches_the_heartbeat(persisted: list[str], annotations: dict[str, str]) -> None:
    # Seed 000: "If they are the same, the controller simply updates the
    # status.lastHeartbeatTime and is done."
    old = state(A, persisted, extra_annotations=annotations)
    now = T0 + 10 * MIN
    pending = [migration("running", phase="Running", target=A, started=T0)]
    p = plan([disc(hash_=A)], [old], pending, now=now)
    assert kinds(p) == ["UpdateState"]
    update = the_update(p)
    assert update.name == "cronjobs.batch"
    assert update.resource_version == "7"
    assert update.current_hash == A
    assert update.persisted == persisted
    assert update.annotations == old.metadata.annotations
    assert update.heartbeat == now


def change_plan(
    migrations: list[StorageVersionMigration], s: DetectionSettings = SETTINGS, persisted: list[str] | None = None
) -> DetectionPlan:
    return plan([disc(hash_=B)], [state(A, persisted)], migrations, now=T0 + 10 * MIN, settings=s)


@pytest.mark.parametrize(
    ("persisted", "expected"),
    [
        ([A], [A, B]),
        ([UNKNOWN, A], [UNKNOWN, A, B]),
        # A -> B -> A: the hash is already listed, not appended twice.
        ([B, A], [B, A]),
    ],
)
def test_hash_change_is_one_update(persisted: list[str], expected: list[str]) -> None:
    # Seed 000: "as a single operation, updates the status.lastHeartbeatTime, sets
    # storageState.status.currentStorageVersionHash to the value shown in the
    # discovery document, and appends the hash to the
    # storageState.status.persistedStorageVersionHashes."
    now = T0 + 10 * MIN
    old_persisted = list(persisted)
    p = plan([disc(hash_=B)], [state(A, persisted)], now=now)
    update = the_update(p)
    assert update.current_hash == B
    assert update.persisted == expected
    assert update.heartbeat == now
    assert update.annotations[SINCE_ANNOTATION] == format_time(now)
    assert parse_time(update.annotations[SETTLE_ANNOTATION]) == now + MIN
    assert persisted == old_persisted, "the observed state is not mutated"


@pytest.mark.parametrize(
    ("migrations", "deleted"),
    [
        # Seed 000: "stops any ongoing migration of this resource by deleting existing
        # storageVersionMigrations" -- those detection requested.
        ([migration("ours-pending")], ["ours-pending"]),
        ([migration("ours-running", phase="Running", target=A, started=T0)], ["ours-running"]),
        # Requests of others (kubectl, seed 003's key rotation) are waited on by name: kept.
        ([migration("by-kubectl", ours=False)], []),
        # Finished ones are records, never deleted.
        ([migration("done", phase="Succeeded", target=A, started=T0, finished=T0)], []),
        ([migration("failed", phase="Failed", target=A, started=T0, finished=T0)], []),
        # Another resource's migration is not touched.
        ([migration("other", resource="jobs")], []),
    ],
)
def test_hash_change_deletes_our_pending_migrations(
    migrations: list[StorageVersionMigration], deleted: list[str]
) -> None:
    p = change_plan(migrations)
    assert [(d.name, d.uid) for d in p.of_kind(DeleteMigration)] == [(n, f"uid-{n}") for n in deleted]


def by_initialize(migration_: StorageVersionMigration) -> StorageVersionMigration:
    """The same request as `initialize` labels it (issue 24: it applies this planner's plan)."""
    migration_.metadata.labels = {DETECTION_LABEL: "initialize"}
    return migration_


def test_initializes_requests_are_the_planners_own() -> None:
    """Issue 24: `initialize` is a detection poll, so its pending requests are cancelled on a
    change like detection's (seed 000: "stops any ongoing migration"), and its failures count
    in the back-off; a request of anyone else is still kept."""
    pending = by_initialize(migration("init-pending"))
    p = change_plan([pending, migration("by-kubectl", ours=False)], NO_SETTLE)
    assert [d.name for d in p.of_kind(DeleteMigration)] == ["init-pending"]
    assert not p.creates_migrations, "the kubectl request migrates to the new hash: no second one"
    assert change_plan([pending], NO_SETTLE).of_kind(CreateMigration)[0].target_hash == B
    failed = by_initialize(migration("f", phase="Failed", target=B, started=T0 + MIN, finished=T0 + 2 * MIN))
    assert not plan([disc(hash_=B)], [state(B, [A, B], since=T0)], [failed], now=T0 + 3 * MIN).creates_migrations
    assert plan([disc(hash_=B)], [state(B, [A, B], since=T0)], [failed], now=T0 + 12 * MIN).creates_migrations


@pytest.mark.parametrize(
    ("s", "migrations", "creates"),
    [
        # Seed 004's loose guarantee: wait about a minute after a change.
        (SETTINGS, [], False),
        # Without a settle delay, seed 000's "creates a new storageVersionMigration".
        (NO_SETTLE, [], True),
        (NO_SETTLE, [migration("ours-pending")], True),
        # A pending request of someone else will migrate to the new version: no second one.
        (NO_SETTLE, [migration("by-kubectl", ours=False)], False),
    ],
)
def test_hash_change_requests_after_settling(
    s: DetectionSettings, migrations: list[StorageVersionMigration], creates: bool
) -> None:
    p = change_plan(migrations, s)
    assert p.creates_migrations == creates
    if creates:
        assert p.of_kind(CreateMigration)[0].target_hash == B
        assert kinds(p)[-1] == "CreateMigration", "deletions and the state write come first"
    if s.settle_seconds == 0:
        assert SETTLE_ANNOTATION not in the_update(p).annotations


@pytest.mark.parametrize(
    ("after", "creates"),
    [(30, False), (59, False), (60, True), (600, True)],
)
def test_settle_delay(after: int, creates: bool) -> None:
    changed = T0 + 10 * MIN
    old = state(B, [A, B], since=changed, settle=changed + MIN, heartbeat=changed)
    p = plan([disc(hash_=B)], [old], now=changed + timedelta(seconds=after))
    assert p.creates_migrations == creates
    # Waiting for the settle time is not a change: the annotation stays.
    assert the_update(p).annotations[SETTLE_ANNOTATION] == format_time(changed + MIN)


@pytest.mark.parametrize(
    ("heartbeat", "stale"),
    [
        (T0 + 10 * MIN, False),
        # DESIGN 4.3: a healthy heartbeat is already about one period old.
        (T0 - 9 * MIN, False),
        (T0, False),
        # Seed 000: "if the timestamp is more than 10 minutes old, it recreates
        # storageState object with persistedStorageVersionHashes set to ["Unknown"]"
        # -- two poll periods here (DESIGN 4.3).
        (T0 - 10 * MIN - timedelta(seconds=1), True),
        (T0 - 24 * 60 * MIN, True),
        (None, True),
    ],
)
def test_stale_heartbeat_resets_to_unknown(heartbeat: datetime | None, stale: bool) -> None:
    now = T0 + 10 * MIN
    old = state(A, [A], heartbeat=heartbeat, since=T0 - 60 * MIN)
    p = plan([disc(hash_=A)], [old], now=now)
    update = the_update(p)
    assert update.heartbeat == now
    assert update.current_hash == A
    if stale:
        assert update.persisted == [UNKNOWN]
        assert update.annotations[SINCE_ANNOTATION] == format_time(now)
        assert kinds(p) == ["UpdateState", "CreateMigration"]
    else:
        assert update.persisted == [A]
        assert kinds(p) == ["UpdateState"]


def test_stale_and_changed_is_still_one_update() -> None:
    now = T0 + 60 * MIN
    p = plan([disc(hash_=B)], [state(A, [A], heartbeat=T0)], [migration("ours")], now=now)
    assert kinds(p) == ["DeleteMigration", "UpdateState"]
    update = the_update(p)
    assert update.persisted == [UNKNOWN]
    assert update.current_hash == B
    assert parse_time(update.annotations[SETTLE_ANNOTATION]) == now + MIN


@pytest.mark.parametrize(
    ("done", "refined"),
    [
        # Seed 000: "If a migration completes, the controller finds the storageState of
        # that resource, updates its status.persistedStorageVersionHashes to equal its
        # status.currentStorageVersionHash."
        (migration("m", phase="Succeeded", target=B, started=T0 + MIN, finished=T0 + 2 * MIN), True),
        # Issue 36: ordered by resourceVersion, not by the second. The state recorded B at
        # rv_at(T0); both these began listing in the second T0 (startedAt == since), one just
        # before the switch was recorded (it may have listed objects before B was written), one
        # after it.
        (migration("m", phase="Succeeded", target=B, started=T0, finished=T0 + MIN, rv=str(int(rv_at(T0)) - 1)), False),
        (migration("m", phase="Succeeded", target=B, started=T0, finished=T0 + MIN, rv=str(int(rv_at(T0)) + 1)), True),
        # The same resourceVersion is not later: which came first is not known.
        (migration("m", phase="Succeeded", target=B, started=T0, finished=T0 + MIN, rv=rv_at(T0)), False),
        # Compared as integers (kubernetes/kubernetes#126521), not as text: "1000000" sorts before
        # the switch's "864010" as text, and is later.
        (migration("m", phase="Succeeded", target=B, started=T0 + MIN, rv="1000000"), True),
        # A migration that recorded none (it began before they were recorded), or one that does not
        # parse, proves nothing: never the timestamps instead.
        (migration("m", phase="Succeeded", target=B, started=T0 + MIN, finished=T0 + 2 * MIN, rv=None), False),
        (migration("m", phase="Succeeded", target=B, started=T0 + MIN, finished=T0 + 2 * MIN, rv="abc"), False),
        # Anyone's success is proof: it rewrote every object to the current hash.
        (migration("m", phase="Succeeded", target=B, started=T0 + MIN, finished=T0 + 2 * MIN, ours=False), True),
        # DESIGN 4.3: "only if the current hash did not change while it ran".
        (migration("m", phase="Succeeded", target=A, started=T0 + MIN, finished=T0 + 2 * MIN), False),
        # Started before the current hash was recorded (e.g. an old migration to B, B -> A -> B).
        (migration("m", phase="Succeeded", target=B, started=T0 - MIN, finished=T0 + 2 * MIN), False),
        # No target recorded: no proof.
        (migration("m", phase="Succeeded", target=None, started=T0 + MIN, finished=T0 + 2 * MIN), False),
        (migration("m", phase="Failed", target=B, started=T0 + MIN, finished=T0 + 2 * MIN), False),
        (migration("m", phase="Running", target=B, started=T0 + MIN), False),
    ],
)
def test_refinement(done: StorageVersionMigration, refined: bool) -> None:
    old = state(B, [UNKNOWN, A, B], since=T0)
    p = plan([disc(hash_=B)], [old], [done], now=T0 + 10 * MIN)
    assert the_update(p).persisted == ([B] if refined else [UNKNOWN, A, B])
    # Refined: nothing left to migrate. Not refined: a new request, unless one is pending
    # or a failure's back-off holds it.
    waiting = not is_finished(done) or is_condition_true(done.status.conditions, CONDITION_FAILED)
    assert p.creates_migrations == (not refined and not waiting)


def test_old_migration_never_refines_after_a_to_b_to_a() -> None:
    # A succeeded migration to A from before A -> B -> A: objects written as B since.
    back = T0 + 30 * MIN
    old = state(A, [A, B], since=back, heartbeat=back)
    done = migration("to-a", phase="Succeeded", target=A, started=T0, finished=T0 + MIN)
    p = plan([disc(hash_=A)], [old], [done], now=back + 10 * MIN)
    assert the_update(p).persisted == [A, B]
    assert p.creates_migrations


def test_migration_of_a_sharing_name_counts() -> None:
    # events and events.events.k8s.io are one storage: a success of either refines it.
    h = storage_version_hash("", "v1", "Event")
    discovered = [disc("events", h, group="", kind="Event"), disc("events", h, group="events.k8s.io", kind="Event")]
    old = state(h, [UNKNOWN, h], group="", resource="events")
    done = migration("ev", phase="Succeeded", target=h, started=T0 + MIN, group="events.k8s.io", resource="events")
    p = plan(discovered, [old], [done])
    assert the_update(p).persisted == [h]


WIDGET_V1 = storage_version_hash("example.com", "v1", "Widget")
WIDGET_V2 = storage_version_hash("example.com", "v2", "Widget")


@pytest.mark.parametrize(
    ("observed", "succeeded_to", "seen", "trim"),
    [
        # DESIGN 4.3: refinement also trims the CRD's status.storedVersions.
        (crd("v2", ["v1", "v2"]), WIDGET_V2, WIDGET_V2, True),
        (crd("v2", ["v2", "v1"]), WIDGET_V2, WIDGET_V2, True),
        (crd("v2", []), WIDGET_V2, WIDGET_V2, True),
        # Already trimmed.
        (crd("v2", ["v2"]), WIDGET_V2, WIDGET_V2, False),
        # The CRD was edited meanwhile (storage is v1 now, discovery not caught up): never trim.
        (crd("v1", ["v1", "v2"]), WIDGET_V2, WIDGET_V2, False),
        # Not refined: no trim.
        (crd("v2", ["v1", "v2"]), WIDGET_V1, WIDGET_V2, False),
    ],
)
def test_crd_stored_versions_trim(observed: CrdObservation, succeeded_to: str, seen: str, trim: bool) -> None:
    old = state(seen, [WIDGET_V1, seen], group="example.com", resource="widgets")
    done = migration(
        "w", phase="Succeeded", target=succeeded_to, started=T0 + MIN, group="example.com", resource="widgets"
    )
    p = plan([disc("widgets", seen, group="example.com", version="v2", kind="Widget")], [old], [done], [observed])
    trims = p.of_kind(TrimStoredVersions)
    if trim:
        assert [(t.crd_name, t.stored_versions, t.resource_version) for t in trims] == [
            ("widgets.example.com", ["v2"], "41")
        ]
    else:
        assert trims == []


@pytest.mark.parametrize(
    ("failures", "since_last", "allowed"),
    [
        (1, 9, False),
        (1, 10, True),
        (2, 19, False),
        (2, 20, True),
        (3, 39, False),
        (3, 40, True),
        (12, 23 * 60, False),
        (12, 24 * 60, True),  # capped at a day
    ],
)
def test_failed_migration_backs_off(failures: int, since_last: int, allowed: bool) -> None:
    last = T0 + failures * MIN
    now = last + since_last * MIN
    old = state(B, [A, B], since=T0, heartbeat=now - MIN)
    failed = [
        migration(f"f{i}", phase="Failed", target=B, started=T0 + i * MIN, finished=T0 + (i + 1) * MIN)
        for i in range(failures)
    ]
    p = plan([disc(hash_=B)], [old], failed, now=now)
    assert p.creates_migrations == allowed


@pytest.mark.parametrize(
    "failed",
    [
        # Failed before the hash change: the back-off resets (SINCE moved).
        migration("f", phase="Failed", target=B, started=T0 - 2 * MIN, finished=T0 - MIN),
        # Failed at another hash.
        migration("f", phase="Failed", target=A, started=T0 + MIN, finished=T0 + 2 * MIN),
        # Not ours: a person's request failing says nothing of our schedule.
        migration("f", phase="Failed", target=B, started=T0 + MIN, finished=T0 + 2 * MIN, ours=False),
    ],
)
def test_failures_that_do_not_count(failed: StorageVersionMigration) -> None:
    p = plan([disc(hash_=B)], [state(B, [A, B], since=T0)], [failed], now=T0 + 3 * MIN)
    assert p.creates_migrations


def test_retry_delays() -> None:
    assert [retry_delay_seconds(n, base=600, maximum=86400) for n in range(0, 5)] == [0, 600, 1200, 2400, 4800]
    assert retry_delay_seconds(1000, base=600, maximum=86400) == 86400


def test_skipped_and_shared_resources() -> None:
    h = storage_version_hash("", "v1", "Event")
    discovered = [
        disc("events", h, group="", kind="Event"),
        disc("events", h, group="events.k8s.io", kind="Event"),
        disc("tokenreviews", "", group="authentication.k8s.io", kind="TokenReview", verbs=("create",)),
        disc("cronjobs/status", "", kind="CronJob"),
        disc("cronjobs", A),
    ]
    p = plan(discovered)
    assert [c.name for c in p.of_kind(CreateState)] == ["events", "cronjobs.batch"]
    assert {s.group_resource: s.reason for s in p.skipped} == {
        "events.events.k8s.io": "shares storage with events",
        "tokenreviews.authentication.k8s.io": "not persisted: no storageVersionHash",
    } | {"cronjobs/status.batch": "sub-resource: stored with its parent resource"}


def test_states_of_undiscovered_resources_are_left_alone() -> None:
    gone = state(A, [A], group="example.com", resource="gadgets", heartbeat=T0 - 100 * MIN)
    p = plan([disc(hash_=A)], [state(A, [A]), gone])
    assert [a.name for a in p.of_kind(UpdateState)] == ["cronjobs.batch"]


def test_state_without_since_starts_the_clock() -> None:
    # An old success cannot be dated against the current hash: measure from now on.
    old = state(A, [UNKNOWN, A], since=None)
    done = migration("m", phase="Succeeded", target=A, started=T0 + MIN, finished=T0 + 2 * MIN)
    now = T0 + 10 * MIN
    p = plan([disc(hash_=A)], [old], [done], now=now)
    assert the_update(p).annotations[SINCE_ANNOTATION] == format_time(now)
    assert the_update(p).persisted == [UNKNOWN, A]
    assert p.creates_migrations


def test_actions_round_trip_as_json() -> None:
    p = plan([disc(hash_=B)], [state(A, [A])], [migration("x")], [crd()], settings=NO_SETTLE)
    assert DetectionPlan.model_validate_json(p.model_dump_json()) == p


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (
            {
                "metadata": {"name": "widgets.example.com", "resourceVersion": "5"},
                "spec": {
                    "group": "example.com",
                    "names": {"plural": "widgets", "kind": "Widget"},
                    "versions": [{"name": "v1", "storage": False}, {"name": "v2", "storage": True}],
                },
                "status": {"storedVersions": ["v1", "v2"]},
            },
            CrdObservation(
                name="widgets.example.com",
                group="example.com",
                plural="widgets",
                kind="Widget",
                storage_version="v2",
                stored_versions=["v1", "v2"],
                resource_version="5",
            ),
        ),
        ({"metadata": {"name": "x", "resourceVersion": "5"}, "spec": {"group": "g"}}, None),
        (
            {
                "metadata": {"name": "x"},
                "spec": {
                    "group": "g",
                    "names": {"plural": "p", "kind": "K"},
                    "versions": [{"name": "v1", "storage": True}],
                },
            },
            None,
        ),
    ],
)
def test_crd_observation(obj: dict[str, Any], expected: CrdObservation | None) -> None:
    assert CrdObservation.from_object(obj) == expected


# --- seed 000, "Life-cycle of a StorageState object" ---------------------------------------


def test_life_cycle_of_a_storage_state() -> None:
    cluster = Cluster()
    name = "cronjobs.batch"
    v114 = [disc(hash_=V2ALPHA1, version="v1beta1")]
    v115 = [disc(hash_=V2BETA1, version="v1beta1")]
    t = T0

    # "When the migration triggering controller is installed on an 1.14 cluster for the
    # first time, there is no StorageState object. The controller creates the
    # StorageState object for CronJob, setting .status.persistedStorageVersionHashes to
    # ["Unknown"] and .status.currentStorageVersionHash to batch/v2alpha1. It also
    # creates a storageVersionMigration object to request a migration."
    (first,) = cluster.apply(cluster.poll(v114, t), t)
    assert cluster.status(name) == (V2ALPHA1, [UNKNOWN])
    assert cluster.states[name].status.last_heartbeat_time == t

    # "When the migration completed, the migration triggering controller sets
    # .status.persistedStorageVersionHashes to [batch/v2alpha1]."
    cluster.run_migration(first, target=V2ALPHA1, started=t + MIN, finished=t + 3 * MIN, succeed=True)
    t += 10 * MIN
    p = cluster.poll(v114, t)
    assert not p.creates_migrations
    cluster.apply(p, t)
    assert cluster.status(name) == (V2ALPHA1, [V2ALPHA1])

    # "The migration triggering controller crashes and has been offline for less than
    # 10 minutes. When it's back online, it sees the .status.lastHeartbeatTime is less
    # than 10 minutes old, thus it considers the storageState still valid. The
    # controller does nothing other than updating the lastHeartbeatTime."
    t += 18 * MIN  # one missed poll and then some: still within two periods
    before = cluster.states[name]
    p = cluster.poll(v114, t)
    assert kinds(p) == ["UpdateState"]
    cluster.apply(p, t)
    after = cluster.states[name]
    assert after.status.last_heartbeat_time == t
    assert after.status.model_copy(update={"last_heartbeat_time": None}) == before.status.model_copy(
        update={"last_heartbeat_time": None}
    )
    assert after.metadata.annotations == before.metadata.annotations

    # "The cluster admin upgrades the cluster to 1.15. [...] The migration triggering
    # controller observes the change. It sets the
    # storageState.status.currentStorageVersionHash to batch/v2beta1 and
    # storageState.status.persistedStorageVersionHashes to [v2alpha1, v2beta1]. It
    # also creates a migration request for cronjobs to migrate to v2beta1."
    # (Once the settle delay has passed: seed 004's loose guarantee.)
    t += 10 * MIN
    p = cluster.poll(v115, t)
    assert not p.creates_migrations
    cluster.apply(p, t)
    assert cluster.status(name) == (V2BETA1, [V2ALPHA1, V2BETA1])
    t += 10 * MIN
    p = cluster.poll(v115, t)
    assert [m.target_hash for m in p.of_kind(CreateMigration)] == [V2BETA1]
    (upgrade,) = cluster.apply(p, t)
    assert cluster.status(name) == (V2BETA1, [V2ALPHA1, V2BETA1])

    # "The cluster admin finds a critical issue in 1.15 and downgrades the cluster
    # back to 1.14. The migration triggering controller sets the
    # storageState.status.currentStorageVersionHash to batch/v2alpha1 and recreates
    # the storageVersionMigration object to migrate to v2alpha1."
    t += 10 * MIN
    p = cluster.poll(v114, t)
    assert [d.name for d in p.of_kind(DeleteMigration)] == [upgrade]
    cluster.apply(p, t)
    # The first migration to v2alpha1 succeeded before v2beta1 objects were written: no proof.
    assert cluster.status(name) == (V2ALPHA1, [V2ALPHA1, V2BETA1])
    assert cluster.pending(name) == []
    t += 10 * MIN
    p = cluster.poll(v114, t)
    (downgrade,) = cluster.apply(p, t)
    assert [m.target_hash for m in p.of_kind(CreateMigration)] == [V2ALPHA1]

    # When that migration completes, the state is refined again.
    cluster.run_migration(downgrade, target=V2ALPHA1, started=t + MIN, finished=t + 2 * MIN, succeed=True)
    t += 10 * MIN
    cluster.apply(cluster.poll(v114, t), t)
    assert cluster.status(name) == (V2ALPHA1, [V2ALPHA1])
    assert cluster.pending(name) == []


def test_crd_life_cycle_trims_stored_versions() -> None:
    cluster = Cluster()
    cluster.crds["widgets.example.com"] = crd("v1", ["v1"])
    name = "widgets.example.com"
    t = T0
    cluster.apply(cluster.poll([disc("widgets", WIDGET_V1, group="example.com", kind="Widget")], t, NO_SETTLE), t)
    # The admin flips storage to v2: the API server appends v2 to storedVersions.
    cluster.crds[name] = crd("v2", ["v1", "v2"])
    after_flip = [disc("widgets", WIDGET_V2, group="example.com", version="v2", kind="Widget")]
    t += 10 * MIN
    p = cluster.poll(after_flip, t, NO_SETTLE)
    assert p.of_kind(TrimStoredVersions) == []
    for request in cluster.apply(p, t):
        cluster.run_migration(request, target=WIDGET_V2, started=t + MIN, finished=t + 2 * MIN, succeed=True)
    t += 10 * MIN
    p = cluster.poll(after_flip, t, NO_SETTLE)
    cluster.apply(p, t)
    assert cluster.status(name) == (WIDGET_V2, [WIDGET_V2])
    assert cluster.crds[name].stored_versions == ["v2"]
    # Next poll: nothing more to do.
    t += 10 * MIN
    assert kinds(cluster.poll(after_flip, t, NO_SETTLE)) == ["UpdateState"]


# --- properties ------------------------------------------------------------------------

RESOURCES = ["cronjobs", "jobs"]

step = st.one_of(
    st.tuples(st.just("poll"), st.integers(0, 90)),  # minutes to advance, then poll
    st.tuples(st.just("switch"), st.sampled_from(RESOURCES), st.sampled_from([A, B, C])),
    st.tuples(st.just("run"), st.booleans(), st.integers(0, 5)),  # run the oldest pending migration
    st.tuples(st.just("kubectl"), st.sampled_from(RESOURCES)),
    st.tuples(st.just("reset"), st.sampled_from(RESOURCES)),  # the operator deletes a StorageState
)


def check_invariants(cluster: Cluster, before: dict[str, StorageState]) -> None:
    for name, s in cluster.states.items():
        current = s.status.current_storage_version_hash
        persisted = s.status.persisted_storage_version_hashes
        # The current hash is always in persisted (objects written now are encoded in
        # it), or "Unknown" is, which covers every version (seed 000's fresh ["Unknown"]).
        assert current in persisted or UNKNOWN in persisted
        assert len(set(persisted)) == len(persisted)
        # "Unknown" only disappears through a succeeded migration to the current hash
        # that started after the current hash was recorded.
        was_unknown = name not in before or UNKNOWN in before[name].status.persisted_storage_version_hashes
        if was_unknown and UNKNOWN not in persisted:
            # Issue 36: that started after it by resourceVersion (the revision of its first LIST).
            switch = s.status.current_hash_resource_version
            assert switch is not None
            assert any(
                is_condition_true(m.status.conditions, CONDITION_SUCCEEDED)
                and m.status.target_storage_version_hash == current
                and m.status.resource_version is not None
                and int(m.status.resource_version) > int(switch)
                and migration_resource(m) == name
                for m in cluster.migrations.values()
            )
            assert persisted == [current]
            event("refined")
    # Never two pending detection migrations per resource.
    for name in RESOURCES:
        ours = [m for m in cluster.pending(f"{name}.batch") if DETECTION_LABEL in (m.metadata.labels or {})]
        assert len(ours) <= 1


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(step, max_size=40), settle=st.sampled_from([0, 60, 900]))
def test_invariants_over_random_histories(steps: list[tuple[Any, ...]], settle: int) -> None:
    s = DetectionSettings(settle_seconds=settle, stale_after_seconds=1200)
    cluster = Cluster()
    hashes = dict.fromkeys(RESOURCES, A)
    t = T0
    kubectl = itertools.count()

    def discovered() -> list[DiscoveredResource]:
        return [disc(r, hashes[r]) for r in RESOURCES]

    for item in [*steps, ("poll", 0)]:
        if item[0] == "poll":
            t += timedelta(minutes=item[1])
            before = dict(cluster.states)
            first = cluster.poll(discovered(), t, s)
            cluster.apply(first, t)
            for a in first.actions:
                event(a.kind)
            check_invariants(cluster, before)
            # A poll with no change in between (same discovery, nothing finished, not
            # stale, settle passed or none) changes only heartbeats.
            settled = dict(cluster.states)
            again = cluster.poll(discovered(), t, s)
            assert kinds(again) == ["UpdateState"] * len(RESOURCES)
            for update in again.of_kind(UpdateState):
                old = settled[update.name]
                assert update.current_hash == old.status.current_storage_version_hash
                assert update.persisted == old.status.persisted_storage_version_hashes
                assert update.annotations == (old.metadata.annotations or {})
            cluster.apply(again, t)
            check_invariants(cluster, settled)
        elif item[0] == "switch":
            hashes[item[1]] = item[2]
        elif item[0] == "run":
            waiting = sorted(
                (m for m in cluster.migrations.values() if not is_finished(m)), key=lambda m: m.metadata.name or ""
            )
            if waiting:
                m = waiting[0]
                started = t + timedelta(minutes=item[2])
                cluster.run_migration(
                    m.metadata.name or "",
                    target=hashes[m.spec.resource.resource],
                    started=started,
                    finished=started + MIN,
                    succeed=item[1],
                )
                t = started + MIN
        elif item[0] == "kubectl":
            name = f"kubectl-{next(kubectl)}"
            cluster.migrations[name] = migration(name, ours=False, resource=item[1])
        elif item[0] == "reset":
            cluster.states.pop(f"{item[1]}.batch", None)


@settings(max_examples=200, deadline=None)
@given(
    persisted=st.lists(st.sampled_from([UNKNOWN, A, B, C]), unique=True, max_size=4),
    current=st.sampled_from([A, B, C]),
    observed=st.sampled_from([A, B, C]),
    age=st.integers(0, 60),
    settle=st.sampled_from([0, 60]),
)
def test_one_poll_keeps_current_in_persisted(
    persisted: list[str], current: str, observed: str, age: int, settle: int
) -> None:
    s = DetectionSettings(settle_seconds=settle, stale_after_seconds=1200)
    now = T0 + 60 * MIN
    old = state(current, persisted, heartbeat=now - age * MIN, since=T0)
    update = the_update(plan([disc(hash_=observed)], [old], now=now, settings=s))
    assert update.current_hash == observed
    assert observed in update.persisted or UNKNOWN in update.persisted
    if UNKNOWN in persisted:
        assert UNKNOWN in update.persisted, "no migration succeeded: Unknown stays"


# --- seed 000, HA: reporters (one per API server) -------------------------------------------
# The rules of "Extending the work flow of the triggering controller"; the case
# walkthrough table itself is tests/unit/detection/test_walkthrough.py.

PERIOD = DetectionSettings(settle_seconds=0, stale_after_seconds=1200, poll_seconds=600)


def reporters(**hashes: str) -> list[ReporterHash]:
    return [ReporterHash(reporter_id=rid, group="batch", resource="cronjobs", hash=h) for rid, h in hashes.items()]


def with_reporters(s: StorageState, *entries: tuple[str, str, datetime]) -> StorageState:
    listed = [
        StorageVersionHash(reporterID=r, current_storage_version_hash=h, last_heartbeat_time=t) for r, h, t in entries
    ]
    return s.model_copy(update={"status": s.status.model_copy(update={"current_storage_version_hashes": listed})})


def ha_plan(
    reports: list[ReporterHash],
    states: list[StorageState],
    migrations: list[StorageVersionMigration] = (),  # type: ignore[assignment]
    *,
    now: datetime,
    s: DetectionSettings = PERIOD,
) -> DetectionPlan:
    return plan_detection(
        discovered=[disc(hash_=reports[0].hash if reports else A)],
        reporters=reports,
        states=states,
        migrations=migrations,
        crds=[],
        now=now,
        settings=s,
    )


def test_single_server_is_one_discovery_reporter() -> None:
    now = T0 + 10 * MIN
    p = plan([disc(hash_=A)], [state(A, [A])], now=now)
    (entry,) = the_update(p).current_hashes
    assert (entry.reporter_id, entry.current_storage_version_hash, entry.last_heartbeat_time) == (
        DISCOVERY_REPORTER,
        A,
        now,
    )
    (create,) = plan([disc(hash_=A)], now=now).of_kind(CreateState)
    assert [e.reporter_id for e in create.current_hashes] == [DISCOVERY_REPORTER]


def test_a_new_reporters_hash_joins_persisted_at_once() -> None:
    # Seed 000: every reporter "adds the storage version hash to
    # PersistedStorageVersionHashes if the local storage version hash is not present
    # there yet" -- even while no migration may start.
    now = T0 + 10 * MIN
    old = with_reporters(state(A, [A]), ("api-1", A, T0), ("api-2", A, T0))
    p = ha_plan(reporters(**{"api-1": A, "api-2": A, "api-3": B}), [old], now=now)
    update = the_update(p)
    assert update.persisted == [A, B]
    assert update.current_hash == A, "no agreement on B: the non-HA field keeps the agreed hash"
    assert {e.reporter_id: e.current_storage_version_hash for e in update.current_hashes} == {
        "api-1": A,
        "api-2": A,
        "api-3": B,
    }
    assert not p.creates_migrations


def test_a_silent_reporter_blocks_requests_until_collected() -> None:
    # Seed 000: a migration starts only if "the lastHeartbeatTime in all items of the
    # CurrentStorageVersionHashes are no older than 1 polling period (10 mins)"; the
    # silent entry is removed once "more than 3 polling periods (30 mins) old".
    silent_since = T0
    old = with_reporters(state(B, [A, B], since=T0 - 60 * MIN), ("api-1", B, T0), ("gone", B, silent_since))
    for minutes, collected in [(10, False), (11, False), (30, False), (31, True)]:
        now = silent_since + minutes * MIN
        fresh = old.model_copy(update={"status": old.status.model_copy(update={"last_heartbeat_time": now - MIN})})
        p = ha_plan(reporters(**{"api-1": B}), [fresh], now=now)
        ids = [e.reporter_id for e in the_update(p).current_hashes]
        assert ("gone" in ids) == (not collected)
        # Heard exactly one period ago still counts; later it blocks until collected.
        assert p.creates_migrations == (minutes == 10 or collected), minutes


def test_a_late_reporter_with_the_same_hash_does_not_cancel() -> None:
    # Seed 000 cancels "once the hashes ... stop being identical": silence alone does not.
    now = T0 + 25 * MIN
    old = with_reporters(state(B, [A, B], since=T0, heartbeat=now - MIN), ("api-1", B, T0), ("api-2", B, T0))
    running = migration("ours", phase="Running", target=B, started=T0 + MIN)
    p = ha_plan(reporters(**{"api-1": B}), [old], [running], now=now)
    assert kinds(p) == ["UpdateState"]
    assert the_update(p).annotations[SINCE_ANNOTATION] == format_time(T0)


@pytest.mark.parametrize(
    "pending",
    [
        migration("ours-pending"),
        migration("ours-running", phase="Running", target=B, started=T0 + MIN),
    ],
)
def test_disagreement_cancels_our_migrations(pending: StorageVersionMigration) -> None:
    # Seed 000: the leader "deletes pending storageVersionMigration objects to cancel any
    # ongoing migration, once the hashes in currentStorageVersionHashes stop being identical".
    now = T0 + 10 * MIN
    old = with_reporters(state(B, [A, B]), ("api-1", B, T0), ("api-2", B, T0))
    kubectl = migration("by-kubectl", ours=False)
    p = ha_plan(reporters(**{"api-1": B, "api-2": A}), [old], [pending, kubectl], now=now)
    assert [d.name for d in p.of_kind(DeleteMigration)] == [pending.metadata.name]
    update = the_update(p)
    assert update.current_hash == B
    assert SINCE_ANNOTATION not in update.annotations
    assert (update.switch_resource_version, update.record_switch) == (None, None), "issue 36: nor its resourceVersion"
    assert not p.creates_migrations


def test_a_migration_that_ran_during_disagreement_never_refines() -> None:
    # Seed 000's walkthrough, had the migration of minute 20 finished before the poll
    # of 30: server 3 wrote v1 objects from 22 on, so it proves nothing, even when the
    # servers agree on v2 again at 40.
    old = with_reporters(state(B, [A, B], since=T0), ("api-1", B, T0), ("api-2", B, T0), ("api-3", B, T0))
    done = migration("m", phase="Succeeded", target=B, started=T0 + MIN, finished=T0 + 8 * MIN)
    at_30 = ha_plan(reporters(**{"api-1": B, "api-2": B, "api-3": A}), [old], [done], now=T0 + 10 * MIN)
    update = the_update(at_30)
    assert update.persisted == [A, B], "never refined while they disagree"
    assert SINCE_ANNOTATION not in update.annotations
    after = with_reporters(
        state(B, [A, B], since=None, heartbeat=T0 + 10 * MIN),
        *((e.reporter_id, e.current_storage_version_hash, T0 + 10 * MIN) for e in update.current_hashes),
    )
    at_40 = ha_plan(reporters(**{"api-1": B, "api-2": B, "api-3": B}), [after], [done], now=T0 + 20 * MIN)
    update = the_update(at_40)
    assert update.persisted == [A, B]
    assert update.annotations[SINCE_ANNOTATION] == format_time(T0 + 20 * MIN), "the clock restarts on agreement"
    assert [c.target_hash for c in at_40.of_kind(CreateMigration)] == [B]


def test_new_state_while_reporters_disagree() -> None:
    p = ha_plan(reporters(**{"api-1": B, "api-2": A}), [], now=T0)
    (create,) = p.of_kind(CreateState)
    assert create.persisted == [UNKNOWN]
    assert create.current_hash == B, "the discovery document's hash until they agree"
    assert create.annotations == {}
    assert not p.creates_migrations
    agreed = ha_plan(reporters(**{"api-1": B, "api-2": B}), [], now=T0)
    assert [c.target_hash for c in agreed.of_kind(CreateMigration)] == [B]


def test_reports_under_a_sharing_name_count() -> None:
    h = storage_version_hash("", "v1", "Event")
    discovered = [disc("events", h, group="", kind="Event"), disc("events", h, group="events.k8s.io", kind="Event")]
    reports = [
        ReporterHash(reporter_id="api-1", group="", resource="events", hash=h),
        ReporterHash(reporter_id="api-2", group="events.k8s.io", resource="events", hash="other="),
    ]
    p = plan_detection(
        discovered=discovered, reporters=reports, states=[], migrations=[], crds=[], now=T0, settings=PERIOD
    )
    (create,) = p.of_kind(CreateState)
    assert [e.reporter_id for e in create.current_hashes] == ["api-1", "api-2"]
    assert not p.creates_migrations


SERVERS = ["api-1", "api-2", "api-3"]
ha_step = st.one_of(
    st.tuples(st.just("poll"), st.integers(0, 40)),
    st.tuples(st.just("switch"), st.sampled_from(SERVERS), st.sampled_from([A, B, C])),
    st.tuples(st.just("silence"), st.sampled_from(SERVERS)),  # the server stops answering
    st.tuples(st.just("run"), st.booleans(), st.integers(0, 5)),
)


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(ha_step, max_size=40), settle=st.sampled_from([0, 60]))
# A migration succeeds, then a server is rolled back and upgraded again (seed 000's walkthrough).
@example(
    steps=[("poll", 0), ("run", True, 1), ("switch", "api-3", B), ("poll", 10), ("switch", "api-3", A), ("poll", 10)],
    settle=0,
)
def test_ha_invariants_over_random_histories(steps: list[tuple[Any, ...]], settle: int) -> None:
    s = DetectionSettings(settle_seconds=settle, stale_after_seconds=1200, poll_seconds=600)
    cluster = Cluster()
    servers: dict[str, str | None] = dict.fromkeys(SERVERS, A)
    name = "cronjobs.batch"
    t = T0
    last_disagreement: datetime | None = None
    for item in [*steps, ("poll", 0)]:
        if item[0] == "poll":
            t += timedelta(minutes=item[1])
            answering = {r: h for r, h in servers.items() if h is not None}
            reports = reporters(**answering) if answering else []
            old = cluster.states.get(name)
            p = plan_detection(
                discovered=[disc(hash_=A)],
                reporters=reports,
                states=list(cluster.states.values()),
                migrations=list(cluster.migrations.values()),
                crds=[],
                now=t,
                settings=s,
            )
            (written,) = p.of_kind(UpdateState) or p.of_kind(CreateState)
            entries = {e.reporter_id: e for e in written.current_hashes}
            hashes = {e.current_storage_version_hash for e in entries.values()}
            heard = all(
                (t - e.last_heartbeat_time).total_seconds() <= 600 for e in entries.values() if e.last_heartbeat_time
            )
            agree = len(hashes) == 1 and heard
            persisted = written.persisted
            # Every hash a reporter shows is covered; the current hash too.
            assert all(h in persisted for h in hashes) or UNKNOWN in persisted
            assert written.current_hash in persisted or UNKNOWN in persisted
            if not agree:
                assert not p.creates_migrations, "no migration while the reporters disagree"
                assert "refined" not in written.reason, "never refined while they disagree"
                if old is not None:
                    assert written.current_hash == old.status.current_storage_version_hash
            if len(hashes) > 1:
                ours = [m for m in cluster.pending(name) if DETECTION_LABEL in (m.metadata.labels or {})]
                assert sorted(d.name for d in p.of_kind(DeleteMigration)) == sorted(m.metadata.name for m in ours)
            for request in p.of_kind(CreateMigration):
                assert request.target_hash == written.current_hash
            cluster.apply(p, t)
            cluster.states[name].status.current_storage_version_hashes = list(written.current_hashes)
            event("agree" if agree else "disagree")
            for a in p.actions:
                event(a.kind)
            if len(hashes) > 1:
                last_disagreement = t
            if "refined" in written.reason:
                event("refined")
                # Only a migration that started after the servers last disagreed proves anything.
                assert any(
                    is_condition_true(m.status.conditions, CONDITION_SUCCEEDED)
                    and m.status.target_storage_version_hash == written.current_hash
                    and m.status.started_at is not None
                    and (last_disagreement is None or m.status.started_at > last_disagreement)
                    for m in cluster.migrations.values()
                )
        elif item[0] == "switch":
            servers[item[1]] = item[2]
        elif item[0] == "silence":
            servers[item[1]] = None
        elif item[0] == "run":
            waiting = sorted(cluster.pending(name), key=lambda m: m.metadata.name or "")
            if waiting:
                started = t + timedelta(minutes=item[2])
                target = cluster.states[name].status.current_storage_version_hash or A
                cluster.run_migration(
                    waiting[0].metadata.name or "",
                    target=target,
                    started=started,
                    finished=started + MIN,
                    succeed=item[1],
                )
                t = started + MIN


# --- issue 36: refinement by causal order; in-tree migrations made by anyone -------------------

CRONJOBS = GroupVersionResource(group="batch", version="v1", resource="cronjobs")


def test_the_switch_is_recorded_with_the_resource_version_read_when_it_is_applied() -> None:
    """Issue 36: "when detection records a storage switch (a new current hash in a StorageState), it
    records the resource's resourceVersion at that moment (a LIST with limit 1 of that resource)":
    the plan says which resource to LIST; tasks/detecting.py reads it after discovery showed the hash."""
    (create,) = plan([disc(hash_=A)]).of_kind(CreateState)
    assert (create.record_switch, create.switch_resource_version) == (CRONJOBS, None)
    changed = the_update(change_plan([]))
    assert (changed.record_switch, changed.switch_resource_version) == (CRONJOBS, None)
    stale = the_update(plan([disc(hash_=A)], [state(A, [A], heartbeat=T0 - 60 * MIN)], now=T0 + 10 * MIN))
    assert stale.persisted == [UNKNOWN] and stale.record_switch == CRONJOBS
    # A heartbeat keeps the one recorded.
    beat = the_update(plan([disc(hash_=A)], [state(A, [UNKNOWN, A])]))
    assert (beat.record_switch, beat.switch_resource_version) == (None, rv_at(T0))
    # While the reporters disagree there is no hash to record (seed 000, HA).
    (split,) = plan_detection(discovered=[disc(hash_=A)], states=[], migrations=[], crds=[], now=T0,
                              settings=SETTINGS, reporters=reporters(**{"api-1": A, "api-2": B})).of_kind(CreateState)  # fmt: skip
    assert split.record_switch is None


@pytest.mark.parametrize(("persisted", "restarts"), [([UNKNOWN, A], True), ([B, A], True), ([A], False)])
def test_a_state_recorded_before_resource_versions_waits_for_the_next_migration(
    persisted: list[str], restarts: bool
) -> None:
    """Issue 36: "states or migrations recorded before this change (no resourceVersion): say what you
    do". The safe choice: never the timestamps (a second's doubt is what this fixes). A state that
    still needs its proof records its switch now, and only a migration that lists after it refines it
    (one more pass over the resource); a refined state has nothing to prove and is left as it is."""
    old = state(A, persisted, switch_rv=None)
    done = migration("m", phase="Succeeded", target=A, started=T0 + MIN, finished=T0 + 2 * MIN, rv=None)
    now = T0 + 10 * MIN
    p = plan([disc(hash_=A)], [old], [done], now=now)
    update = the_update(p)
    assert update.persisted == persisted, "never refined by the timestamps"
    assert (update.record_switch == CRONJOBS) == restarts
    if restarts:
        assert update.annotations[SINCE_ANNOTATION] == format_time(now)
        assert "no resourceVersion recorded for the current hash: recorded now" in update.reason
        assert [c.target_hash for c in p.of_kind(CreateMigration)] == [A]
    else:
        assert update.annotations == old.metadata.annotations and not p.creates_migrations
    # The poll after: the migration that began listing after the switch refines it.
    if restarts:
        recorded = state(A, persisted, since=now, switch_rv=rv_at(now), heartbeat=now)
        later = migration("n", phase="Succeeded", target=A, started=now + MIN, finished=now + 2 * MIN)
        assert the_update(plan([disc(hash_=A)], [recorded], [done, later], now=now + 10 * MIN)).persisted == [A]


@pytest.mark.parametrize(
    ("switch", "done", "said"),
    [
        # Never guessed at, never the timestamps instead: no refinement, and the report says why.
        ("v12", migration("m", phase="Succeeded", target=B, started=T0 + MIN),
         "no refinement: the state's resourceVersion 'v12' is not an integer"),
        (rv_at(T0), migration("m", phase="Succeeded", target=B, started=T0 + MIN, rv="x9"),
         "migration m not counted: its list resourceVersion 'x9' is not an integer"),
        (rv_at(T0), migration("m", phase="Succeeded", target=B, started=T0 + MIN, rv=None),
         "migration m not counted: it recorded no list resourceVersion"),
        (rv_at(T0), migration("m", phase="Succeeded", target=B, started=T0 + MIN, rv=rv_at(T0 - MIN)), None),
    ],
)  # fmt: skip
def test_a_resource_version_that_cannot_be_ordered_refines_nothing_and_the_poll_says_why(
    switch: str, done: StorageVersionMigration, said: str | None
) -> None:
    update = the_update(plan([disc(hash_=B)], [state(B, [UNKNOWN, A, B], switch_rv=switch)], [done]))
    assert update.persisted == [UNKNOWN, A, B]
    if said is None:
        assert "not counted" not in update.reason, "one that merely came first is no doubt to report"
    else:
        assert said in update.reason


@pytest.mark.parametrize(
    ("other", "refined"),
    [
        # Issue 36: "a StorageState is refined when one of them Succeeded and started after the storage
        # switch": its status.resourceVersion (where kcm's controller began) later than the switch's.
        (in_tree("k", "Succeeded", rv=str(int(rv_at(T0)) + 1)), True),
        (in_tree("k", "Succeeded", rv=rv_at(T0 + 5 * MIN), by=None), True),
        # It began before the switch was recorded, even within the same second: no proof.
        (in_tree("k", "Succeeded", rv=str(int(rv_at(T0)) - 1)), False),
        (in_tree("k", "Succeeded", rv=None), False),
        (in_tree("k", "Succeeded", rv="abc"), False),
        (in_tree("k", "Failed", rv=rv_at(T0 + MIN)), False),
        (in_tree("k", "Running", rv=rv_at(T0 + MIN)), False),
        (in_tree("k", "Succeeded", rv=rv_at(T0 + MIN), group="apps", resource="deployments"), False),
    ],
)
def test_an_in_tree_migration_that_succeeded_after_the_switch_refines_the_state(
    other: InTreeMigration, refined: bool
) -> None:
    p = plan([disc(hash_=B)], [state(B, [UNKNOWN, A, B], since=T0)], in_tree=[other])
    update = the_update(p)
    assert update.persisted == ([B] if refined else [UNKNOWN, A, B])
    if refined:
        assert update.refined_by == "storageversionmigrations.storagemigration.k8s.io/k"
        assert (
            f"created by {other.created_by}" in update.reason
            if other.created_by
            else "creator unknown" in update.reason
        )
        assert not p.creates_migrations


def test_an_in_tree_success_refines_only_while_the_api_servers_agree_and_trims_the_crd() -> None:
    """As our own migrations: never while the reporters disagree (seed 000, HA); and a custom resource's
    CRD is trimmed by it as by ours (DESIGN 4.3)."""
    done = in_tree("k", "Succeeded", rv=rv_at(T0 + MIN), group="example.com", resource="widgets")
    old = with_reporters(state(WIDGET_V2, [WIDGET_V1, WIDGET_V2], group="example.com", resource="widgets"),
                         ("api-1", WIDGET_V2, T0), ("api-2", WIDGET_V2, T0))  # fmt: skip
    widgets = [disc("widgets", WIDGET_V2, group="example.com", version="v2", kind="Widget")]

    def reports(second: str) -> list[ReporterHash]:
        return [ReporterHash(reporter_id=r, group="example.com", resource="widgets", hash=h)
                for r, h in (("api-1", WIDGET_V2), ("api-2", second))]  # fmt: skip

    split = plan_detection(discovered=widgets, states=[old], migrations=[], crds=[crd()], now=T0 + 10 * MIN,
                           settings=PERIOD, reporters=reports(WIDGET_V1), in_tree=[done])  # fmt: skip
    assert the_update(split).persisted == [WIDGET_V1, WIDGET_V2] and split.of_kind(TrimStoredVersions) == []
    agreed = plan_detection(discovered=widgets, states=[old], migrations=[], crds=[crd()], now=T0 + 10 * MIN,
                            settings=PERIOD, reporters=reports(WIDGET_V2), in_tree=[done])  # fmt: skip
    assert the_update(agreed).persisted == [WIDGET_V2]
    (trim,) = agreed.of_kind(TrimStoredVersions)
    assert trim.stored_versions == ["v2"] and "storagemigration.k8s.io/k" in trim.reason


NOW = T0 + 10 * MIN


@pytest.mark.parametrize(
    ("other", "creates", "said"),
    [
        # Issue 36: "detection does not request a second migration while one of them runs for the same
        # resource (and says so in the poll's report)".
        (in_tree("kubectl-made", "Running"), False, "is running: no request of ours beside it"),
        # Created, not picked up yet (kcm's controller waits for the garbage collector's cache first).
        (in_tree("fresh", "Pending", created=NOW - 5 * MIN), False, "waiting for kube-controller-manager"),
        # Nobody picked it up in two poll periods: the API is served but no controller runs it.
        (in_tree("stuck", "Pending", created=NOW - 21 * MIN), True, "no controller runs it"),
        # Finished ones, and another resource's, hold nothing.
        (in_tree("done", "Failed"), True, None),
        (in_tree("done", "Succeeded", rv=rv_at(T0 - MIN)), True, None),
        (in_tree("other", "Running", group="", resource="configmaps"), True, None),
    ],
)
def test_an_in_tree_migration_that_runs_holds_our_request(
    other: InTreeMigration, creates: bool, said: str | None
) -> None:
    p = plan([disc(hash_=B)], [state(B, [A, B], since=T0, heartbeat=NOW - MIN)], in_tree=[other], now=NOW)
    assert p.creates_migrations == creates
    if said is not None:
        assert said in the_update(p).reason and other.name in the_update(p).reason
    # A resource seen for the first time: its state, and no request beside a running one.
    first = plan([disc(hash_=B)], in_tree=[other], now=NOW)
    assert p.creates_migrations == first.creates_migrations
    if said is not None:
        assert said in first.of_kind(CreateState)[0].reason
