"""``storage-migrator plan``: what the next detection poll would do, without doing it.

Issue 12 item 2. The same observation (storage_migrator/detection/observation.py) and the
same decisions (storage_migrator/detection/poll.py) as the detect-storage-changes
poll, with the same settings; nothing is written. The actions carry our own
objects' names and hashes only, never a migrated object's data. Issue 20: of
one cluster, or of every cluster with a CLUSTER column.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import UTC, datetime

import typer

from storage_migrator.cli.clusters import AllClustersOption, ClusterOption, connect, each_recorded_cluster, scope_of
from storage_migrator.cli.options import settings_of
from storage_migrator.cli.output import Output, OutputFormat, emit, render_table
from storage_migrator.detection.actions import (
    Action,
    CreateMigration,
    CreateState,
    DeleteMigration,
    TrimStoredVersions,
    UpdateState,
)
from storage_migrator.detection.changes import is_heartbeat
from storage_migrator.detection.observation import observe_cluster
from storage_migrator.detection.poll import plan_poll
from storage_migrator.models import MIGRATIONS_KIND_NAME, STATES_KIND_NAME

__all__ = ["command"]


def target(action: Action) -> str:
    """The object an action writes, as ``kubectl`` names it (requests: the resource to migrate)."""
    if isinstance(action, CreateState | UpdateState):
        return f"{STATES_KIND_NAME}/{action.name}"
    if isinstance(action, DeleteMigration):
        return f"{MIGRATIONS_KIND_NAME}/{action.name}"
    if isinstance(action, CreateMigration):
        return f"{MIGRATIONS_KIND_NAME} for {action.group_resource}"
    if isinstance(action, TrimStoredVersions):
        return f"customresourcedefinitions.apiextensions.k8s.io/{action.crd_name}"
    raise TypeError(f"unknown action {action!r}")  # pragma: no cover - the union is closed


@dataclass(frozen=True)
class _Plan:
    """One cluster's plan as the command prints it."""

    cluster: str
    actions: list[Action]
    rows: list[list[str]]
    heartbeats: int


def _plan(ctx: typer.Context, cluster: str, *, named: bool) -> _Plan:
    """What the next poll of `cluster` would do; warnings on stderr name the cluster when several are planned."""
    settings = settings_of(ctx)
    with connect(ctx, cluster) as api:
        seen = observe_cluster(api, settings)
    where = f"cluster {cluster!r}: " if named else ""
    if seen.failed_group_versions:
        print(f"warning: {where}discovery incomplete ({', '.join(seen.failed_group_versions)}): the poll leaves "
              "those resources for the next one", file=sys.stderr)  # fmt: skip
    for server, why in seen.unheard.items():
        print(f"warning: {where}API server {server} not heard: {why}", file=sys.stderr)
    plan = plan_poll(seen, settings, now=datetime.now(UTC))
    states = {s.metadata.name: s for s in seen.states}
    # The table is for people: a write of nothing but heartbeats is counted, not listed (JSON / YAML list it).
    beats = {id(a) for a in plan.of_kind(UpdateState) if is_heartbeat(a, states.get(a.name))}
    rows = [[a.kind, target(a), a.reason] for a in plan.actions if id(a) not in beats]
    return _Plan(cluster=cluster, actions=list(plan.actions), rows=rows, heartbeats=len(beats))


def command(
    ctx: typer.Context,
    cluster: ClusterOption = None,
    all_clusters: AllClustersOption = False,
    output: Output = OutputFormat.table,
) -> None:
    """What the next detection poll would do, without doing it: its actions, in order.

    The table lists the actions that change something and counts the StorageStates whose heartbeat alone is written ("nothing to do" when that is all); -o json / yaml list every action. The same observation and decisions as the detect-storage-changes poll (seed 000; retention of finished requests), with the same STORAGE_MIGRATOR_* settings (include/exclude, settle delay, poll period, retention); nothing is written. Of the default cluster, --cluster NAME (a KubernetesClusterConfig block), or --all-clusters (default and every cluster a run recorded, with a CLUSTER column). Exit codes: 0 done; 1 a cluster could not be read (with --all-clusters the others are still planned).
    """
    scope = scope_of(ctx, cluster, all_clusters)
    if scope.cluster is not None:
        plans = [_plan(ctx, scope.cluster, named=False)]
        failed: list[str] = []
    else:
        plans, failed = _fleet(ctx)
    for why in failed:
        print(f"storage-migrator: {why}", file=sys.stderr)
    data = [{"cluster": p.cluster, **a.model_dump(mode="json")} for p in plans for a in p.actions]
    emit(
        output,
        data,
        lambda: _fleet_table(plans) if scope.all else _table(plans[0].rows, heartbeats=plans[0].heartbeats),
    )
    if failed:
        raise typer.Exit(1)


def _fleet(ctx: typer.Context) -> tuple[list[_Plan], list[str]]:
    """Every cluster's plan, and why each cluster that could not be read was not (the others are still planned)."""
    plans, failed = each_recorded_cluster(lambda name: [_plan(ctx, name, named=True)])
    return [p for _, p in plans], failed


def _fleet_table(plans: list[_Plan]) -> str:
    """Every cluster's actions with a CLUSTER column, then each cluster's heartbeat-only count."""
    rows = [[p.cluster, *row] for p in plans for row in p.rows]
    beats = [f"{p.cluster}: {p.heartbeats} StorageState(s) unchanged: heartbeat only" for p in plans if p.heartbeats]
    head = render_table(["CLUSTER", "ACTION", "OBJECT", "REASON"], rows) if rows else "nothing to do"
    return "\n".join([head, *beats])


def _table(rows: list[list[str]], *, heartbeats: int) -> str:
    """The actions that change something, then the count of heartbeat-only StorageState writes."""
    beats = f"{heartbeats} StorageState(s) unchanged: heartbeat only" if heartbeats else ""
    if not rows:
        return "nothing to do" + (f" ({beats})" if beats else "")
    return render_table(["ACTION", "OBJECT", "REASON"], rows) + (f"\n{beats}" if beats else "")
