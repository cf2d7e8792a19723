"""`detect-storage-changes`: one poll of seed 000's storage migration triggering controller.

Reads like the seed: fetch the discovery document, the StorageStates and the
migrations; decide (a pure plan: create states, touch heartbeats, record a new
storage version hash and request a migration once it has settled, refine
`persistedStorageVersionHashes` when a migration to the current hash has
succeeded, trim a CRD's `storedVersions`); apply; and start `run-migrations`
for what it requested. The 10-minute cadence is the Prefect scheduler's
(prefect.yaml); the deployment's concurrency limit of 1 keeps a slow poll from
overlapping the next, which makes one poll at a time our "leader".
"""

from __future__ import annotations

from datetime import UTC, datetime

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.deployments import run_deployment
from prefect.runtime import deployment
from pydantic import BaseModel

from flows.run_migrations import run_migrations
from storage_migrator.detection import DetectionSettings, plan_detection
from storage_migrator.settings import Settings
from tasks.detecting import Applied, apply_plan, observe

RUN_MIGRATIONS_DEPLOYMENT = "run-migrations/run-migrations"


class PollSummary(BaseModel):
    applied: Applied
    skipped: dict[str, str]


@flow(name="detect-storage-changes", persist_result=False, log_prints=False)
def detect_storage_changes(
    settle_seconds: float | None = None,
    poll_seconds: float | None = None,
    start_migrations: bool = True,
    kubeconfig: str | None = None,
    context: str | None = None,
) -> PollSummary:
    """One poll. `poll_seconds` is the period staleness is judged against (two periods),
    `settle_seconds` the delay after a change before a migration is requested."""
    logger = get_run_logger()
    settings = Settings.with_overrides(settle_seconds=settle_seconds, poll_seconds=poll_seconds,
                                       kubeconfig=kubeconfig, context=context)  # fmt: skip
    seen = observe(settings)
    if seen.failed_group_versions:
        # Deciding on a partial document could reset or refine the wrong states.
        logger.warning("discovery incomplete (%s): those resources are left for the next poll",
                       ", ".join(seen.failed_group_versions))  # fmt: skip
    plan = plan_detection(
        discovered=seen.discovered, states=seen.states, migrations=seen.migrations, crds=seen.crds,
        now=datetime.now(UTC),
        settings=DetectionSettings(settle_seconds=settings.settle_seconds, stale_after_seconds=settings.stale_after,
                                   retry_base_seconds=settings.retry_base_seconds,
                                   retry_max_seconds=settings.retry_max_seconds),
    )  # fmt: skip
    applied = apply_plan(settings, plan, seen.states)
    rows = [{"action": a} for a in applied.done] + [{"action": f"FAILED {e}"} for e in applied.errors]
    if rows:
        create_table_artifact(table=rows, key="detect-storage-changes", description="What this poll changed")
    if applied.created_migrations and start_migrations:
        if deployment.id is not None:
            run_deployment(RUN_MIGRATIONS_DEPLOYMENT, timeout=0, as_subflow=False)
        else:
            run_migrations(kubeconfig=kubeconfig, context=context)
    return PollSummary(applied=applied, skipped={s.group_resource: s.reason for s in plan.skipped})
