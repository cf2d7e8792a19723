"""One detection poll as a function: observe, plan, apply.

Both flows that poll call it: `detect-storage-changes` (every 10 minutes, then it
starts `run-migrations` for what it requested) and `run-migrations` (once at
its end, so a migration that just succeeded refines its StorageState at once,
issue 10). It starts nothing itself, so the two never call each other.
"""

from __future__ import annotations

from datetime import UTC, datetime

from prefect import get_run_logger
from prefect.artifacts import create_table_artifact
from pydantic import BaseModel, Field

from flows.events import emit_poll_changes
from storage_migrator.agreement import AgreementSource
from storage_migrator.detection import DeleteMigration, DetectionSettings, plan_detection
from storage_migrator.dispatch import plan_dispatch
from storage_migrator.retention import plan_retention
from storage_migrator.settings import Settings
from storage_migrator.tracking import select_resources
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


def detection_settings(settings: Settings) -> DetectionSettings:
    return DetectionSettings(
        settle_seconds=settings.settle_seconds,
        stale_after_seconds=settings.stale_after,
        retry_base_seconds=settings.retry_base_seconds,
        retry_max_seconds=settings.retry_max_seconds,
        poll_seconds=settings.poll_seconds,
    )


def poll(settings: Settings) -> PollSummary:
    """Seed 000's triggering controller, once: every decision is `plan_detection`'s, and
    `plan_retention`'s for finished requests older than `request_retention_seconds`
    (a Failed one only once a person annotates it `migration.k8s.io/acknowledged: "true"`)."""
    logger = get_run_logger()
    seen = observe(settings)
    if seen.failed_group_versions:
        # Deciding on a partial document could reset or refine the wrong states.
        logger.warning("discovery incomplete (%s): those resources are left for the next poll",
                       ", ".join(seen.failed_group_versions))  # fmt: skip
    logger.info("agreement from %s: %s", seen.agreement_source, ", ".join(seen.api_servers) or "one server")
    discovered = select_resources(seen.discovered, include=settings.include_resources,
                                  exclude=settings.exclude_resources)  # fmt: skip
    plan = plan_detection(
        discovered=discovered, states=seen.states, migrations=seen.migrations, crds=seen.crds,
        reporters=seen.reporters, now=datetime.now(UTC), settings=detection_settings(settings),
    )  # fmt: skip
    # Issue 11: finished requests past their retention go with the poll's other deletions.
    planned = {a.name for a in plan.of_kind(DeleteMigration)}
    expired = [a for a in plan_retention(seen.migrations, now=datetime.now(UTC),
                                         retention_seconds=settings.request_retention_seconds)
               if a.name not in planned]  # fmt: skip
    plan = plan.model_copy(update={"actions": [*plan.actions, *expired]})
    applied = apply_plan(settings, plan, seen.states)
    emit_poll_changes(applied.changes)
    rows = [{"action": a} for a in applied.done] + [{"action": f"FAILED {e}"} for e in applied.errors]
    if rows:
        create_table_artifact(table=rows, key="detect-storage-changes", description="What this poll changed")
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
    )
