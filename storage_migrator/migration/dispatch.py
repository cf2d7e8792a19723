"""Which pending migrations the ``run-migrations`` flow starts now.

Design decision (DESIGN 3, 4.6): the order is a pure function of what the
cluster shows (the ``StorageVersionMigration`` objects), the clock, and which
resources are busy, so it is table-tested and the flow only polls, plans and
starts. The rules come from seed 002 (Alpha workflow: a nil status or a
``Running`` condition means "start a worker"; ``Running`` migrations first)
and seed 003 (requests for the same resource run one after another).

A ``Running`` condition is a lease: the run that owns it refreshes its
``lastUpdateTime`` at every checkpoint, so a recent one means a live run
(leave it alone, its resource is busy) and an old one means the run died
(resume it from its stored continue token, seed 002 "Failure recovery").
The same lease judges a flow run that still shows Running in Prefect after its
process died with its worker (Prefect marks nothing Crashed by itself then):
`presumed_dead` says when the dispatcher may mark it Crashed and resume it;
a run killed after its request's verdict (while wrapping up) is judged by the
verdict's time instead, and only marked.

Issue 37: where the writer Leases were read (`held`: request name -> holder of its live
Lease, `write_budget.holders`), they decide instead of the condition: a request is held
exactly while its Lease is live, since a run takes its Lease before it marks the request
Running and holds it until after its verdict. A Running request without a live Lease has
no run writing it and is resumed at once, not a lease later; one with a live Lease is
never started beside its holder (a run started anyway would be refused by the Lease).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.conditions import get_condition, is_condition_true
from storage_migrator.models import (
    CONDITION_FAILED,
    CONDITION_RUNNING,
    CONDITION_SUCCEEDED,
    StorageVersionMigration,
    storage_state_name,
)

__all__ = [
    "OVER_PARALLEL_LIMIT",
    "PRESUMED_DEAD",
    "RUNNING_ELSEWHERE",
    "DispatchPlan",
    "Waiting",
    "busy_reason",
    "finished_at",
    "is_finished",
    "migration_resource",
    "plan_dispatch",
    "presumed_dead",
    "queued_reason",
    "was_presumed_dead",
]

#: Reason of a pick that does not fit in ``max_parallel`` this time.
OVER_PARALLEL_LIMIT = "over the parallel limit"
#: Reason of a Running migration whose lease is live: another flow run owns it.
RUNNING_ELSEWHERE = "running in a live flow run (lease held)"
#: Who holds a resource listed in ``active`` when no live migration names it.
_ANOTHER_RUN = "another flow run"
#: What a dispatcher says when it marks a flow run Crashed (flows/run_migrations.py); the run looks for it.
PRESUMED_DEAD = "its process is presumed dead"

_EPOCH = datetime.min.replace(tzinfo=UTC)


def busy_reason(holder: str) -> str:
    """Why a migration waits for a resource that a live run holds."""
    return f"resource busy with {holder}"


def queued_reason(name: str) -> str:
    """Why a migration waits behind the one picked for its resource (seed 003: serially)."""
    return f"queued behind {name}"


class Waiting(BaseModel):
    """A pending migration that is not started now, and why."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="metadata.name of the StorageVersionMigration.")
    reason: str = Field(
        description=(
            "Why it waits: 'resource busy with <name>', 'queued behind <name>', "
            "'over the parallel limit', or 'running in a live flow run (lease held)'."
        )
    )


class DispatchPlan(BaseModel):
    """What the run-migrations flow does this round."""

    model_config = ConfigDict(frozen=True)

    start: list[str] = Field(
        default_factory=list,
        description="Names of the migrations to start now, in order: resumed ones first, then oldest first.",
    )
    waiting: list[Waiting] = Field(
        default_factory=list,
        description="Every other pending migration, with its reason; finished ones are not listed.",
    )


def migration_resource(migration: StorageVersionMigration) -> str:
    """``<resource>.<group>`` (``<resource>`` for core): one resource whatever the version.

    Versions of one group-resource share one storage, so two migrations of
    ``deployments.apps`` in v1 and v1beta1 must not run at once either.
    """
    ref = migration.spec.resource
    return storage_state_name(ref.group, ref.resource)


def finished_at(migration: StorageVersionMigration) -> datetime | None:
    """When it finished: ``status.finishedAt``, else when its Succeeded/Failed condition was set."""
    if migration.status.finished_at is not None:
        return migration.status.finished_at
    for kind in (CONDITION_SUCCEEDED, CONDITION_FAILED):
        condition = get_condition(migration.status.conditions, kind)
        if condition is not None and condition.status == "True" and condition.last_update_time is not None:
            return condition.last_update_time
    return None


def is_finished(migration: StorageVersionMigration) -> bool:
    """Succeeded or Failed is True: the migration is a record, never started again."""
    conditions = migration.status.conditions
    return is_condition_true(conditions, CONDITION_SUCCEEDED) or is_condition_true(conditions, CONDITION_FAILED)


def _is_running(migration: StorageVersionMigration) -> bool:
    return is_condition_true(migration.status.conditions, CONDITION_RUNNING)


def _lease_is_live(migration: StorageVersionMigration, *, now: datetime, lease_seconds: float) -> bool:
    """Running and refreshed within ``lease_seconds``: a live run owns it.

    Without a ``lastUpdateTime`` nobody can prove it is alive, so it counts as
    expired (and is resumed) rather than blocking its resource forever.
    """
    condition = get_condition(migration.status.conditions, CONDITION_RUNNING)
    if condition is None or condition.status != "True" or condition.last_update_time is None:
        return False
    return (now - condition.last_update_time).total_seconds() <= lease_seconds


def presumed_dead(
    migration: StorageVersionMigration | None,
    *,
    claimed_at: datetime | None,
    now: datetime,
    lease_seconds: float,
    held: bool | None = None,
) -> bool:
    """Whether a flow run that a worker took for ``migration`` (Prefect shows it
    Pending or Running since ``claimed_at``) has died.

    True when it was taken longer than ``lease_seconds`` ago and the request's
    lease is not live: a live run refreshes it within seconds of starting and at
    every checkpoint, so neither happened for a whole lease (its process was
    killed with its worker, or its machine died; a worker that dies before the
    process starts leaves the run Pending for ever). For a finished request, when
    it finished longer than ``lease_seconds`` ago: a live run wraps up within
    seconds of writing the verdict, so one still shown Pending or Running a
    whole lease later was killed while wrapping up, and would wait for ever.
    Never for a request that is gone (the run cancels itself), nor for a run no
    worker has taken (None: it waits for one). ``held`` (issue 37): whether the
    request's writer Lease is live, which then stands for the request's lease.
    """
    if migration is None or claimed_at is None:
        return False
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    if (now - claimed_at).total_seconds() <= lease_seconds:
        return False
    if is_finished(migration):
        done = finished_at(migration)
        return done is not None and (now - done).total_seconds() > lease_seconds
    if held is not None:
        return not held
    return not _lease_is_live(migration, now=now, lease_seconds=lease_seconds)


def was_presumed_dead(history: Sequence[tuple[str, str | None]]) -> bool:
    """Whether a dispatcher marked this flow run dead (its states as (type, message), any order).

    Prefect lets a Crashed run move to Running when its process starts after all (a run
    slower to start than the lease: an image pull, a loaded worker). Its request was
    resumed elsewhere meanwhile, and two runs of one request would break seed 003's one
    at a time per resource: such a run must end before it writes anything.
    """
    return any(kind == "CRASHED" and PRESUMED_DEAD in (message or "") for kind, message in history)


def _age_key(migration: StorageVersionMigration) -> tuple[bool, datetime, str]:
    """Oldest first by creationTimestamp, then name; no timestamp sorts last (not yet created)."""
    created = migration.metadata.creation_timestamp
    return (created is None, created or _EPOCH, migration.metadata.name or "")


def _priority_key(migration: StorageVersionMigration) -> tuple[bool, tuple[bool, datetime, str]]:
    """Running (resume) first, then oldest first (DESIGN 4.6; seed 002 sorts Running first)."""
    return (not _is_running(migration), _age_key(migration))


def plan_dispatch(
    migrations: Sequence[StorageVersionMigration],
    *,
    now: datetime,
    max_parallel: int,
    lease_seconds: float,
    active: Collection[str] = (),
    held: Mapping[str, str] | None = None,
) -> DispatchPlan:
    """Pick the migrations to start now: at most one per resource, at most ``max_parallel`` busy.

    ``active`` names group-resources (``secrets``, ``deployments.apps``) that are
    busy for reasons the objects do not show, e.g. flow runs in progress that
    have not yet set their Running condition. ``held`` (issue 37): the requests
    whose writer Lease is live, and its holder; given, it alone says which are held
    (``lease_seconds`` then plays no part); None: the Running condition's lease does.
    """
    if max_parallel < 0:
        raise ValueError(f"max_parallel must be >= 0, got {max_parallel}")
    if lease_seconds < 0:
        raise ValueError(f"lease_seconds must be >= 0, got {lease_seconds}")
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)

    # Seed 002: "if migration.status is nil, or migration.status.conditions shows
    # Running, it creates a migration worker": anything not finished is pending.
    # Unnamed objects cannot be started by name: ignored. Names are unique.
    pending: list[StorageVersionMigration] = []
    seen: set[str] = set()
    for migration in migrations:
        name = migration.metadata.name
        if not name or name in seen or is_finished(migration):
            continue
        seen.add(name)
        pending.append(migration)
    pending.sort(key=_priority_key)

    # A live lease holds its resource (and is not started again); so do `active` runs.
    holders: dict[str, str] = {}
    live: set[str] = set()
    for migration in pending:
        name = migration.metadata.name or ""
        alive = name in held if held is not None else _lease_is_live(migration, now=now, lease_seconds=lease_seconds)
        if alive:
            live.add(name)
            holders.setdefault(migration_resource(migration), name)
    busy = set(holders) | set(active)

    # Seed 003: requests for the same resource run one after another: one pick
    # per free resource, the first in priority order (resumed, then oldest).
    picks: dict[str, str] = {}
    for migration in pending:
        resource = migration_resource(migration)
        if resource not in busy:
            picks.setdefault(resource, migration.metadata.name or "")

    capacity = max(0, max_parallel - len(busy))
    ordered_picks = list(picks.values())  # already in priority order
    start = ordered_picks[:capacity]
    over_limit = set(ordered_picks[capacity:])

    waiting: list[Waiting] = []
    for migration in pending:
        name = migration.metadata.name or ""
        resource = migration_resource(migration)
        if name in live:
            reason = RUNNING_ELSEWHERE
        elif resource in busy:
            reason = busy_reason(holders.get(resource, _ANOTHER_RUN))
        elif name in over_limit:
            reason = OVER_PARALLEL_LIMIT
        elif picks[resource] != name:
            reason = queued_reason(picks[resource])
        else:
            continue  # started
        waiting.append(Waiting(name=name, reason=reason))
    return DispatchPlan(start=start, waiting=waiting)
