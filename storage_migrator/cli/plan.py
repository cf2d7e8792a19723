"""``storage-migrator plan``: what the next detection poll would do, without doing it.

Issue 12 item 2. The same observation (storage_migrator/detection/observation.py) and the
same decisions (storage_migrator/detection/poll.py) as the detect-storage-changes
poll, with the same settings; nothing is written. The actions carry our own
objects' names and hashes only, never a migrated object's data.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import typer

from storage_migrator.cli.options import kube_api, settings_of
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


def command(ctx: typer.Context, output: Output = OutputFormat.table) -> None:
    """What the next detection poll would do, without doing it: its actions, in order.

    The table lists the actions that change something and counts the StorageStates whose heartbeat alone is written ("nothing to do" when that is all); -o json / yaml list every action. The same observation and decisions as the detect-storage-changes poll (seed 000; retention of finished requests), with the same STORAGE_MIGRATOR_* settings (include/exclude, settle delay, poll period, retention); nothing is written. Exit codes: 0 done; 1 the cluster could not be read.
    """
    settings = settings_of(ctx)
    with kube_api(settings) as api:
        seen = observe_cluster(api, settings)
    if seen.failed_group_versions:
        print(f"warning: discovery incomplete ({', '.join(seen.failed_group_versions)}): the poll leaves "
              "those resources for the next one", file=sys.stderr)  # fmt: skip
    for server, why in seen.unheard.items():
        print(f"warning: API server {server} not heard: {why}", file=sys.stderr)
    plan = plan_poll(seen, settings, now=datetime.now(UTC))
    states = {s.metadata.name: s for s in seen.states}
    # The table is for people: a write of nothing but heartbeats is counted, not listed (JSON / YAML list it).
    beats = {id(a) for a in plan.of_kind(UpdateState) if is_heartbeat(a, states.get(a.name))}
    rows = [[a.kind, target(a), a.reason] for a in plan.actions if id(a) not in beats]
    emit(output, [a.model_dump(mode="json") for a in plan.actions],
         lambda: _table(rows, heartbeats=len(beats)))  # fmt: skip


def _table(rows: list[list[str]], *, heartbeats: int) -> str:
    """The actions that change something, then the count of heartbeat-only StorageState writes."""
    beats = f"{heartbeats} StorageState(s) unchanged: heartbeat only" if heartbeats else ""
    if not rows:
        return "nothing to do" + (f" ({beats})" if beats else "")
    return render_table(["ACTION", "OBJECT", "REASON"], rows) + (f"\n{beats}" if beats else "")
