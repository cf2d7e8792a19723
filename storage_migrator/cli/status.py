"""``storage-migrator status``: one row per resource, like ``kubectl get``.

DESIGN 4.10: current hash, persisted hashes, and the last migration's phase,
progress, rate and ETA (storage_migrator/operations/overview.py decides each value).
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import typer

from storage_migrator.cli.options import kube_api, settings_of
from storage_migrator.cli.output import Output, OutputFormat, emit, render_table
from storage_migrator.detection.states import list_states
from storage_migrator.kube.errors import NotFound
from storage_migrator.migration.requests import list_migrations
from storage_migrator.models import MIGRATIONS_KIND_NAME, STATES_KIND_NAME
from storage_migrator.operations.overview import ResourceOverview, overview, resource_name

__all__ = ["command"]

HEADERS = ["RESOURCE", "CURRENT HASH", "PERSISTED HASHES", "MIGRATION", "PHASE", "PROGRESS", "RATE", "ETA"]


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


def _table(rows: list[ResourceOverview]) -> str:
    return render_table(HEADERS, [
        [resource_name(r), r.current_hash or "-", ",".join(r.persisted_hashes) or "-", r.migration or "-",
         r.phase or "-", _progress(r), f"{r.rate:g}/s" if r.rate is not None else "-",
         duration(r.eta_seconds) if r.eta_seconds is not None else "-"]
        for r in rows
    ])  # fmt: skip


def command(ctx: typer.Context, output: Output = OutputFormat.table) -> None:
    """One row per resource: current hash, persisted hashes, the last migration's phase, progress, rate and ETA.

    Read from the StorageStates and StorageVersionMigrations of the cluster (nothing is written). Exit codes: 0 done; 1 the cluster could not be read (or the migration CRDs are not installed).
    """
    settings = settings_of(ctx)
    with kube_api(settings) as api:
        try:
            states, migrations = list_states(api), list_migrations(api)
        except NotFound as exc:
            print(f"storage-migrator: {STATES_KIND_NAME} or {MIGRATIONS_KIND_NAME} is not served ({exc}): "
                  "install the CRDs with `kubectl apply -f deployments/crds/`", file=sys.stderr)  # fmt: skip
            raise typer.Exit(1) from exc
    rows = overview(states, migrations, now=datetime.now(UTC))
    if not rows and output is OutputFormat.table:
        print("No resources found: no StorageStates and no migrations yet", file=sys.stderr)  # as kubectl get
        return
    emit(output, [r.model_dump(mode="json") for r in rows], lambda: _table(rows))
