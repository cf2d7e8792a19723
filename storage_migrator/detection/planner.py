"""What one poll of the storage migration triggering controller does (seed 000, DESIGN 4.3).

Design decision: the decision is a pure function of what one poll observes
(discovery, StorageStates, StorageVersionMigrations, CRDs) and the clock, so
every rule of seed 000's "Storage migration triggering controller" is a table
test and the flow only reads, plans and applies. The plan is a list of typed
actions; each StorageState gets at most one write per poll ("as a single
operation, updates the status.lastHeartbeatTime, sets ...currentStorageVersionHash
... and appends the hash to ...persistedStorageVersionHashes").

Our refinements of the seed, each one named where it is applied:

- *Settle delay* (seed 004's loose guarantee: API servers take about a minute
  to agree): after a hash change the migration is requested only once
  ``settle-until`` has passed, on a later poll.
- *Refinement guarded by the target hash and by causal order* (issue 36): a
  Succeeded migration makes ``persisted == [current]`` only if it migrated to the
  current hash (``status.targetStorageVersionHash``) and its first LIST came after
  the current hash was recorded, by resourceVersion (``status.resourceVersion``
  against the state's ``status.currentHashResourceVersion``; ordering.py), so an
  old migration to A never refines a state after A -> B -> A, nor one that began a
  second before the switch was recorded.
- *In-tree migrations by anyone* (issue 36): a ``storagemigration.k8s.io`` object
  that succeeded refines a state by the same order; while one runs for a resource,
  detection requests nothing for it (in_tree.py).
- *Staleness* is judged against two poll periods, not the seed's literal 10
  minutes (DESIGN 4.3).
- *Retries* of a failed migration back off (10 min, 20, 40 ... capped at a
  day) instead of being re-requested every poll; a hash change resets them.
- On a hash change we delete only the pending migrations our polls created (label
  ``requested-by`` in :data:`PLANNER_REQUESTERS`). Seed 000 says "stops any ongoing
  migration ... by deleting existing storageVersionMigrations", but requests made by
  others (``kubectl``, seed 003's key-rotation requests) are waited on by name by
  whoever made them; deleting them would make those callers wait forever. They are
  harmless to keep: they migrate to whatever the storage version is when they run,
  and refinement only trusts a migration whose target hash is the current one.

HA (seed 000, "Extended API proposal for HA cluster"; DESIGN 4.4). Each
resource has reporters, one per API server (``reporters``; without any, one
reporter showing the hash of ``discovered``: the single-server case is the
one-reporter case of the same rules, not a second code path). Their list,
``status.currentStorageVersionHashes``, is kept by
:func:`storage_migrator.agreement.reporters.record_reports` (merge, heartbeats, removal
after 3 silent periods). Then:

- every hash a reporter shows joins ``persistedStorageVersionHashes`` at once;
- the reporters *agree* when every entry was heard within one poll period and
  all hashes are identical; ``status.currentStorageVersionHash`` (the non-HA
  field, kept for tooling) is the agreed hash, and keeps its previous value
  while they do not agree. A change of the agreed hash is a "change" as above;
- as soon as the hashes differ, detection's unfinished migrations are deleted
  and ``current-hash-since`` is dropped: no migration that ran while they
  differed can refine the state; the clock restarts at the first poll that
  sees agreement again;
- a migration is requested only while they agree (and persisted holds
  ``Unknown`` or more than one hash); refinement happens only while they agree.

Where we depart from the seed's letter: it asks that the hashes "have been
identical in the past two polls" before a migration starts, yet its own case
walkthrough starts one at minute 20 right after minute 10's ``v2, v1, v1``, and
again at 40 right after 30's ``v2, v2, v1``. The seed has one controller per
API server, each polling on its own clock, so "two polls" there means "every
reporter has reported since the change" ("to give newly deployed triggering
controller a chance to report the hash"). One poll here reads every reporter
at once, so the rule is "identical in this poll, every entry heard within one
period"; the walkthrough table is replayed as a test (tests/unit/detection/test_walkthrough.py).
A change of the agreed hash still waits for the settle delay.

Times in annotations are RFC 3339 with second precision (``metav1.Time``'s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from storage_migrator.agreement.reporters import DISCOVERY_REPORTER, ReporterHash, ReporterRound, record_reports
from storage_migrator.detection.actions import (
    Action,
    CreateMigration,
    CreateState,
    DeleteMigration,
    DetectionPlan,
    TrimStoredVersions,
    UpdateState,
)
from storage_migrator.detection.in_tree import hold_reason, holding, not_picked_up
from storage_migrator.detection.rules import (
    DETECTION_LABEL,
    DETECTION_LABEL_VALUE,
    SETTLE_ANNOTATION,
    SINCE_ANNOTATION,
    DetectionSettings,
    describe,
    is_detection_migration,
    parse_time,
    retry_allowed_at,
    retry_delay_seconds,
)
from storage_migrator.detection.status_draft import (
    Proof,
    StatusDraft,
    draft_of,
    forget_since,
    record_hashes,
    refine,
    settle,
)
from storage_migrator.detection.tracking import track_storage
from storage_migrator.kube.crds import CrdObservation, storage_version_hash
from storage_migrator.kube.discovery import DiscoveredResource
from storage_migrator.kube.in_tree import InTreeMigration
from storage_migrator.migration.dispatch import is_finished, migration_resource
from storage_migrator.models import (
    UNKNOWN,
    GroupVersionResource,
    StorageState,
    StorageVersionMigration,
    as_utc,
    format_time,
    storage_state_name,
)

__all__ = [
    "DETECTION_LABEL",
    "DETECTION_LABEL_VALUE",
    "DISCOVERY_REPORTER",
    "SETTLE_ANNOTATION",
    "SINCE_ANNOTATION",
    "Action",
    "CrdObservation",
    "CreateMigration",
    "CreateState",
    "DeleteMigration",
    "DetectionPlan",
    "DetectionSettings",
    "ReporterHash",
    "TrimStoredVersions",
    "UpdateState",
    "format_time",
    "parse_time",
    "plan_detection",
    "retry_delay_seconds",
    "storage_version_hash",
]


@dataclass(frozen=True)
class _Observed:
    """What one poll saw of one tracked resource."""

    entry: DiscoveredResource
    name: str
    state: StorageState | None
    migrations: list[StorageVersionMigration]
    crd: CrdObservation | None
    reports: list[tuple[str, str]]
    in_tree: list[InTreeMigration]

    @property
    def pending(self) -> list[StorageVersionMigration]:
        return [m for m in self.migrations if not is_finished(m)]

    @property
    def ref(self) -> GroupVersionResource:
        """The resource to LIST for its resourceVersion when a hash is recorded (issue 36)."""
        return GroupVersionResource(group=self.entry.group, version=self.entry.version, resource=self.entry.resource)

    def in_tree_hold(self, *, now: datetime, settings: DetectionSettings) -> tuple[InTreeMigration | None, list[str]]:
        """The in-tree migration that holds our requests, and what the report says of those that do not."""
        held, stuck = holding(self.in_tree, now=now, pickup_seconds=settings.stale_after_seconds)
        return held, [not_picked_up(m, pickup_seconds=settings.stale_after_seconds) for m in stuck]


def plan_detection(
    *,
    discovered: Sequence[DiscoveredResource],
    states: Sequence[StorageState],
    migrations: Sequence[StorageVersionMigration],
    crds: Sequence[CrdObservation],
    now: datetime,
    settings: DetectionSettings,
    reporters: Sequence[ReporterHash] = (),
    in_tree: Sequence[InTreeMigration] = (),
) -> DetectionPlan:
    """The actions of one poll of seed 000's triggering controller.

    One tracked resource per storage (:func:`storage_migrator.detection.tracking.track_storage`).
    ``reporters`` are this poll's per-API-server hashes (seed 000, HA); a
    tracked resource none of them names has one reporter,
    :data:`~storage_migrator.agreement.reporters.DISCOVERY_REPORTER`, showing the hash
    of ``discovered``: the single-server case, through the same rules.
    ``in_tree`` are the ``storagemigration.k8s.io`` objects anyone made (issue 36).
    StorageStates whose resource is not in ``discovered`` are left alone (no
    action): the resource may be served again later (a CRD being re-created, an
    aggregated API server down, a partial discovery poll), and its state still
    tells the truth about what is stored; an operator deletes it to forget it.
    """
    now = as_utc(now)
    tracking = track_storage(discovered)
    by_name = {s.metadata.name: s for s in states if s.metadata.name}
    crds_by_resource = {(c.group, c.plural): c for c in crds}
    migrations_of: dict[str, list[StorageVersionMigration]] = {}
    for migration in sorted(migrations, key=lambda m: m.metadata.name or ""):
        migrations_of.setdefault(migration_resource(migration), []).append(migration)
    in_tree_of: dict[str, list[InTreeMigration]] = {}
    for other in sorted(in_tree, key=lambda m: m.name):
        in_tree_of.setdefault(other.group_resource, []).append(other)
    reports_of: dict[str, list[tuple[str, str]]] = {}
    for report in reporters:
        reports_of.setdefault(report.group_resource, []).append((report.reporter_id, report.hash))

    actions: list[Action] = []
    for entry in tracking.kept:
        name = storage_state_name(entry.group, entry.resource)
        # Every name of the storage counts (events and events.events.k8s.io are one storage).
        aliases = tracking.sharers.get(name, [name])
        reports = [r for alias in aliases for r in reports_of.get(alias, [])]
        observed = _Observed(
            entry=entry,
            name=name,
            state=by_name.get(name),
            migrations=[m for alias in aliases for m in migrations_of.get(alias, [])],
            crd=crds_by_resource.get((entry.group, entry.resource)),
            reports=reports or [(DISCOVERY_REPORTER, entry.storage_version_hash)],
            in_tree=[m for alias in aliases for m in in_tree_of.get(alias, [])],
        )
        if observed.state is None:
            actions.extend(_plan_new(observed, now=now, settings=settings))
        else:
            actions.extend(_plan_existing(observed, observed.state, now=now, settings=settings))
    return DetectionPlan(actions=actions, skipped=tracking.skipped_resources())


def _plan_new(observed: _Observed, *, now: datetime, settings: DetectionSettings) -> list[Action]:
    """Seed 000: "if the storageState doesn't exist for the resource, the controller ...

    creates a new storageVersionMigration for this resource, creates the
    storageState for the resource, setting .status.persistedStorageVersionHashes
    to ["Unknown"], and setting status.currentStorageVersionHash to the value
    shown in the discovery document." A pending migration already requested (by
    anyone) is kept instead of a second one: seed 003 runs them serially. While
    the reporters disagree there is no current hash to migrate to: the state
    records the discovery document's hash and waits (no SINCE, no request).
    """
    entry = observed.entry
    reporters = record_reports([], observed.reports, now=now, poll_seconds=settings.poll_seconds)
    held, notes = observed.in_tree_hold(now=now, settings=settings)
    reasons = ["no StorageState: created with persisted [Unknown] (seed 000)"]
    if not reporters.agreed:
        reasons.append(f"reporters disagree ({describe(reporters)})")
    elif held is not None:
        reasons.append(hold_reason(held))
    actions: list[Action] = [
        CreateState(
            name=observed.name,
            group=entry.group,
            resource=entry.resource,
            current_hash=reporters.agreed or entry.storage_version_hash,
            persisted=[UNKNOWN],
            heartbeat=now,
            annotations={SINCE_ANNOTATION: format_time(now)} if reporters.agreed else {},
            current_hashes=reporters.entries,
            record_switch=observed.ref if reporters.agreed else None,
            reason="; ".join(reasons + notes),
        )
    ]
    if reporters.agreed and not observed.pending and held is None:
        actions.append(
            _create_migration(entry, reporters.agreed, "new StorageState: migrate to learn what is stored (seed 000)")
        )
    return actions


def _plan_existing(
    observed: _Observed, state: StorageState, *, now: datetime, settings: DetectionSettings
) -> list[Action]:
    """One poll of a tracked resource that has a StorageState: deletions, the update, a trim, a request."""
    reporters = record_reports(
        state.status.current_storage_version_hashes, observed.reports, now=now, poll_seconds=settings.poll_seconds
    )
    draft = draft_of(state, reporters, fallback=observed.entry.storage_version_hash)
    changed = reporters.agreed is not None and reporters.agreed != draft.previous
    deletions = _cancellations(observed, draft, reporters, changed=changed)
    record_hashes(draft, state, reporters, now=now, settings=settings, changed=changed)
    if changed:
        settle(draft, now=now, settings=settings)
    if reporters.disagree:
        forget_since(draft, reporters)
    proof = refine(draft, observed.migrations, reporters, observed.in_tree)
    request = _request(observed, draft, reporters, deleted={d.name for d in deletions}, now=now, settings=settings)
    update = UpdateState(
        name=observed.name,
        resource_version=state.metadata.resource_version or "",
        current_hash=draft.current,
        persisted=draft.persisted,
        heartbeat=now,
        annotations=draft.annotations,
        current_hashes=reporters.entries,
        reason="; ".join(draft.reasons),
        refined_by=draft.refined_by,
        switch_resource_version=draft.switch_rv,
        record_switch=observed.ref if draft.record_switch else None,
    )
    actions: list[Action] = [*deletions, update]
    trim = _trim(observed, draft.current, proof)
    if trim is not None:
        actions.append(trim)
    if request is not None:
        actions.append(request)
    return actions


def _cancellations(
    observed: _Observed, draft: StatusDraft, reporters: ReporterRound, *, changed: bool
) -> list[DeleteMigration]:
    """Detection's unfinished migrations to delete: on a change of the agreed hash, or on disagreement.

    Seed 000: "stops any ongoing migration of this resource by deleting existing
    storageVersionMigrations" (on a change), and for HA the leader "deletes
    pending storageVersionMigration objects to cancel any ongoing migration, once
    the hashes in currentStorageVersionHashes stop being identical" -- only
    ours; see the module docstring.
    """
    if changed:
        reason = f"storage version hash changed from {draft.previous} to {draft.current}"
    elif reporters.disagree:
        reason = f"API servers disagree on the storage version hash ({describe(reporters)})"
    else:
        return []
    return [
        DeleteMigration(name=m.metadata.name, uid=m.metadata.uid, reason=reason)
        for m in observed.pending
        if is_detection_migration(m) and m.metadata.name
    ]


def _trim(observed: _Observed, current: str, proof: Proof | None) -> TrimStoredVersions | None:
    """DESIGN 4.3: for custom resources, refinement also trims the CRD's status.storedVersions.

    So the old version can be removed from the CRD; never when the CRD's storage
    version no longer hashes to the current one (edited meanwhile: discovery has
    not caught up).
    """
    crd = observed.crd
    if proof is None or crd is None or crd.storage_version_hash != current:
        return None
    if crd.stored_versions == [crd.storage_version]:
        return None
    return TrimStoredVersions(
        crd_name=crd.name,
        stored_versions=[crd.storage_version],
        resource_version=crd.resource_version,
        reason=f"every {observed.name} is stored in {crd.storage_version} (migration {proof.name})",
    )


def _request(
    observed: _Observed,
    draft: StatusDraft,
    reporters: ReporterRound,
    *,
    deleted: set[str | None],
    now: datetime,
    settings: DetectionSettings,
) -> CreateMigration | None:
    """The migration to request, if any (seed 000 HA's three conditions, and our refinements).

    Seed 000: "persistedStorageVersionHashes has "Unknown" or has more than one
    version, AND the lastHeartbeatTime in all items of the
    CurrentStorageVersionHashes are no older than 1 polling period (10 mins) AND
    the hashes in currentStorageVersionHashes have been identical" (in this poll:
    see the module docstring); then the settle delay, no other pending request
    (ours, anyone's, or an in-tree one running: issue 36, said in the report),
    and the back-off after failures.
    """
    current = draft.current
    if reporters.agreed is None or draft.persisted == [current]:
        return None
    if draft.settle_until is not None and now < draft.settle_until:
        return None
    if any(m.metadata.name not in deleted for m in observed.pending):
        return None
    held, notes = observed.in_tree_hold(now=now, settings=settings)
    draft.reasons.extend(notes)
    if held is not None:
        draft.reasons.append(hold_reason(held))
        return None
    allowed_at, failures = retry_allowed_at(observed.migrations, current=current, since=draft.since, settings=settings)
    if allowed_at is not None and now < allowed_at:
        return None
    why = f"persisted {draft.persisted} is not [{current}]"
    if failures:
        why += f"; retry after {failures} failed attempt(s)"
    return _create_migration(observed.entry, current, why)


def _create_migration(entry: DiscoveredResource, target: str, reason: str) -> CreateMigration:
    return CreateMigration(
        group=entry.group,
        version=entry.version,
        resource=entry.resource,
        target_hash=target,
        reason=reason,
    )
