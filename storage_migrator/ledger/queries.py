"""Reading the ledger: past runs, gaps, the last full migration, and the aggregates metrics need.

Design decision: every query returns pydantic models with stable field names,
which `storage-migrator history -o json` prints as they are (docs/observability.md
documents them). A run is its start row joined with its outcome row in Python
(the two are appended independently, so either may be missing after an outage).
Every query takes `cluster` (issue 20): one cluster's rows, or with None every
cluster's, each row saying its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime

from pydantic import BaseModel, Field
from sqlalchemy import func, select, union
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from storage_migrator.conditions import phase_from_conditions
from storage_migrator.ledger.schema import ChunkRow, GapRow, PollRow, RunOutcomeRow, RunRow, StateChangeRow
from storage_migrator.models import StorageVersionMigration, storage_state_name

__all__ = [
    "Gap",
    "LastPoll",
    "ObjectCounts",
    "RunHistory",
    "StateChangeEntry",
    "UnrecordedMigration",
    "clusters",
    "finished_durations",
    "gaps",
    "history",
    "last_full_migration",
    "last_poll",
    "object_counts",
    "recorded_uids",
    "settle_open_runs",
    "state_changes",
    "unrecorded_migrations",
]

OUTCOME_COUNTERS = ("rewritten", "unchanged", "gone", "conflicted", "failed")


class RunHistory(BaseModel):
    """One migration run as `history` shows it (JSON keys are stable: docs/observability.md)."""

    run_id: str
    cluster: str = Field(description="The KubernetesClusterConfig block's name, or default (issue 20).")
    migration: str
    migration_uid: str
    resource: str
    version: str | None = Field(description="None when the run's start row was lost in an outage.")
    target_storage_version_hash: str | None
    encryption_key: str | None
    requested_by: str | None = Field(description="detection, initializer, rotation, manual or the label's value.")
    flow_run_id: str | None
    flow_run_url: str | None = Field(description="<PREFECT_UI_URL>/runs/flow-run/<id> when the UI URL is known.")
    started_at: datetime | None
    finished_at: datetime | None
    duration_seconds: float | None
    outcome: str = Field(
        description="succeeded, failed, cancelled, crashed, running (no outcome row yet), or "
        "unknown (no outcome row, and the run is over: see settle_open_runs)."
    )
    reason: str
    message: str
    listed: int
    rewritten: int
    unchanged: int
    gone: int
    conflicted: int
    failed: int
    chunks: int
    passes: int
    encryption_config_hash: str | None = None
    server_check: str | None = Field(default=None, description="agreed or overridden (issue 19); None: no check.")


class Gap(BaseModel):
    """Rows a writer could not write: history between first_lost_at and last_lost_at is incomplete."""

    recorded_at: datetime
    first_lost_at: datetime
    last_lost_at: datetime
    rows_lost: int
    kinds: dict[str, int]
    resources: list[str]
    clusters: list[str] = Field(description="The clusters of the lost rows (a writer serves every cluster).")
    reason: str


class UnrecordedMigration(BaseModel):
    """A StorageVersionMigration that ran (it has a start time) but has no run in the ledger."""

    migration: str
    migration_uid: str
    resource: str
    phase: str
    started_at: datetime | None
    finished_at: datetime | None


class StateChangeEntry(BaseModel):
    """One StorageState created or changed by detection: which hashes may be in etcd, before and after."""

    recorded_at: datetime
    cluster: str
    state: str
    action: str
    old_current_hash: str | None
    new_current_hash: str | None
    old_persisted: list[str]
    new_persisted: list[str]
    reason: str
    flow_run_id: str | None


class ObjectCounts(BaseModel):
    """Objects handled per resource and outcome, summed over every chunk every worker recorded."""

    cluster: str
    resource: str
    outcome: str
    objects: int


class LastPoll(BaseModel):
    finished_at: datetime
    duration_seconds: float


def _url(ui_url: str | None, flow_run_id: str | None) -> str | None:
    if not ui_url or not flow_run_id:
        return None
    return f"{ui_url.rstrip('/')}/runs/flow-run/{flow_run_id}"


def _merge(start: RunRow | None, end: RunOutcomeRow | None, ui_url: str | None) -> RunHistory:
    first = start if start is not None else end
    assert first is not None
    duration = (end.finished_at - start.started_at).total_seconds() if start and end else None
    counters = {name: getattr(end, name) if end else 0 for name in ("listed", *OUTCOME_COUNTERS)}
    return RunHistory(
        run_id=first.run_id, cluster=first.cluster, migration=first.migration, migration_uid=first.migration_uid, resource=first.resource,
        version=start.version if start else None,
        target_storage_version_hash=start.target_storage_version_hash if start else None,
        encryption_key=start.encryption_key if start else None,
        requested_by=start.requested_by if start else None,
        flow_run_id=start.flow_run_id if start else None,
        flow_run_url=_url(ui_url, start.flow_run_id if start else None),
        started_at=start.started_at if start else None, finished_at=end.finished_at if end else None,
        duration_seconds=duration, outcome=end.outcome if end else "running",
        reason=end.reason if end else "", message=end.message if end else "",
        chunks=end.chunks if end else 0, passes=end.passes if end else 1,
        encryption_config_hash=end.encryption_config_hash if end else None,
        server_check=end.server_check if end else None, **counters,
    )  # fmt: skip


def history(
    engine: Engine,
    *,
    cluster: str | None = None,
    resource: str | None = None,
    since: datetime | None = None,
    ui_url: str | None = None,
    limit: int = 1000,
) -> list[RunHistory]:
    """Runs newest first: those started (or, start row lost, finished) since `since`, of `resource` if given."""
    with Session(engine) as session:
        runs = select(RunRow).order_by(RunRow.started_at.desc()).limit(limit)
        if cluster is not None:
            runs = runs.where(RunRow.cluster == cluster)
        if resource:
            runs = runs.where(RunRow.resource == resource)
        if since:
            runs = runs.where(RunRow.started_at >= since)
        starts = {row.run_id: row for row in session.scalars(runs)}
        outcomes = select(RunOutcomeRow).where(RunOutcomeRow.run_id.in_(starts)) if starts else None
        ends = {row.run_id: row for row in session.scalars(outcomes)} if outcomes is not None else {}
        orphans = select(RunOutcomeRow).where(RunOutcomeRow.run_id.not_in(select(RunRow.run_id)))
        if cluster is not None:
            orphans = orphans.where(RunOutcomeRow.cluster == cluster)
        if resource:
            orphans = orphans.where(RunOutcomeRow.resource == resource)
        if since:
            orphans = orphans.where(RunOutcomeRow.finished_at >= since)
        lone = list(session.scalars(orphans.limit(limit)))
        out = [_merge(start, ends.get(run_id), ui_url) for run_id, start in starts.items()]
        out += [_merge(None, end, ui_url) for end in lone]
    out.sort(key=lambda r: r.started_at or r.finished_at or datetime.min, reverse=True)
    return out[:limit]


def gaps(engine: Engine, *, cluster: str | None = None, since: datetime | None = None) -> list[Gap]:
    """Gaps, newest first; of `cluster`: those that lost a row of it, or of no cluster (a gap of only gap rows)."""
    with Session(engine) as session:
        query = select(GapRow).order_by(GapRow.recorded_at.desc())
        if since:
            query = query.where(GapRow.last_lost_at >= since)
        found = [Gap(recorded_at=g.recorded_at, first_lost_at=g.first_lost_at, last_lost_at=g.last_lost_at,
                     rows_lost=g.rows_lost, kinds=json.loads(g.kinds), resources=json.loads(g.resources),
                     clusters=json.loads(g.clusters), reason=g.reason) for g in session.scalars(query)]  # fmt: skip
    return [g for g in found if cluster is None or not g.clusters or cluster in g.clusters]


def state_changes(
    engine: Engine, *, cluster: str | None = None, state: str | None = None, since: datetime | None = None
) -> list[StateChangeEntry]:
    """StorageState changes, oldest first (the order they happened in)."""
    with Session(engine) as session:
        query = select(StateChangeRow).order_by(StateChangeRow.recorded_at, StateChangeRow.id)
        if cluster is not None:
            query = query.where(StateChangeRow.cluster == cluster)
        if state:
            query = query.where(StateChangeRow.state == state)
        if since:
            query = query.where(StateChangeRow.recorded_at >= since)
        return [StateChangeEntry(recorded_at=r.recorded_at, cluster=r.cluster, state=r.state, action=r.action,
                                 old_current_hash=r.old_current_hash, new_current_hash=r.new_current_hash,
                                 old_persisted=json.loads(r.old_persisted), new_persisted=json.loads(r.new_persisted),
                                 reason=r.reason, flow_run_id=r.flow_run_id) for r in session.scalars(query)]  # fmt: skip


def last_full_migration(
    engine: Engine, resource: str, *, cluster: str | None = None, ui_url: str | None = None
) -> RunHistory | None:
    """DESIGN 4.9: "when was this resource last fully migrated, and to which version"."""
    with Session(engine) as session:
        query = select(RunOutcomeRow).where(RunOutcomeRow.resource == resource, RunOutcomeRow.outcome == "succeeded")
        if cluster is not None:
            query = query.where(RunOutcomeRow.cluster == cluster)
        end = session.scalars(query.order_by(RunOutcomeRow.finished_at.desc()).limit(1)).first()
        if end is None:
            return None
        return _merge(session.get(RunRow, end.run_id), end, ui_url)


#: The reason `history` gives a run whose end the ledger never got.
NO_OUTCOME = "OutcomeNotInLedger"


def settle_open_runs(runs: list[RunHistory], phases: Mapping[str, str] | None) -> list[RunHistory]:
    """Runs with no outcome row that are over anyway, shown as `unknown` instead of `running`.

    A run has no outcome row while it runs, and forever when its process died first (a
    killed worker, or a ledger outage that outlived the process: the row was queued, never
    written). Such a run is over when a later run of the same request exists or, with the
    cluster read (`phases`: request uid -> phase), when its request is finished or gone.
    """
    latest: dict[str, datetime] = {}
    for run in runs:
        if run.started_at is not None:
            latest[run.migration_uid] = max(run.started_at, latest.get(run.migration_uid, run.started_at))
    out = []
    for run in runs:
        if run.outcome != "running":
            out.append(run)
            continue
        superseded = run.started_at is not None and latest[run.migration_uid] > run.started_at
        phase = None if phases is None else phases.get(run.migration_uid, "deleted")
        if not superseded and phase in (None, "Running", "Pending"):
            out.append(run)
            continue
        if superseded:
            now = "a later run of its request exists"
        else:
            now = "its request was deleted" if phase == "deleted" else f"its request is {phase}"
        out.append(run.model_copy(update={
            "outcome": "unknown", "reason": NO_OUTCOME,
            "message": f"the ledger has no end for this run (its process stopped before writing it: killed, or "
                       f"the ledger unreachable until then); {now}",
        }))  # fmt: skip
    return out


def unrecorded_migrations(
    migrations: Iterable[StorageVersionMigration], recorded_uids: set[str], *, since: datetime | None = None
) -> list[UnrecordedMigration]:
    """Requests that ran (status.startedAt) with no run row: the ledger missed them (issue 12's gap check)."""
    out = []
    for m in migrations:
        uid = m.metadata.uid or ""
        started = m.status.started_at
        if not started or uid in recorded_uids or (since and started < since):
            continue
        r = m.spec.resource
        out.append(UnrecordedMigration(migration=m.metadata.name or "", migration_uid=uid,
                                       resource=storage_state_name(r.group, r.resource),
                                       phase=phase_from_conditions(m.status.conditions), started_at=started,
                                       finished_at=m.status.finished_at))  # fmt: skip
    return sorted(out, key=lambda u: u.started_at or datetime.min, reverse=True)


def recorded_uids(engine: Engine, *, cluster: str | None = None) -> set[str]:
    """The uid of every request that has a run row."""
    query = select(RunRow.migration_uid).distinct()
    if cluster is not None:
        query = query.where(RunRow.cluster == cluster)
    with Session(engine) as session:
        return set(session.scalars(query))


def clusters(engine: Engine) -> list[str]:
    """Every cluster the ledger has a row of (runs, outcomes, chunks, StorageState changes, polls), sorted."""
    tables = (RunRow, RunOutcomeRow, ChunkRow, StateChangeRow, PollRow)
    with Session(engine) as session:
        return sorted(set(session.scalars(union(*(select(t.cluster).distinct() for t in tables)))))


def object_counts(engine: Engine, *, cluster: str | None = None) -> list[ObjectCounts]:
    """storage_migrator_objects_total: every chunk's counters, per cluster, resource and outcome."""
    sums = [func.coalesce(func.sum(getattr(ChunkRow, name)), 0) for name in OUTCOME_COUNTERS]
    query = select(ChunkRow.cluster, ChunkRow.resource, *sums).group_by(ChunkRow.cluster, ChunkRow.resource)
    if cluster is not None:
        query = query.where(ChunkRow.cluster == cluster)
    with Session(engine) as session:
        rows = session.execute(query).all()
    return [ObjectCounts(cluster=row[0], resource=row[1], outcome=name, objects=int(row[i + 2]))
            for row in rows for i, name in enumerate(OUTCOME_COUNTERS)]  # fmt: skip


def finished_durations(engine: Engine, *, cluster: str | None = None) -> list[float]:
    """Seconds from start to end of every run with both rows (storage_migrator_migration_duration_seconds)."""
    query = select(RunRow.started_at, RunOutcomeRow.finished_at).join(
        RunOutcomeRow, RunOutcomeRow.run_id == RunRow.run_id
    )
    if cluster is not None:
        query = query.where(RunRow.cluster == cluster)
    with Session(engine) as session:
        rows = session.execute(query).all()
    return [max(0.0, (end - start).total_seconds()) for start, end in rows]


def last_poll(engine: Engine, *, cluster: str | None = None) -> LastPoll | None:
    query = select(PollRow).order_by(PollRow.finished_at.desc()).limit(1)
    if cluster is not None:
        query = query.where(PollRow.cluster == cluster)
    with Session(engine) as session:
        row = session.scalars(query).first()
        return LastPoll(finished_at=row.finished_at, duration_seconds=row.duration_seconds) if row else None
