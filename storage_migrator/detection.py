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
- *Refinement guarded by the target hash and by time*: a Succeeded migration
  makes ``persisted == [current]`` only if it migrated to the current hash
  (``status.targetStorageVersionHash``) and started after the current hash was
  recorded (``current-hash-since``), so an old migration to A never refines a
  state after A -> B -> A.
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
:func:`storage_migrator.reporters.record_reports` (merge, heartbeats, removal
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
period"; the walkthrough table is replayed as a test (tests/unit/test_walkthrough.py).
A change of the agreed hash still waits for the settle delay.

Times in annotations are RFC 3339 with second precision (``metav1.Time``'s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.crds import CrdObservation, storage_version_hash
from storage_migrator.detection_plan import (
    PLANNER_REQUESTERS,
    Action,
    CreateMigration,
    CreateState,
    DeleteMigration,
    DetectionPlan,
    TrimStoredVersions,
    UpdateState,
)
from storage_migrator.dispatch import finished_at, is_finished, migration_resource
from storage_migrator.kube.discovery import DiscoveredResource
from storage_migrator.models import (
    CONDITION_FAILED,
    CONDITION_SUCCEEDED,
    UNKNOWN,
    StorageState,
    StorageVersionMigration,
    as_utc,
    format_time,
    is_condition_true,
    storage_state_name,
)
from storage_migrator.reporters import DISCOVERY_REPORTER, ReporterHash, ReporterRound, record_reports
from storage_migrator.tracking import track_storage

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

#: Label on the migrations detection creates; its value is :data:`DETECTION_LABEL_VALUE`.
DETECTION_LABEL: Final = "migration.k8s.io/requested-by"
DETECTION_LABEL_VALUE: Final = "detection"
#: StorageState annotation: when status.currentStorageVersionHash was set (RFC 3339).
SINCE_ANNOTATION: Final = "migration.k8s.io/current-hash-since"
#: StorageState annotation: no migration is requested before this time (RFC 3339), after a change.
SETTLE_ANNOTATION: Final = "migration.k8s.io/settle-until"


def parse_time(text: str | None) -> datetime | None:
    """An aware UTC datetime from RFC 3339 text; None when absent or unreadable."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


class DetectionSettings(BaseModel):
    """The knobs of one detection poll (from :class:`storage_migrator.settings.Settings`)."""

    model_config = ConfigDict(frozen=True)

    settle_seconds: float = Field(
        ge=0,
        description=(
            "Seconds after a hash change before a migration is requested (seed 004's "
            "loose guarantee, about a minute); 0 requests it in the same poll."
        ),
    )
    stale_after_seconds: float = Field(
        gt=0,
        description="A heartbeat older than this (seconds) makes a StorageState stale: two poll periods (DESIGN 4.3).",
    )
    poll_seconds: float = Field(
        default=600,
        gt=0,
        description=(
            "Period of the detection poll in seconds. Default 600 (seed 000: every 10 "
            "minutes). A reporter not heard within one period blocks new migrations; one "
            "silent for more than three periods is removed (seed 000, HA)."
        ),
    )
    retry_base_seconds: float = Field(
        default=600,
        gt=0,
        description="Wait after the first failed migration before the next request, in seconds. Default 600.",
    )
    retry_max_seconds: float = Field(
        default=86400,
        gt=0,
        description="Upper bound of the wait between requests after failures, in seconds. Default a day.",
    )


def retry_delay_seconds(failures: int, *, base: float, maximum: float) -> float:
    """Wait after the ``failures``-th failed attempt: base, 2 base, 4 base ... capped at ``maximum``."""
    if failures <= 0:
        return 0.0
    # Cap the exponent: 2**60 base already exceeds any sane maximum.
    return float(min(base * 2 ** min(failures - 1, 60), maximum))


def _is_detection_migration(migration: StorageVersionMigration) -> bool:
    return (migration.metadata.labels or {}).get(DETECTION_LABEL) in PLANNER_REQUESTERS


def _proves(migration: StorageVersionMigration, *, current: str, since: datetime | None) -> bool:
    """Whether this migration rewrote every object to ``current`` after ``current`` was recorded."""
    started = migration.status.started_at
    return (
        since is not None
        and started is not None
        and started >= since
        and migration.status.target_storage_version_hash == current
    )


def _retry_allowed_at(
    migrations: Sequence[StorageVersionMigration],
    *,
    current: str,
    since: datetime | None,
    settings: DetectionSettings,
) -> tuple[datetime | None, int]:
    """When detection may request again after its failed attempts at ``current`` since ``since``."""
    failed = [
        m
        for m in migrations
        if _is_detection_migration(m)
        and is_condition_true(m.status.conditions, CONDITION_FAILED)
        and _proves(m, current=current, since=since)
    ]
    if not failed:
        return None, 0
    ends = [t for t in (finished_at(m) or m.status.started_at for m in failed) if t is not None]
    if not ends:
        return None, len(failed)
    delay = retry_delay_seconds(len(failed), base=settings.retry_base_seconds, maximum=settings.retry_max_seconds)
    return max(ends) + timedelta(seconds=delay), len(failed)


@dataclass(frozen=True)
class _Observed:
    """What one poll saw of one tracked resource."""

    entry: DiscoveredResource
    name: str
    state: StorageState | None
    migrations: list[StorageVersionMigration]
    crd: CrdObservation | None
    reports: list[tuple[str, str]]

    @property
    def pending(self) -> list[StorageVersionMigration]:
        return [m for m in self.migrations if not is_finished(m)]


@dataclass
class _Draft:
    """The new status of one StorageState, built step by step (see :func:`_plan_existing`)."""

    previous: str | None
    current: str
    persisted: list[str]
    annotations: dict[str, str]
    since: datetime | None
    settle_until: datetime | None
    reasons: list[str] = field(default_factory=list)
    refined_by: str | None = None

    def start_clock(self, now: datetime) -> None:
        """The current hash is recorded from now on (SINCE_ANNOTATION)."""
        self.since = now
        self.annotations[SINCE_ANNOTATION] = format_time(now)


def plan_detection(
    *,
    discovered: Sequence[DiscoveredResource],
    states: Sequence[StorageState],
    migrations: Sequence[StorageVersionMigration],
    crds: Sequence[CrdObservation],
    now: datetime,
    settings: DetectionSettings,
    reporters: Sequence[ReporterHash] = (),
) -> DetectionPlan:
    """The actions of one poll of seed 000's triggering controller.

    One tracked resource per storage (:func:`storage_migrator.tracking.track_storage`).
    ``reporters`` are this poll's per-API-server hashes (seed 000, HA); a
    tracked resource none of them names has one reporter,
    :data:`~storage_migrator.reporters.DISCOVERY_REPORTER`, showing the hash
    of ``discovered``: the single-server case, through the same rules.
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
            reason="no StorageState: created with persisted [Unknown] (seed 000)"
            + ("" if reporters.agreed else f"; reporters disagree ({_describe(reporters)})"),
        )
    ]
    if reporters.agreed and not observed.pending:
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
    draft = _draft_of(state, reporters, fallback=observed.entry.storage_version_hash)
    changed = reporters.agreed is not None and reporters.agreed != draft.previous
    deletions = _cancellations(observed, draft, reporters, changed=changed)
    _record_hashes(draft, state, reporters, now=now, settings=settings, changed=changed)
    if changed:
        _settle(draft, now=now, settings=settings)
    if reporters.disagree:
        _forget_since(draft, reporters)
    proof = _refine(draft, observed.migrations, reporters)
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
    )
    actions: list[Action] = [*deletions, update]
    trim = _trim(observed, draft.current, proof)
    if trim is not None:
        actions.append(trim)
    request = _request(observed, draft, reporters, deleted={d.name for d in deletions}, now=now, settings=settings)
    if request is not None:
        actions.append(request)
    return actions


def _draft_of(state: StorageState, reporters: ReporterRound, *, fallback: str) -> _Draft:
    """The status as read; ``current`` already the agreed hash, or kept while there is none."""
    status = state.status
    annotations = dict(state.metadata.annotations or {})
    previous = status.current_storage_version_hash
    return _Draft(
        previous=previous,
        # Seed 000 HA: the hash moves only on agreement; status.currentStorageVersionHash
        # (the non-HA field, for tooling) keeps the last agreed hash meanwhile.
        current=reporters.agreed or previous or fallback,
        persisted=list(status.persisted_storage_version_hashes),
        annotations=annotations,
        since=parse_time(annotations.get(SINCE_ANNOTATION)),
        settle_until=parse_time(annotations.get(SETTLE_ANNOTATION)),
    )


def _cancellations(
    observed: _Observed, draft: _Draft, reporters: ReporterRound, *, changed: bool
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
        reason = f"API servers disagree on the storage version hash ({_describe(reporters)})"
    else:
        return []
    return [
        DeleteMigration(name=m.metadata.name, uid=m.metadata.uid, reason=reason)
        for m in observed.pending
        if _is_detection_migration(m) and m.metadata.name
    ]


def _record_hashes(
    draft: _Draft,
    state: StorageState,
    reporters: ReporterRound,
    *,
    now: datetime,
    settings: DetectionSettings,
    changed: bool,
) -> None:
    """Persisted hashes and SINCE: stale reset, change, or heartbeat; then every hash seen joins."""
    heartbeat = state.status.last_heartbeat_time
    stale = heartbeat is None or (now - heartbeat).total_seconds() > settings.stale_after_seconds
    if stale or not draft.persisted or draft.previous is None:
        # Seed 000: "if the timestamp is more than 10 minutes old, it recreates
        # storageState object with persistedStorageVersionHashes set to ["Unknown"]"
        # (two poll periods here, DESIGN 4.3). A state without a heartbeat, a current
        # hash or a persisted list is as untrustworthy. "Unknown" covers every hash seen.
        draft.persisted = [UNKNOWN]
        draft.start_clock(now)
        if stale:
            age = "no heartbeat" if heartbeat is None else f"heartbeat {format_time(heartbeat)}"
            draft.reasons.append(
                f"stale ({age}, older than {settings.stale_after_seconds:g}s): persisted reset to [Unknown]"
            )
        else:
            draft.reasons.append("incomplete status: persisted reset to [Unknown]")
        return
    if changed:
        # Seed 000: "as a single operation, updates the status.lastHeartbeatTime, sets
        # storageState.status.currentStorageVersionHash to the value shown in the
        # discovery document, and appends the hash to the
        # storageState.status.persistedStorageVersionHashes" (appended below).
        draft.start_clock(now)
        draft.reasons.append(f"storage version hash changed from {draft.previous} to {draft.current}")
    else:
        # Seed 000: "If they are the same, the controller simply updates the
        # status.lastHeartbeatTime and is done."
        draft.reasons.append("heartbeat")
        if draft.since is None and reporters.agreed is not None:
            # Without the time the hash was recorded (or agreed on again, see
            # _forget_since) no migration can prove it rewrote everything to it;
            # start the clock now (a new migration follows).
            draft.start_clock(now)
            draft.reasons.append(f"no {SINCE_ANNOTATION} annotation: set to now")
    # Seed 000 HA: every reporter "adds the storage version hash to
    # PersistedStorageVersionHashes if the local storage version hash is not present
    # there yet". A hash already recorded as current is covered by "Unknown" (a fresh
    # ["Unknown"] stays as it is, as in the single-server rule).
    for hash_ in reporters.seen:
        covered = UNKNOWN in draft.persisted and hash_ == draft.previous
        if hash_ not in draft.persisted and not covered:
            draft.persisted.append(hash_)
    # The current hash is always covered by the persisted ones (objects written from
    # now on are encoded in it); "Unknown" covers every version.
    if draft.current not in draft.persisted and UNKNOWN not in draft.persisted:
        draft.persisted.append(draft.current)


def _settle(draft: _Draft, *, now: datetime, settings: DetectionSettings) -> None:
    """Seed 004's loose guarantee: after a change of the agreed hash, wait before migrating."""
    if settings.settle_seconds > 0:
        draft.settle_until = now + timedelta(seconds=settings.settle_seconds)
        draft.annotations[SETTLE_ANNOTATION] = format_time(draft.settle_until)
    else:
        draft.settle_until = None
        draft.annotations.pop(SETTLE_ANNOTATION, None)


def _forget_since(draft: _Draft, reporters: ReporterRound) -> None:
    """While API servers disagree, no migration can prove anything: drop SINCE.

    Objects may be written in any of the reported versions until they agree
    again, so the clock restarts at the first poll that sees agreement (the
    "no SINCE" rule of :func:`_record_hashes`): a migration that ran during the
    disagreement (seed 000's walkthrough: started at 20, server 3 rolled back at
    22) never refines the state.
    """
    draft.since = None
    draft.annotations.pop(SINCE_ANNOTATION, None)
    draft.reasons.append(f"API servers disagree ({_describe(reporters)}): current hash kept, no migration")


def _refine(
    draft: _Draft, migrations: list[StorageVersionMigration], reporters: ReporterRound
) -> StorageVersionMigration | None:
    """Refinement: the Succeeded migration that makes persisted ``[current]``, if any.

    Seed 000: "If a migration completes, the controller finds the storageState of
    that resource, updates its status.persistedStorageVersionHashes to equal its
    status.currentStorageVersionHash" -- only while the API servers agree, and
    only a Succeeded migration to the current hash that started after the hash
    was recorded (DESIGN 4.3).
    """
    if reporters.agreed is None:
        return None
    current = draft.current
    proof = next(
        (
            m
            for m in reversed(migrations)
            if is_condition_true(m.status.conditions, CONDITION_SUCCEEDED)
            and _proves(m, current=current, since=draft.since)
        ),
        None,
    )
    if proof is not None and draft.persisted != [current]:
        draft.persisted = [current]
        draft.refined_by = proof.metadata.name
        draft.reasons.append(f"refined: migration {proof.metadata.name} succeeded to {current}")
    return proof


def _trim(observed: _Observed, current: str, proof: StorageVersionMigration | None) -> TrimStoredVersions | None:
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
        reason=f"every {observed.name} is stored in {crd.storage_version} (migration {proof.metadata.name})",
    )


def _request(
    observed: _Observed,
    draft: _Draft,
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
    see the module docstring); then the settle delay, no other pending request,
    and the back-off after failures.
    """
    current = draft.current
    if reporters.agreed is None or draft.persisted == [current]:
        return None
    if draft.settle_until is not None and now < draft.settle_until:
        return None
    if any(m.metadata.name not in deleted for m in observed.pending):
        return None
    allowed_at, failures = _retry_allowed_at(observed.migrations, current=current, since=draft.since, settings=settings)
    if allowed_at is not None and now < allowed_at:
        return None
    why = f"persisted {draft.persisted} is not [{current}]"
    if failures:
        why += f"; retry after {failures} failed attempt(s)"
    return _create_migration(observed.entry, current, why)


def _describe(reporters: ReporterRound) -> str:
    """``api-1=hashA, api-2=hashB (late: api-3)`` for a reason text."""
    text = ", ".join(f"{e.reporter_id}={e.current_storage_version_hash}" for e in reporters.entries)
    return text + (f" (late: {', '.join(reporters.late)})" if reporters.late else "")


def _create_migration(entry: DiscoveredResource, target: str, reason: str) -> CreateMigration:
    return CreateMigration(
        group=entry.group,
        version=entry.version,
        resource=entry.resource,
        target_hash=target,
        reason=reason,
    )
