"""``storage-migrator status``: one row per resource, like ``kubectl get``.

DESIGN 4.10: current hash, persisted hashes, and the last migration's phase,
engine (issue 36), progress, rate and ETA (storage_migrator/operations/overview.py
decides each value).
Issue 20: of one cluster, or of every cluster with a CLUSTER column; a cluster
that cannot be read is named on stderr, the others are still shown.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import typer

from storage_migrator.cli.clusters import AllClustersOption, ClusterOption, connect, each_recorded_cluster, scope_of
from storage_migrator.cli.output import Output, OutputFormat, emit, render_table
from storage_migrator.detection.states import list_states
from storage_migrator.kube.errors import NotFound
from storage_migrator.migration.requests import list_migrations
from storage_migrator.models import MIGRATIONS_KIND_NAME, STATES_KIND_NAME
from storage_migrator.operations.overview import ResourceOverview, overview, resource_name

__all__ = ["command"]

HEADERS = ["RESOURCE", "CURRENT HASH", "PERSISTED HASHES", "MIGRATION", "PHASE", "ENGINE", "PROGRESS", "RATE", "ETA"]


def duration(seconds: int) -> str:
    """``45s``, ``3m20s``, ``2h5m``: kubectl's way of writing an age."""
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60}s" if seconds % 60 else f"{seconds // 60}m"
    hours, minutes = seconds // 3600, seconds % 3600 // 60
    return f"{hours}h{minutes}m" if minutes else f"{hours}h"


def _progress(row: ResourceOverview) -> str:
    if row.listed is None:
        return "-"
    if row.remaining is None:
        return f"{row.listed}"
    return f"{row.listed}/{row.listed + row.remaining}"


def _table(rows: list[tuple[str, ResourceOverview]], *, clusters: bool) -> str:
    return render_table((["CLUSTER"] if clusters else []) + HEADERS, [
        ([cluster] if clusters else []) + [
            resource_name(r), r.current_hash or "-", ",".join(r.persisted_hashes) or "-", r.migration or "-",
            r.phase or "-", r.engine or "-", _progress(r), f"{r.rate:g}/s" if r.rate is not None else "-",
            duration(r.eta_seconds) if r.eta_seconds is not None else "-"]
        for cluster, r in rows
    ])  # fmt: skip


class _Unread(Exception):
    """A cluster whose StorageStates or migrations could not be read; the message says why and what to do."""


def _read(ctx: typer.Context, cluster: str, now: datetime) -> list[ResourceOverview]:
    with connect(ctx, cluster) as api:
        try:
            states, migrations = list_states(api), list_migrations(api)
        except NotFound as exc:
            raise _Unread(f"{STATES_KIND_NAME} or {MIGRATIONS_KIND_NAME} is not served ({exc}): install the "
                          "CRDs with `kubectl apply -f deployments/crds/`") from exc  # fmt: skip
    return overview(states, migrations, now=now)


def _fleet(ctx: typer.Context, now: datetime) -> tuple[list[tuple[str, ResourceOverview]], list[str]]:
    """Every cluster's rows, and why each cluster that could not be read was not (the others are still read)."""
    return each_recorded_cluster(lambda name: _read(ctx, name, now))


def command(
    ctx: typer.Context,
    cluster: ClusterOption = None,
    all_clusters: AllClustersOption = False,
    output: Output = OutputFormat.table,
) -> None:
    """One row per resource: current hash, persisted hashes, the last migration's phase, progress, rate and ETA.

    Read from the StorageStates and StorageVersionMigrations of the cluster (nothing is written): the default cluster, --cluster NAME (a KubernetesClusterConfig block), or --all-clusters (default and every cluster a run recorded in the Prefect workspace, with a CLUSTER column). Exit codes: 0 done; 1 a cluster could not be read (or the migration CRDs are not installed): with --all-clusters the others are still shown.
    """
    scope = scope_of(ctx, cluster, all_clusters)
    now = datetime.now(UTC)
    failed: list[str] = []
    if scope.cluster is not None:
        try:
            rows = [(scope.cluster, r) for r in _read(ctx, scope.cluster, now)]
        except _Unread as exc:
            print(f"storage-migrator: {exc}", file=sys.stderr)
            raise typer.Exit(1) from exc
    else:
        rows, failed = _fleet(ctx, now)
    for why in failed:
        print(f"storage-migrator: {why}", file=sys.stderr)
    if not rows and output is OutputFormat.table:
        if not failed:
            print("No resources found: no StorageStates and no migrations yet", file=sys.stderr)  # as kubectl get
    else:
        emit(output, [{"cluster": name, **r.model_dump(mode="json")} for name, r in rows],
             lambda: _table(rows, clusters=scope.all))  # fmt: skip
    if failed:
        raise typer.Exit(1)
