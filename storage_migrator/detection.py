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
- On a hash change we delete only the pending migrations that detection
  created (label ``migration.k8s.io/requested-by=detection``). Seed 000 says
  "stops any ongoing migration ... by deleting existing storageVersionMigrations",
  but requests made by others (``kubectl``, seed 003's key-rotation requests)
  are waited on by name by whoever made them; deleting them would make those
  callers wait forever. They are harmless to keep: they migrate to whatever the
  storage version is when they run, and refinement only trusts a migration
  whose target hash is the current one.

Times in annotations are RFC 3339 with second precision (``metav1.Time``'s).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.crds import CrdObservation, storage_version_hash
from storage_migrator.dispatch import is_finished, migration_resource
from storage_migrator.kube.discovery import DiscoveredResource
from storage_migrator.models import (
    CONDITION_FAILED,
    CONDITION_SUCCEEDED,
    UNKNOWN,
    StorageState,
    StorageVersionMigration,
    as_utc,
    format_time,
    get_condition,
    is_condition_true,
    storage_state_name,
)
from storage_migrator.tracking import SkippedResource, track_storage

__all__ = [
    "DETECTION_LABEL",
    "DETECTION_LABEL_VALUE",
    "SETTLE_ANNOTATION",
    "SINCE_ANNOTATION",
    "Action",
    "CrdObservation",
    "CreateMigration",
    "CreateState",
    "DeleteMigration",
    "DetectionPlan",
    "DetectionSettings",
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


class _Action(BaseModel):
    model_config = ConfigDict(frozen=True)

    reason: str = Field(description="Why, for a person to read (the seed rule that applies).")


class CreateState(_Action):
    """Create the StorageState of a resource seen for the first time (seed 000)."""

    kind: Literal["CreateState"] = "CreateState"
    name: str = Field(description="metadata.name: ``<resource>.<group>`` or ``<resource>`` for core.")
    group: str
    resource: str
    current_hash: str = Field(description="status.currentStorageVersionHash.")
    persisted: list[str] = Field(description="status.persistedStorageVersionHashes.")
    heartbeat: datetime = Field(description="status.lastHeartbeatTime.")
    annotations: dict[str, str] = Field(description="metadata.annotations of the new object.")


class UpdateState(_Action):
    """The whole new status of interest of one StorageState, as one update guarded by its resourceVersion.

    ``annotations`` is the complete ``metadata.annotations`` to write (the
    object's other annotations are carried over; a detection annotation missing
    from it is to be removed).
    """

    kind: Literal["UpdateState"] = "UpdateState"
    name: str
    resource_version: str = Field(description="metadata.resourceVersion of the object read (CAS); '' if it had none.")
    current_hash: str
    persisted: list[str]
    heartbeat: datetime
    annotations: dict[str, str]


class DeleteMigration(_Action):
    """Delete a pending migration detection created for a hash that is no longer current (seed 000)."""

    kind: Literal["DeleteMigration"] = "DeleteMigration"
    name: str
    uid: str | None = Field(description="metadata.uid: precondition of the delete, so a same-named successor survives.")


class CreateMigration(_Action):
    """Request a migration of a resource to its current storage version (label DETECTION_LABEL=detection)."""

    kind: Literal["CreateMigration"] = "CreateMigration"
    group: str
    version: str = Field(description="The preferred version from discovery: the endpoint the migration uses.")
    resource: str
    target_hash: str = Field(description="The current hash this migration is meant to reach.")

    @property
    def group_resource(self) -> str:
        """``<resource>.<group>`` or ``<resource>`` for core."""
        return storage_state_name(self.group, self.resource)


class TrimStoredVersions(_Action):
    """Set a CRD's status.storedVersions to its storage version, guarded by the resourceVersion read."""

    kind: Literal["TrimStoredVersions"] = "TrimStoredVersions"
    crd_name: str
    stored_versions: list[str]
    resource_version: str


_A = TypeVar("_A", bound=_Action)

Action = Annotated[
    CreateState | UpdateState | DeleteMigration | CreateMigration | TrimStoredVersions,
    Field(discriminator="kind"),
]


class DetectionPlan(BaseModel):
    """What one poll does: the actions, in order, and the resources it does not track."""

    model_config = ConfigDict(frozen=True)

    actions: list[Action] = Field(
        default_factory=list,
        description=(
            "Per resource (sorted by group, resource): deletions first, then the state "
            "write, then a CRD trim, then a migration request."
        ),
    )
    skipped: list[SkippedResource] = Field(default_factory=list, description="Resources not tracked, and why.")

    @property
    def creates_migrations(self) -> bool:
        """Whether the poll requests any migration (then run-migrations should be started)."""
        return any(isinstance(a, CreateMigration) for a in self.actions)

    def of_kind(self, kind: type[_A]) -> list[_A]:
        """The actions of one class, in plan order."""
        return [a for a in self.actions if isinstance(a, kind)]


def retry_delay_seconds(failures: int, *, base: float, maximum: float) -> float:
    """Wait after the ``failures``-th failed attempt: base, 2 base, 4 base ... capped at ``maximum``."""
    if failures <= 0:
        return 0.0
    # Cap the exponent: 2**60 base already exceeds any sane maximum.
    return float(min(base * 2 ** min(failures - 1, 60), maximum))


def _is_detection_migration(migration: StorageVersionMigration) -> bool:
    return (migration.metadata.labels or {}).get(DETECTION_LABEL) == DETECTION_LABEL_VALUE


def _finished_at(migration: StorageVersionMigration) -> datetime | None:
    """When a migration ended: status.finishedAt, else the terminal condition's time."""
    if migration.status.finished_at is not None:
        return migration.status.finished_at
    for condition_type in (CONDITION_SUCCEEDED, CONDITION_FAILED):
        condition = get_condition(migration.status.conditions, condition_type)
        if condition is not None and condition.status == "True" and condition.last_update_time is not None:
            return condition.last_update_time
    return migration.status.started_at


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
    ends = [t for t in (_finished_at(m) for m in failed) if t is not None]
    if not ends:
        return None, len(failed)
    delay = retry_delay_seconds(len(failed), base=settings.retry_base_seconds, maximum=settings.retry_max_seconds)
    return max(ends) + timedelta(seconds=delay), len(failed)


def _state_view(state: StorageState) -> tuple[str | None, list[str], datetime | None, dict[str, str]]:
    status = state.status
    return (
        status.current_storage_version_hash,
        list(status.persisted_storage_version_hashes),
        status.last_heartbeat_time,
        dict(state.metadata.annotations or {}),
    )


def plan_detection(
    *,
    discovered: Sequence[DiscoveredResource],
    states: Sequence[StorageState],
    migrations: Sequence[StorageVersionMigration],
    crds: Sequence[CrdObservation],
    now: datetime,
    settings: DetectionSettings,
) -> DetectionPlan:
    """The actions of one poll of seed 000's triggering controller.

    One tracked resource per storage (:func:`storage_migrator.tracking.track_storage`).
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

    actions: list[Action] = []
    for entry in tracking.kept:
        name = storage_state_name(entry.group, entry.resource)
        # Every name of the storage counts (events and events.events.k8s.io are one storage).
        own = [m for alias in tracking.sharers.get(name, [name]) for m in migrations_of.get(alias, [])]
        actions.extend(
            _plan_resource(
                entry=entry,
                name=name,
                state=by_name.get(name),
                migrations=own,
                crd=crds_by_resource.get((entry.group, entry.resource)),
                now=now,
                settings=settings,
            )
        )
    return DetectionPlan(actions=actions, skipped=tracking.skipped_resources())


def _plan_resource(
    *,
    entry: DiscoveredResource,
    name: str,
    state: StorageState | None,
    migrations: list[StorageVersionMigration],
    crd: CrdObservation | None,
    now: datetime,
    settings: DetectionSettings,
) -> list[Action]:
    observed = entry.storage_version_hash
    stamp = format_time(now)
    pending = [m for m in migrations if not is_finished(m)]
    actions: list[Action] = []

    if state is None:
        # Seed 000: "if the storageState doesn't exist for the resource, the controller
        # ... creates a new storageVersionMigration for this resource, creates the
        # storageState for the resource, setting .status.persistedStorageVersionHashes
        # to ["Unknown"], and setting status.currentStorageVersionHash to the value
        # shown in the discovery document." A pending migration already requested
        # (by anyone) is kept instead of a second one: seed 003 runs them serially.
        actions.append(
            CreateState(
                name=name,
                group=entry.group,
                resource=entry.resource,
                current_hash=observed,
                persisted=[UNKNOWN],
                heartbeat=now,
                annotations={SINCE_ANNOTATION: stamp},
                reason="no StorageState: created with persisted [Unknown] (seed 000)",
            )
        )
        if not pending:
            actions.append(_create_migration(entry, "new StorageState: migrate to learn what is stored (seed 000)"))
        return actions

    current, persisted, heartbeat, annotations = _state_view(state)
    since = parse_time(annotations.get(SINCE_ANNOTATION))
    settle_until = parse_time(annotations.get(SETTLE_ANNOTATION))
    changed = current != observed
    stale = heartbeat is None or (now - heartbeat).total_seconds() > settings.stale_after_seconds
    reasons: list[str] = []
    deleted: set[str] = set()

    if changed:
        # Seed 000: "stops any ongoing migration of this resource by deleting existing
        # storageVersionMigrations" -- only ours; see the module docstring.
        for migration in pending:
            if _is_detection_migration(migration) and migration.metadata.name:
                deleted.add(migration.metadata.name)
                actions.append(
                    DeleteMigration(
                        name=migration.metadata.name,
                        uid=migration.metadata.uid,
                        reason=f"storage version hash changed from {current} to {observed}",
                    )
                )

    if stale or not persisted or current is None:
        # Seed 000: "if the timestamp is more than 10 minutes old, it recreates
        # storageState object with persistedStorageVersionHashes set to ["Unknown"]"
        # (two poll periods here, DESIGN 4.3). A state without a heartbeat, a current
        # hash or a persisted list is as untrustworthy.
        persisted = [UNKNOWN]
        since = now
        annotations[SINCE_ANNOTATION] = stamp
        if stale:
            age = "no heartbeat" if heartbeat is None else f"heartbeat {format_time(heartbeat)}"
            reasons.append(f"stale ({age}, older than {settings.stale_after_seconds:g}s): persisted reset to [Unknown]")
        else:
            reasons.append("incomplete status: persisted reset to [Unknown]")
    elif changed:
        # Seed 000: "as a single operation, updates the status.lastHeartbeatTime, sets
        # storageState.status.currentStorageVersionHash to the value shown in the
        # discovery document, and appends the hash to the
        # storageState.status.persistedStorageVersionHashes."
        if observed not in persisted:
            persisted.append(observed)
        since = now
        annotations[SINCE_ANNOTATION] = stamp
        reasons.append(f"storage version hash changed from {current} to {observed}")
    else:
        # Seed 000: "If they are the same, the controller simply updates the
        # status.lastHeartbeatTime and is done."
        reasons.append("heartbeat")
        if since is None:
            # Without the time the hash was recorded no migration can prove it
            # rewrote everything to it; start the clock now (a new migration follows).
            since = now
            annotations[SINCE_ANNOTATION] = stamp
            reasons.append(f"no {SINCE_ANNOTATION} annotation: set to now")

    if changed:
        # Seed 004's loose guarantee: let API servers agree before migrating.
        if settings.settle_seconds > 0:
            settle_until = now + timedelta(seconds=settings.settle_seconds)
            annotations[SETTLE_ANNOTATION] = format_time(settle_until)
        else:
            settle_until = None
            annotations.pop(SETTLE_ANNOTATION, None)

    # The current hash is always covered by the persisted ones (objects written from
    # now on are encoded in it); "Unknown" covers every version, as seed 000's
    # fresh ["Unknown"] does.
    if observed not in persisted and UNKNOWN not in persisted:
        persisted.append(observed)

    # Refinement. Seed 000: "If a migration completes, the controller finds the
    # storageState of that resource, updates its status.persistedStorageVersionHashes
    # to equal its status.currentStorageVersionHash" -- only a Succeeded migration to
    # the current hash that started after the hash was recorded (DESIGN 4.3).
    proof = next(
        (
            m
            for m in reversed(migrations)
            if is_condition_true(m.status.conditions, CONDITION_SUCCEEDED) and _proves(m, current=observed, since=since)
        ),
        None,
    )
    if proof is not None and persisted != [observed]:
        persisted = [observed]
        reasons.append(f"refined: migration {proof.metadata.name} succeeded to {observed}")

    actions.append(
        UpdateState(
            name=name,
            resource_version=state.metadata.resource_version or "",
            current_hash=observed,
            persisted=persisted,
            heartbeat=now,
            annotations=annotations,
            reason="; ".join(reasons),
        )
    )

    # DESIGN 4.3: for custom resources, refinement also trims the CRD's
    # status.storedVersions so the old version can be removed from the CRD; never
    # when the CRD's storage version no longer hashes to the current one (edited
    # meanwhile: discovery has not caught up).
    if (
        proof is not None
        and crd is not None
        and crd.storage_version_hash == observed
        and crd.stored_versions != [crd.storage_version]
    ):
        actions.append(
            TrimStoredVersions(
                crd_name=crd.name,
                stored_versions=[crd.storage_version],
                resource_version=crd.resource_version,
                reason=f"every {name} is stored in {crd.storage_version} (migration {proof.metadata.name})",
            )
        )

    if persisted == [observed]:
        return actions
    if settle_until is not None and now < settle_until:
        return actions
    if any(m.metadata.name not in deleted for m in pending):
        return actions
    allowed_at, failures = _retry_allowed_at(migrations, current=observed, since=since, settings=settings)
    if allowed_at is not None and now < allowed_at:
        return actions
    why = f"persisted {persisted} is not [{observed}]"
    if failures:
        why += f"; retry after {failures} failed attempt(s)"
    actions.append(_create_migration(entry, why))
    return actions


def _create_migration(entry: DiscoveredResource, reason: str) -> CreateMigration:
    return CreateMigration(
        group=entry.group,
        version=entry.version,
        resource=entry.resource,
        target_hash=entry.storage_version_hash,
        reason=reason,
    )
