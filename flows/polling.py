"""One detection poll as a function: observe, plan, apply.

The flows that poll call it: `detect-storage-changes` (every 10 minutes, then it
starts `run-migrations` for what it requested), `run-migrations` (once at its
end, so a migration that just succeeded refines its StorageState at once,
issue 10), and `initialize`, whose first look at every resource is this poll
with the report of `plan_initialization` (issue 24). It starts nothing itself,
so the flows never call each other through it.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from prefect import get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.runtime import flow_run
from pydantic import BaseModel, Field

from flows.events import emit_in_tree, emit_poll_changes
from storage_migrator.agreement.storage_versions import AgreementSource
from storage_migrator.detection.observation import Observations
from storage_migrator.detection.planner import DETECTION_LABEL_VALUE, DeleteMigration, DetectionPlan
from storage_migrator.detection.poll import plan_poll
from storage_migrator.detection.tracking import select_resources
from storage_migrator.fleet.names import cluster_name, scoped_key
from storage_migrator.kube.discovery import DiscoveredResource
from storage_migrator.ledger.in_tree import record_in_tree
from storage_migrator.ledger.recorder import writer_from_settings
from storage_migrator.ledger.records import PollRecord
from storage_migrator.migration.dispatch import plan_dispatch
from storage_migrator.settings import Settings
from tasks.detecting import Applied, apply_plan, observe


class PollSummary(BaseModel):
    """What one poll did, and which source told it what each API server encodes."""

    applied: Applied
    skipped: dict[str, str]
    agreement_source: AgreementSource = Field(description="DESIGN 4.4: where the reporters' hashes came from.")
    api_servers: list[str] = Field(default_factory=list, description="The reporters heard in this poll.")
    runnable: list[str] = Field(
        default_factory=list,
        description=(
            "Requests that run-migrations would start now, whoever made them (DESIGN 4.6: all are run); "
            "not those running under a live lease."
        ),
    )
    in_tree: list[str] = Field(
        default_factory=list,
        description=(
            "Issue 36: in-tree migrations (storagemigration.k8s.io, anyone's) this poll saw in a phase the "
            "ledger had not recorded: '<name> <resource> <phase>'; each got a ledger row and an event."
        ),
    )


#: The longest a poll waits for its in-tree rows to be written (the next poll reads them to know what it saw).
IN_TREE_FLUSH_SECONDS = 5.0


def tracked(seen: Observations, settings: Settings) -> list[DiscoveredResource]:
    """The resources this poll followed (the include / exclude settings), as the ledger counts them."""
    return select_resources(seen.discovered, include=settings.include_resources, exclude=settings.exclude_resources)


def poll(settings: Settings) -> PollSummary:
    """Seed 000's triggering controller, once: every decision is `plan_poll`'s (seed 000's
    `plan_detection`, and `plan_retention`'s for finished requests past their retention),
    the same plan `storage-migrator plan` prints."""
    began, clock = datetime.now(UTC), time.monotonic()
    seen = look(settings)
    return carry_out(settings, seen, plan_poll(seen, settings, now=datetime.now(UTC)), began=began, clock=clock)


def look(settings: Settings) -> Observations:
    """What the poll sees (the `observe` task), with what it could not see in the log."""
    logger = get_run_logger()
    seen = observe(settings)
    if seen.failed_group_versions:
        # Deciding on a partial document could reset or refine the wrong states.
        logger.warning("discovery incomplete (%s): those resources are left for the next poll",
                       ", ".join(seen.failed_group_versions))  # fmt: skip
    logger.info("agreement from %s: %s", seen.agreement_source, ", ".join(seen.api_servers) or "one server")
    return seen


def carry_out(
    settings: Settings,
    seen: Observations,
    plan: DetectionPlan,
    *,
    began: datetime,
    clock: float,
    requested_by: str = DETECTION_LABEL_VALUE,
) -> PollSummary:
    """Apply a poll's plan, then its ledger row, events and artifact; what run-migrations would start.

    `initialize` applies its plan here too (issue 24: one path), its requests
    labelled `requested-by=initialize`; `began` / `clock` are when the poll began."""
    applied = apply_plan(settings, plan, seen.states, requested_by=requested_by)
    in_tree = note_in_tree(settings, seen)
    # Issue 12: one ledger row per poll, queued in-process (never a failure of the poll).
    writer_from_settings(settings).submit(PollRecord(
        started_at=began, finished_at=datetime.now(UTC), duration_seconds=time.monotonic() - clock,
        cluster=cluster_name(settings.cluster),
        resources_seen=len(tracked(seen, settings)), changes=len(applied.done) - applied.heartbeats,
        requests_made=len(applied.created_migrations),
        errors=len(applied.errors), flow_run_id=str(flow_run.id) if flow_run.id else None,
    ))  # fmt: skip
    emit_poll_changes(applied.changes)
    rows = [{"action": a} for a in applied.done] + [{"action": f"FAILED {e}"} for e in applied.errors]
    rows += [{"action": f"observed in-tree migration {line}"} for line in in_tree]
    if rows:
        create_table_artifact(
            table=rows,
            key=scoped_key("detect-storage-changes", settings.cluster),
            description="What this poll changed",
        )
    deleted = {a.name for a in plan.of_kind(DeleteMigration)}
    kept = [m for m in seen.migrations if m.metadata.name not in deleted]
    startable = plan_dispatch(kept, now=datetime.now(UTC), max_parallel=settings.max_parallel_migrations,
                              lease_seconds=settings.lease_seconds).start  # fmt: skip
    return PollSummary(
        applied=applied,
        skipped={s.group_resource: s.reason for s in plan.skipped},
        agreement_source=seen.agreement_source,
        api_servers=seen.api_servers,
        runnable=sorted({*startable, *applied.created_migrations}),
        in_tree=in_tree,
    )


def note_in_tree(settings: Settings, seen: Observations) -> list[str]:
    """Issue 36: a ledger row and an event for each in-tree migration (anyone's) in a phase the ledger has
    not recorded; what the report lists. Never a failure of the poll: a ledger that cannot be read is a
    warning, and a later poll records them."""
    if not seen.in_tree:
        return []
    logger = get_run_logger()
    writer = writer_from_settings(settings)
    try:
        fresh = record_in_tree(writer, seen.in_tree, cluster=cluster_name(settings.cluster), now=datetime.now(UTC),
                               flow_run_id=str(flow_run.id) if flow_run.id else None)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the ledger never fails a poll (issue 12)
        logger.warning("in-tree migrations not recorded by this poll: the ledger could not be read (%s); "
                       "a later poll records them", exc)  # fmt: skip
        return []
    lines = []
    for migration in fresh:
        emit_in_tree(migration)
        who = migration.created_by or "creator unknown"
        lines.append(f"{migration.display_name} ({migration.api_version}, {who}) {migration.group_resource} "
                     f"{migration.phase}")  # fmt: skip
        logger.info("observed in-tree migration %s", lines[-1])
    if fresh:
        writer.flush(IN_TREE_FLUSH_SECONDS)  # the next poll, maybe in another process, reads what this one saw
    return lines
