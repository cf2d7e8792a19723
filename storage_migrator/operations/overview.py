"""One line per resource: what is stored, and how its last migration is doing.

Design decision (DESIGN 4.10, issue 12): ``storage-migrator status`` answers
"is this resource fully migrated, and if not, when will it be" from the two
objects that hold the state (DESIGN 4.9: Kubernetes objects are the source of
truth for state): the StorageState (current and persisted hashes, seed 000) and
the newest StorageVersionMigration of the resource (phase and counters, seed
002). A pure function of those objects and the clock, so each rule is a table
row in the unit tests:

- a resource is listed if it has a StorageState or a migration (a request made
  by hand before detection saw the resource still shows);
- the last migration is the newest by creationTimestamp, then name;
- rate = objects listed / seconds since ``status.startedAt`` (until
  ``finishedAt`` once finished): the average over the run, resumes included;
- ETA = remaining / rate, only while Running and while the API server gives
  ``remainingItemCount`` (it does not for the last chunk, nor with a field or
  label selector: unknown is shown as unknown, never as 0);
- engine (issue 36) = what the request says ran it (``migration.k8s.io/engine``,
  written by a run whose setting is not plain ``client``), else ``client`` once it
  started (the only engine before), else unknown. On the in-tree engine no
  count moves while kube-controller-manager works: the phase is the progress.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel, Field

from storage_migrator.conditions import phase_from_conditions
from storage_migrator.migration.dispatch import finished_at
from storage_migrator.migration.engines import ENGINE_ANNOTATION
from storage_migrator.models import KubeTime, MigrationPhase, StorageState, StorageVersionMigration, storage_state_name

__all__ = ["ResourceOverview", "overview", "resource_name"]


class ResourceOverview(BaseModel):
    """One resource as ``storage-migrator status`` shows it; the JSON keys are stable (docs/cli.md)."""

    resource: str = Field(description="Plural resource name, e.g. secrets.")
    group: str = Field(description='API group; "" for the core group.')
    current_hash: str | None = Field(description="The StorageState's currentStorageVersionHash; null without one.")
    persisted_hashes: list[str] = Field(
        description="The StorageState's persistedStorageVersionHashes (may hold Unknown); [] without one."
    )
    migration: str | None = Field(description="Name of the newest StorageVersionMigration of the resource.")
    phase: MigrationPhase | None = Field(description="Its phase: Pending, Running, Succeeded or Failed.")
    target_hash: str | None = Field(description="The storage version hash it migrates to.")
    listed: int | None = Field(description="Objects it listed so far.")
    remaining: int | None = Field(description="Objects after its last chunk, as the API server estimated.")
    started_at: KubeTime | None = Field(description="When it started running.")
    finished_at: KubeTime | None = Field(description="When it succeeded or failed.")
    rate: float | None = Field(description="Objects listed per second since started_at (until finished_at).")
    eta_seconds: int | None = Field(description="Seconds left at that rate: only while Running with remaining.")
    engine: str | None = Field(
        default=None,
        description="Issue 36: client or in-tree, the engine that ran (or runs) it; null before it started.",
    )


def _newest(migrations: Sequence[StorageVersionMigration]) -> StorageVersionMigration:
    def key(m: StorageVersionMigration) -> tuple[bool, datetime, str]:
        created = m.metadata.creation_timestamp
        return (created is not None, created or datetime.min, m.metadata.name or "")

    return max(migrations, key=key)


def _rate(migration: StorageVersionMigration, *, now: datetime) -> float | None:
    status, progress = migration.status, migration.status.progress
    if status.started_at is None or progress is None:
        return None
    seconds = ((finished_at(migration) or now) - status.started_at).total_seconds()
    return progress.listed / seconds if seconds > 0 else None


def _row(
    group: str, resource: str, state: StorageState | None, last: StorageVersionMigration | None, *, now: datetime
) -> ResourceOverview:
    hashes = state.status if state is not None else None
    progress = last.status.progress if last is not None else None
    phase = rate = eta = None
    if last is not None:
        phase = last.status.phase or phase_from_conditions(last.status.conditions)
        rate = _rate(last, now=now)
        remaining = progress.remaining_item_count if progress is not None else None
        if phase == "Running" and remaining is not None and rate:
            eta = math.ceil(remaining / rate)
    return ResourceOverview(
        resource=resource,
        group=group,
        current_hash=hashes.current_storage_version_hash if hashes is not None else None,
        persisted_hashes=list(hashes.persisted_storage_version_hashes) if hashes is not None else [],
        migration=last.metadata.name if last is not None else None,
        phase=phase,
        target_hash=last.status.target_storage_version_hash if last is not None else None,
        listed=progress.listed if progress is not None else None,
        remaining=progress.remaining_item_count if progress is not None else None,
        started_at=last.status.started_at if last is not None else None,
        finished_at=finished_at(last) if last is not None else None,
        rate=round(rate, 2) if rate is not None else None,
        eta_seconds=eta,
        engine=_engine(last) if last is not None else None,
    )


def _engine(migration: StorageVersionMigration) -> str | None:
    said = (migration.metadata.annotations or {}).get(ENGINE_ANNOTATION)
    return said or ("client" if migration.status.started_at is not None else None)


def overview(
    states: Sequence[StorageState], migrations: Sequence[StorageVersionMigration], *, now: datetime
) -> list[ResourceOverview]:
    """One entry per resource with a StorageState or a migration, sorted by group then resource."""
    by_state = {(s.spec.resource.group, s.spec.resource.resource): s for s in states}
    by_resource: dict[tuple[str, str], list[StorageVersionMigration]] = {}
    for m in migrations:
        by_resource.setdefault((m.spec.resource.group, m.spec.resource.resource), []).append(m)
    keys = sorted(by_state.keys() | by_resource.keys())
    return [
        _row(group, resource, by_state.get((group, resource)),
             _newest(by_resource[(group, resource)]) if (group, resource) in by_resource else None, now=now)
        for group, resource in keys
    ]  # fmt: skip


def resource_name(row: ResourceOverview) -> str:
    """``<resource>.<group>`` as kubectl writes it (``<resource>`` for core)."""
    return storage_state_name(row.group, row.resource)
