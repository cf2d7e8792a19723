"""``storage-migrator history [RESOURCE] [--since]``: past migration runs, from the ledger.

Issue 12: outcome, who asked, counters, and the flow run with its Prefect UI
URL. The ledger may have a gap (the database was down longer than the writer
retried): its gap rows are listed, and the cluster's StorageVersionMigration
objects that ran with no run row in the ledger are listed too (the Kubernetes
objects are the source of truth; the ledger only their history), and a run
whose end never reached the ledger is shown `unknown` once it is over. Issue
20: one ledger holds a fleet's history; a command shows one cluster's runs, or
every cluster's with a CLUSTER column, each cross-checked against its own cluster.
Issue 36: the in-tree migrations (``storagemigration.k8s.io``) anyone made, as
detection recorded them, are rows of kind ``in-tree``, with who created them
where the object says so (its field manager), else ``unknown``.
"""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from storage_migrator.cli.clusters import AllClustersOption, ClusterOption, connect, scope_of
from storage_migrator.cli.options import settings_of
from storage_migrator.cli.output import Output, OutputFormat, emit, render_table
from storage_migrator.conditions import phase_from_conditions
from storage_migrator.ledger.recorder import requested_by
from storage_migrator.migration.requests import list_migrations
from storage_migrator.models import MIGRATIONS_KIND_NAME, StorageVersionMigration

if TYPE_CHECKING:
    from storage_migrator.ledger.in_tree_history import InTreeHistory
    from storage_migrator.ledger.queries import Gap, UnrecordedMigration

__all__ = ["command", "parse_since"]

HEADERS = ["STARTED", "RESOURCE", "MIGRATION", "REQUESTED BY", "OUTCOME", "DURATION", "LISTED", "REWRITTEN",
           "FAILED", "FLOW RUN"]  # fmt: skip
_AGO = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_since(text: str, *, now: datetime) -> datetime:
    """``7d``, ``12h``, ``30m``, ``90s`` ago, or an ISO 8601 date or time (UTC unless it says)."""
    if match := _AGO.match(text.strip()):
        return now - timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r}: use a duration (7d, 12h, 30m) or a date (2026-11-20, "
                                 "2026-11-20T10:00:00Z)", param_hint="--since") from exc  # fmt: skip
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _unrecorded_row(cluster: str, u: UnrecordedMigration, labels: dict[str, str] | None,
                    progress: Any) -> dict[str, Any]:  # fmt: skip
    counters = {k: getattr(progress, k, 0) if progress else 0
                for k in ("listed", "rewritten", "unchanged", "gone", "conflicted", "failed", "chunks")}  # fmt: skip
    return {"kind": "unrecorded", "run_id": None, "cluster": cluster, "migration": u.migration, "migration_uid": u.migration_uid,
            "resource": u.resource, "version": None, "target_storage_version_hash": None, "encryption_key": None,
            "requested_by": requested_by(labels), "flow_run_id": None, "flow_run_url": None,
            "started_at": u.started_at, "finished_at": u.finished_at, "duration_seconds": None,
            "outcome": u.phase.lower(), "reason": "NotInLedger",
            "message": f"{MIGRATIONS_KIND_NAME}/{u.migration} ran but the ledger has no run of it "
                       "(the database was unreachable): counters from the object's status",
            **counters, "passes": 1, "encryption_config_hash": None, "server_check": None}  # fmt: skip


def _gap_row(g: Gap) -> dict[str, Any]:
    from storage_migrator.ledger.queries import RunHistory

    kinds = ", ".join(f"{n} {k}" for k, n in g.kinds.items())
    row: dict[str, Any] = {key: None for key in RunHistory.model_fields}
    row.update(kind="gap", cluster=",".join(g.clusters), resource=",".join(g.resources), started_at=g.first_lost_at, finished_at=g.last_lost_at,
               outcome="gap", reason="LedgerGap", message=f"{g.rows_lost} ledger rows not written ({kinds}): {g.reason}",
               listed=0, rewritten=0, unchanged=0, gone=0, conflicted=0, failed=0, chunks=0, passes=0)  # fmt: skip
    return row


#: What `history` says of an in-tree migration whose object names no field manager (issue 36).
CREATOR_UNKNOWN = "unknown (the object does not say)"


def _in_tree_row(h: InTreeHistory) -> dict[str, Any]:
    """An in-tree migration (storagemigration.k8s.io, anyone's) as a history row: who created it, where
    the object says so; the phase polls last saw it in; no counters (its controller keeps none we read)."""
    from storage_migrator.ledger.queries import RunHistory

    row: dict[str, Any] = {key: None for key in RunHistory.model_fields}
    duration = (h.finished_at - h.started_at).total_seconds() if h.finished_at and h.started_at else None
    row.update(kind="in-tree", cluster=h.cluster, migration=h.migration, migration_uid=h.migration_uid,
               resource=h.resource, requested_by=h.created_by or CREATOR_UNKNOWN, started_at=h.started_at,
               finished_at=h.finished_at, duration_seconds=duration, outcome=h.phase.lower(), reason=h.reason,
               message=h.message, listed=0, rewritten=0, unchanged=0, gone=0, conflicted=0, failed=0, chunks=0,
               passes=1, api_version=h.api_version, created_by=h.created_by, phases_seen=h.phases_seen,
               resource_version=h.resource_version)  # fmt: skip
    return row


def _requests(ctx: typer.Context, cluster: str) -> list[StorageVersionMigration] | None:
    """The cluster's requests; None with a warning when the cluster cannot be read."""
    try:
        with connect(ctx, cluster) as api:
            return list_migrations(api)
    except Exception as exc:  # noqa: BLE001 - the ledger's answer stands on its own; say what was not checked
        print(f"warning: cluster {cluster!r}: could not list {MIGRATIONS_KIND_NAME} to cross-check the ledger: "
              f"{exc}", file=sys.stderr)  # fmt: skip
        return None


def _unrecorded(cluster: str, requests: list[StorageVersionMigration], recorded: set[str], resource: str | None,
                since: datetime | None) -> list[Any]:  # fmt: skip
    """The cluster's requests that ran with no run row."""
    from storage_migrator.ledger import queries

    by_uid = {m.metadata.uid: m for m in requests}
    out = []
    for u in queries.unrecorded_migrations(requests, recorded, since=since):
        if resource and u.resource != resource:
            continue
        m = by_uid[u.migration_uid]
        out.append(_unrecorded_row(cluster, u, m.metadata.labels, m.status.progress))
    return out


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, float):
        return f"{value:.1f}s"
    return str(value)


def _shown(row: dict[str, Any]) -> str:
    """The MIGRATION cell: an in-tree one says so (its name is in storagemigration.k8s.io, not ours)."""
    return f"{row['migration']} (in-tree)" if row["kind"] == "in-tree" else str(row["migration"] or "")


def _table(rows: list[dict[str, Any]], *, clusters: bool) -> str:
    return render_table((["CLUSTER"] if clusters else []) + HEADERS, [
        ([_cell(r["cluster"])] if clusters else []) + [_cell(r["started_at"]), _cell(r["resource"]), _cell(_shown(r)), _cell(r["requested_by"]),
         _cell(r["outcome"]), _cell(r["duration_seconds"]), _cell(r["listed"]), _cell(r["rewritten"]),
         _cell(r["failed"]), _cell(r["flow_run_url"] or r["flow_run_id"])]
        for r in rows
    ])  # fmt: skip


def command(
    ctx: typer.Context,
    resource: Annotated[str | None, typer.Argument(help="only this resource: <resource> or <resource>.<group>")] = None,
    since: Annotated[str | None, typer.Option(help="only runs since: 7d, 12h, 30m, or a date (UTC)")] = None,
    limit: Annotated[int, typer.Option(min=1, help="at most this many runs, newest first")] = 1000,
    requests: Annotated[
        bool, typer.Option(help="cross-check the cluster's requests for runs the ledger missed")
    ] = True,
    cluster: ClusterOption = None,
    all_clusters: AllClustersOption = False,
    output: Output = OutputFormat.table,
) -> None:
    """Past migration runs from the ledger, newest first: outcome, who asked, counters, the flow run and its UI URL.

    The ledger is STORAGE_MIGRATOR_DATABASE_URL; flow-run links need STORAGE_MIGRATOR_PREFECT_UI_URL or PREFECT_UI_URL. Gaps in the ledger and requests that ran without a run row are listed too (kind gap / unrecorded), and the in-tree migrations (storagemigration.k8s.io) anyone made, as detection saw them (kind in-tree, with who created them). The default cluster's runs, --cluster NAME's, or --all-clusters (every cluster in the ledger, with a CLUSTER column). Exit codes: 0 done; 1 the ledger could not be read.
    """
    # The ledger's SQLAlchemy only in the commands that read the ledger (issue 29).
    from storage_migrator.ledger import in_tree_history, queries
    from storage_migrator.ledger.database import display_url, ledger_engine

    scope = scope_of(ctx, cluster, all_clusters)
    settings = settings_of(ctx)
    after = parse_since(since, now=datetime.now(UTC)) if since else None
    name = resource.lower() if resource else None
    try:
        engine = ledger_engine(settings.database_url)
        runs = queries.history(engine, cluster=scope.cluster, resource=name, since=after,
                               ui_url=settings.prefect_ui_url, limit=limit)  # fmt: skip
        gaps = queries.gaps(engine, cluster=scope.cluster, since=after)
        in_tree = in_tree_history.in_tree_history(
            engine, cluster=scope.cluster, resource=name, since=after, limit=limit
        )
        names = [scope.cluster] if scope.cluster is not None else queries.clusters(engine)
        recorded = {n: queries.recorded_uids(engine, cluster=n) for n in names}
    except Exception as exc:
        print(f"storage-migrator: the ledger at {display_url(settings.database_url)!r} could not be read: {exc}",
              file=sys.stderr)  # fmt: skip
        raise typer.Exit(1) from exc
    rows: list[dict[str, Any]] = []
    for each in names:  # each cluster's runs are settled against that cluster's own requests
        found = _requests(ctx, each) if requests else None
        phases = None if found is None else {m.metadata.uid or "": phase_from_conditions(m.status.conditions)
                                             for m in found}  # fmt: skip
        mine = [r for r in runs if r.cluster == each]
        rows += [{"kind": "run", **r.model_dump()} for r in queries.settle_open_runs(mine, phases)]
        rows += _unrecorded(each, found, recorded[each], name, after) if found is not None else []
    rows += [_gap_row(g) for g in gaps if not name or not g.resources or name in g.resources]
    rows += [_in_tree_row(h) for h in in_tree]
    rows.sort(key=lambda r: r["started_at"] or r["finished_at"] or datetime.min.replace(tzinfo=UTC), reverse=True)
    for row in rows:
        if row["kind"] not in ("run", "in-tree") or row["outcome"] == "unknown":
            print(f"warning: {row['message']}", file=sys.stderr)
    data = [{k: (v.isoformat().replace("+00:00", "Z") if isinstance(v, datetime) else v) for k, v in r.items()}
            for r in rows]  # fmt: skip
    emit(output, data, lambda: _table(rows, clusters=scope.all))
