"""`migrate-resource`: one flow run per StorageVersionMigration.

Reads like seed 002's migration worker: resolve the request, mark it Running,
then chunk after chunk (LIST a page, rewrite its objects, checkpoint the
continue token into the request) until the LIST is complete, then Succeeded or
Failed. A run killed at any point is resumed by the next run of the same
request from its stored token (seed 002 "Failure recovery"); deleting the
request cancels the run at its next checkpoint.

Seed 001 (DESIGN 4.4) guards it through the resource's StorageVersion object:
the run starts only while the API servers agree on an encoding version, stops
(checkpoint kept) when they no longer do, checked between chunks, and is not
marked Succeeded if the object's resourceVersion moved during the pass: it
makes a new pass from the beginning instead. Every verdict is
`decide_agreement`'s; this module only asks at the right moments.

    prefect deployment run 'migrate-resource/migrate-resource' -p resource=secrets
    migrate_resource(resource="deployments", group="apps")        # ephemeral, no server
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, cast
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import State
from prefect.events import emit_event
from prefect.runtime import flow_run
from prefect.states import Cancelled, Failed
from pydantic import BaseModel, Field

from storage_migrator.agreement import StorageVersionObservation, decide_agreement
from storage_migrator.chunks import MigrationAborted, add_progress
from storage_migrator.migrations import MigrationCancelled, failure_summary
from storage_migrator.models import (
    CONDITION_SUCCEEDED,
    MAX_RECORDED_FAILURES,
    MIGRATIONS_KIND_NAME,
    MigrationProgress,
    ObjectFailure,
)
from storage_migrator.settings import Settings
from tasks.migrating import (
    MigrationHandle,
    check_agreement,
    checkpoint,
    finish_migration,
    migrate_chunk_task,
    resolve_migration,
    restart_pass,
    start_migration,
)
from tasks.write_budget import RateLimitInfo, batch_for, ensure_write_rate_limit, release_writer, writer_lease

EVENT_PREFIX = "storage-migrator.migration"


class MigrationSummary(BaseModel):
    """What a run did (the flow's return value): names and counters only."""

    migration: str
    resource: str
    phase: str
    progress: MigrationProgress = Field(description="Counters of the last pass.")
    passes: int = Field(default=1, description="Passes over the resource (more when the storage version moved).")
    message: str = ""


def _run_name() -> str:
    params = flow_run.parameters
    if params.get("migration"):
        return f"migrate-{params['migration']}"
    group = f"-{params['group']}" if params.get("group") else ""
    version = f"-{params['version']}" if params.get("version") else ""
    return f"migrate-{params.get('resource')}{group}{version}"


def _artifact_key(name: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", f"migration-{name}".lower()).strip("-")[:100]


def _label_run(handle: MigrationHandle) -> None:
    """`migrate-secrets-v1-1a2b3c4d`, tagged with the resource, for the Prefect UI."""
    run_id = flow_run.id
    if run_id is None:
        return
    name = f"migrate-{handle.resource}{'-' + handle.group if handle.group else ''}-{handle.version}-{handle.uid[:8]}"
    try:
        with get_client(sync_client=True) as client:
            current = client.read_flow_run(run_id)
            tags = sorted({*(current.tags or []), f"resource:{handle.group_resource}", f"migration:{handle.name}"})
            client.update_flow_run(run_id, name=name, tags=tags)
    except Exception as exc:  # noqa: BLE001 - a label is not worth failing a migration
        get_run_logger().warning("could not rename the flow run: %s", exc)


def _emit(outcome: str, handle: MigrationHandle, progress: MigrationProgress, message: str = "") -> None:
    emit_event(
        event=f"{EVENT_PREFIX}.{outcome}",
        resource={
            "prefect.resource.id": f"storage-migrator.storageversionmigration.{handle.name}",
            "prefect.resource.name": handle.name,
            "storage-migrator.resource": handle.group_resource,
        },
        payload={"progress": progress.model_dump(), "message": message[:1000]},
    )


def _percent(progress: MigrationProgress) -> float:
    if progress.remaining_item_count is None:
        return 0.0
    total = progress.listed + progress.remaining_item_count
    return 100.0 * progress.listed / total if total else 100.0


def _outcome_table(handle: MigrationHandle, progress: MigrationProgress, phase: str) -> None:
    counts = progress.model_dump(exclude={"remaining_item_count"})
    create_table_artifact(
        table=[{"outcome": k, "objects": v} for k, v in counts.items()],
        key=_artifact_key(f"{handle.name}-outcome"),
        description=f"{handle.ref}: {phase}",
    )


def _fail(settings: Settings, handle: MigrationHandle, progress: MigrationProgress, *, reason: str,
          message: str) -> State[Any]:  # fmt: skip
    finish_migration(settings, handle, succeeded=False, reason=reason, message=message)
    _outcome_table(handle, progress, "Failed")
    _emit("failed", handle, progress, message)
    return Failed(message=f"{handle.name}: {message}")


@dataclass
class Passes:
    """Where the chunk loop stands (updated as it goes, so a stopped run reports its counters)."""

    progress: MigrationProgress
    failures: list[ObjectFailure]
    token: str | None
    passes: int = 1


def _migrate_passes(
    settings: Settings,
    handle: MigrationHandle,
    budget: RateLimitInfo,
    run: Passes,
    baseline: StorageVersionObservation | None,
    artifact: UUID,
) -> None:
    """Chunk after chunk until the LIST is complete, asking after each checkpoint
    whether the API servers still agree (seed 001), and again from the beginning
    while the storage version moved during the pass. Raises `MigrationAborted`
    (agreement lost, or a verdict of the chunk loop) and `MigrationCancelled`."""
    while True:
        chunk = migrate_chunk_task(settings, handle, run.token, budget)
        if chunk.token_out is None:
            release_writer(budget)  # the last write is done: the others get its share now
        run.progress = add_progress(run.progress, chunk)
        run.failures = (run.failures + chunk.failures)[:MAX_RECORDED_FAILURES]
        checkpoint(settings, handle, token=chunk.token_out, progress=run.progress, failures=run.failures)
        update_progress_artifact(artifact_id=artifact, progress=_percent(run.progress))
        run.token = chunk.token_out
        now = check_agreement(settings, handle)
        verdict = decide_agreement(resource=handle.group_resource, moment="end" if run.token is None else "chunk",
                                   baseline=baseline, now=now, passes=run.passes)  # fmt: skip
        if verdict.action == "abort":
            raise MigrationAborted(verdict.reason, verdict.message)
        if verdict.action == "rerun":
            get_run_logger().warning("%s", verdict.message)
            restart_pass(settings, handle, reason=verdict.reason, message=verdict.message)
            run.progress, run.failures, run.token = MigrationProgress(), [], None
            run.passes, baseline = run.passes + 1, now
            continue
        if run.token is None:
            return


@flow(name="migrate-resource", flow_run_name=_run_name, persist_result=False, log_prints=False)
def migrate_resource(
    resource: str | None = None,
    group: str = "",
    version: str | None = None,
    migration: str | None = None,
    chunk_size: int | None = None,
    write_rate_per_second: float | None = None,
    write_concurrency: int | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
) -> MigrationSummary | State[Any]:
    """Migrate one resource: `migration` names an existing request; else `resource`
    (with `group`, `version`) creates one. Other parameters override the settings."""
    logger = get_run_logger()
    settings = Settings.with_overrides(
        chunk_size=chunk_size, write_rate_per_second=write_rate_per_second, write_concurrency=write_concurrency,
        kubeconfig=kubeconfig, context=context,
    )  # fmt: skip
    handle = resolve_migration(settings, resource=resource, group=group, version=version, migration=migration)
    _label_run(handle)
    if handle.finished:
        logger.info("%s/%s has already %s: nothing to do", MIGRATIONS_KIND_NAME, handle.name, handle.finished)
        return MigrationSummary(migration=handle.name, resource=handle.group_resource, phase=handle.finished,
                                progress=MigrationProgress())  # fmt: skip
    if settings.shared_write_budget:
        budget = ensure_write_rate_limit(
            settings.rate_limit_name, settings.write_rate_per_second, explicit=write_rate_per_second is not None
        )
    else:
        budget = RateLimitInfo(name=None, writes_per_second=settings.write_rate_per_second,
                               batch=batch_for(settings.write_rate_per_second))  # fmt: skip
    # Seed 001: start only while the servers agree. A resumed run takes its baseline
    # here too: a move between the crash and the resume is not seen (the request
    # has no field to carry the first start's resourceVersion).
    baseline = check_agreement(settings, handle)
    verdict = decide_agreement(resource=handle.group_resource, moment="start", baseline=None, now=baseline)
    if verdict.action == "abort":
        logger.warning("%s: %s", handle.name, verdict.message)
        return _fail(settings, handle, MigrationProgress(), reason=verdict.reason, message=verdict.message)
    try:
        start = start_migration(settings, handle, flow_run=str(flow_run.id) if flow_run.id else None)
    except MigrationCancelled as exc:
        return Cancelled(message=str(exc))
    _emit("started", handle, start.progress)
    logger.info("migrating %s (%s, %s mode) from %s", handle.ref, handle.name, handle.write_mode,
                "its checkpoint" if start.token else "the beginning")  # fmt: skip
    artifact = cast(UUID, create_progress_artifact(progress=_percent(start.progress), key=_artifact_key(handle.name),
                                                   description=f"Migrating {handle.ref} ({handle.name})"))  # fmt: skip
    run = Passes(progress=start.progress, failures=list(start.failures), token=start.token)
    try:
        # One writer's lease for the whole run: its share of the budget (tasks/write_budget.py).
        with writer_lease(budget.model_copy(update={"holder": handle.name})) as held:
            _migrate_passes(settings, handle, held, run, baseline, artifact)
    except MigrationCancelled as exc:
        logger.warning("%s", exc)
        _emit("cancelled", handle, run.progress, str(exc))
        return Cancelled(message=str(exc))
    except MigrationAborted as exc:
        logger.warning("%s: %s", handle.name, exc.message)
        return _fail(settings, handle, run.progress, reason=exc.reason, message=exc.message)
    progress = run.progress
    update_progress_artifact(artifact_id=artifact, progress=100.0)
    if progress.failed:
        message = failure_summary(run.failures, progress.failed)
        return _fail(settings, handle, progress, reason="ObjectsFailed", message=message)
    message = (f"{progress.listed} objects: {progress.rewritten} rewritten, {progress.unchanged} unchanged, "
               f"{progress.gone} gone, {progress.conflicted} written by others meanwhile")  # fmt: skip
    if run.passes > 1:
        message += f" (pass {run.passes}: the storage version moved during the earlier ones)"
    finish_migration(settings, handle, succeeded=True, reason="Completed", message=message)
    _outcome_table(handle, progress, "Succeeded")
    _emit("succeeded", handle, progress, message)
    logger.info("%s succeeded: %s", handle.name, message)
    return MigrationSummary(migration=handle.name, resource=handle.group_resource, phase=CONDITION_SUCCEEDED,
                            progress=progress, passes=run.passes, message=message)  # fmt: skip
