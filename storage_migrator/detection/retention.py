"""Which finished StorageVersionMigration requests the detection poll deletes.

Design decision (DESIGN 4.8, seed 003 "Do the StorageVersionMigration resources
get cleaned up after a while?"; issue 11): a finished request is a record, kept
for a retention period (``request_retention_seconds``) after it finished, then
deleted by the detection poll through detection's own ``DeleteMigration``
action (uid precondition: a same-named successor survives). A pure function of
the requests, the clock and the period, so each rule is one row of a table:

- only finished requests (Succeeded or Failed) are deleted: pending and Running
  ones never are;
- only when they finished (``status.finishedAt``, else the time of the finishing
  condition) longer ago than the retention period; without a finish time, never;
- a Failed request only once a person has acknowledged it with the annotation
  ``migration.k8s.io/acknowledged: "true"`` (``kubectl annotate ...``): until
  then it is the open report of objects that could not be rewritten;
- never the newest finished request of a resource: it is the record that the
  resource was migrated (seed 003: "a record of a successful migration").
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

from storage_migrator.conditions import is_condition_true
from storage_migrator.detection.actions import DeleteMigration
from storage_migrator.migration.dispatch import finished_at, is_finished, migration_resource
from storage_migrator.models import CONDITION_FAILED, StorageVersionMigration

__all__ = ["ACKNOWLEDGED_ANNOTATION", "finished_at", "is_acknowledged", "plan_retention"]

#: Set to "true" by a person on a Failed request they have dealt with; then it ages out.
ACKNOWLEDGED_ANNOTATION: Final = "migration.k8s.io/acknowledged"


def is_acknowledged(migration: StorageVersionMigration) -> bool:
    """A person has marked the request as dealt with (annotation value "true")."""
    value = (migration.metadata.annotations or {}).get(ACKNOWLEDGED_ANNOTATION, "")
    return value.strip().lower() == "true"


def plan_retention(
    migrations: Sequence[StorageVersionMigration], *, now: datetime, retention_seconds: float
) -> list[DeleteMigration]:
    """The finished requests to delete now, oldest first, each with the rule that allows it."""
    if retention_seconds <= 0:
        raise ValueError(f"retention_seconds must be > 0, got {retention_seconds}")
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    cutoff = now - timedelta(seconds=retention_seconds)

    finished: list[tuple[datetime, StorageVersionMigration]] = []
    for migration in migrations:
        when = finished_at(migration)
        if migration.metadata.name and is_finished(migration) and when is not None:
            finished.append((when, migration))
    # Newest finished per resource, by finish time (then name, for a stable choice).
    finished.sort(key=lambda p: (p[0], p[1].metadata.name or ""))
    newest: dict[str, str] = {}
    for _, migration in finished:
        newest[migration_resource(migration)] = migration.metadata.name or ""

    deletions: list[DeleteMigration] = []
    for when, migration in finished:
        name = migration.metadata.name or ""
        resource = migration_resource(migration)
        if when > cutoff or newest[resource] == name or migration.metadata.deletion_timestamp is not None:
            continue
        failed = is_condition_true(migration.status.conditions, CONDITION_FAILED)
        if failed and not is_acknowledged(migration):
            continue
        outcome = "failed (acknowledged)" if failed else "succeeded"
        age_days = (now - when).total_seconds() / 86400
        deletions.append(
            DeleteMigration(
                name=name,
                uid=migration.metadata.uid,
                reason=(
                    f"{outcome} {age_days:.1f} days ago, past the retention of "
                    f"{retention_seconds / 86400:g} days; {newest[resource]} is kept as the record of {resource}"
                ),
            )
        )
    return deletions
