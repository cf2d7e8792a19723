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

A request that names an encryption key (a rotation's) is guarded the same way by
the API servers' encryption configurations (issue 19, flows/server_config_gate.py):
no write until every server reports one configuration hash, checked again
between chunks and before Succeeded; servers that diverge stop it, one new
common configuration makes a new pass.

    prefect deployment run 'migrate-resource/migrate-resource' -p resource=secrets
    migrate_resource(resource="deployments", group="apps")        # ephemeral, no server
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, cast
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import State
from prefect.context import FlowRunContext
from prefect.futures import PrefectFuture
from prefect.runtime import flow_run
from prefect.states import Cancelled, Failed
from pydantic import BaseModel, Field

from flows.best_effort import ProgressBar, best_effort, reported_end
from flows.cluster_scope import cluster_settings, entered_cluster
from flows.events import delivered_events, emit_migration
from flows.in_tree_engine import in_tree_engine
from flows.run_logs import our_logs_in_the_run
from flows.server_config_gate import GateOutcome, check_configs, wait_for_one_config
from storage_migrator.agreement.storage_versions import (
    AgreementMoment,
    AgreementVerdict,
    StorageVersionObservation,
    decide_agreement,
)
from storage_migrator.fleet.names import cluster_name, scoped_key
from storage_migrator.ledger.recorder import RunRecorder, writer_from_settings
from storage_migrator.migration.chunk_terms import MigrationAborted, add_progress
from storage_migrator.migration.dispatch import was_presumed_dead
from storage_migrator.migration.request_lease import RequestHeld, RequestLease
from storage_migrator.migration.requests import MigrationCancelled, failure_summary
from storage_migrator.models import (
    CONDITION_SUCCEEDED,
    MAX_RECORDED_FAILURES,
    MIGRATIONS_KIND_NAME,
    MigrationProgress,
    ObjectFailure,
)
from storage_migrator.settings import EngineSetting, Settings
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
from tasks.request_lease import WriteShare, held_request, write_share
from tasks.server_configs import observe_configs

#: The progress artifact is updated at most this often (one API call; issue 13).
ARTIFACT_SECONDS = 5.0


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


def _artifact_key(name: str, cluster: str | None) -> str:
    return scoped_key(f"migration-{name}", cluster)


def _label_run(handle: MigrationHandle, cluster: str | None) -> None:
    """`migrate-secrets-v1-1a2b3c4d` (`<cluster>:migrate-...` for a named cluster), tagged with
    the resource and the request, for the Prefect UI (entered_cluster tagged the cluster)."""
    run_id = flow_run.id
    if run_id is None:
        return
    name = f"migrate-{handle.resource}{'-' + handle.group if handle.group else ''}-{handle.version}-{handle.uid[:8]}"
    if cluster is not None:
        name = f"{cluster}:{name}"
    try:
        with get_client(sync_client=True) as client:
            current = client.read_flow_run(run_id)
            tags = sorted({*(current.tags or []), f"resource:{handle.group_resource}", f"migration:{handle.name}"})
            client.update_flow_run(run_id, name=name, tags=tags)
    except Exception as exc:  # noqa: BLE001 - a label is not worth failing a migration
        get_run_logger().warning("could not rename the flow run: %s", exc)


def _emit(outcome: str, handle: MigrationHandle, progress: MigrationProgress, message: str = "",
          failures: list[ObjectFailure] | None = None) -> None:  # fmt: skip
    emit_migration(outcome, migration=handle.name, group_resource=handle.group_resource, progress=progress,
                   message=message, failures=failures)  # fmt: skip


def _percent(progress: MigrationProgress) -> float:
    if progress.remaining_item_count is None:
        return 0.0
    total = progress.listed + progress.remaining_item_count
    return 100.0 * progress.listed / total if total else 100.0


def _outcome_table(settings: Settings, handle: MigrationHandle, progress: MigrationProgress, phase: str) -> None:
    counts = progress.model_dump(exclude={"remaining_item_count"})
    with best_effort("the outcome table artifact"):
        create_table_artifact(
            table=[{"outcome": k, "objects": v} for k, v in counts.items()],
            key=_artifact_key(f"{handle.name}-outcome", settings.cluster),
            description=f"{handle.ref}: {phase}",
        )


def _fail(settings: Settings, handle: MigrationHandle, rec: RunRecorder, progress: MigrationProgress, *,
          reason: str, message: str, passes: int = 1, failures: list[ObjectFailure] | None = None) -> State[Any]:  # fmt: skip
    finish_migration(settings, handle, succeeded=False, reason=reason, message=message)
    rec.ended("failed", progress, reason=reason, message=message, passes=passes)
    _outcome_table(settings, handle, progress, "Failed")
    _emit("failed", handle, progress, message, failures or [])
    return Failed(message=f"{handle.name}: {message}")


@dataclass
class Passes:
    """Where the chunk loop stands (updated as it goes, so a stopped run reports its counters)."""

    progress: MigrationProgress
    failures: list[ObjectFailure]
    token: str | None
    passes: int = 1
    #: Issue 19: the encryption configuration hash the pass began under (runs that name a key).
    config_hash: str | None = None


def verdict_notes(handle: MigrationHandle, rec: RunRecorder, *, passes: int, config_hash: str | None) -> str:
    """What a Succeeded verdict adds to its counts, on either engine: the passes it took, and for a
    key the encryption configuration every API server ran (or that the check was overridden)."""
    notes = ""
    if passes > 1:
        notes += f" (pass {passes}: the storage version or encryption configuration moved during the earlier ones)"
    if handle.encryption_key:
        notes += (f"; key {handle.encryption_key}, every API server running encryption configuration "
                  f"{config_hash}" if rec.server_check == "agreed" else
                  f"; key {handle.encryption_key}, the API servers' check OVERRIDDEN")  # fmt: skip
    return notes


def _forget_task_results(*finished: PrefectFuture[Any]) -> None:
    """Drop what Prefect keeps of the chunk's finished task runs until the flow run ends.

    Prefect links each task result (and, one level down, each of its fields) to a copy of
    its state so that passing a result to another task draws a dependency, and its thread
    pool keeps a cancel event per submitted task: together about 6.5 KB per chunk, the
    flow's memory growing 13 MB over 10^6 objects (bench/scale.py, issue 13: "flat").
    This flow passes no task's result to another task, and `finished` are done,
    so nothing is lost. Both are Prefect internals, still kept until the flow run ends in
    3.9.1 (checked), hence the guards and the test that reads them (test_migrate_flow.py)."""
    context = FlowRunContext.get()
    if context is None:
        return
    context.run_results.clear()
    cancel_events = getattr(context.task_runner, "_cancel_events", None)
    if isinstance(cancel_events, dict):
        for future in finished:
            cancel_events.pop(future.task_run_id, None)


def _worst(*verdicts: AgreementVerdict) -> AgreementVerdict:
    """Abort over a new pass over going on: each check can only make the run more careful."""
    return max(verdicts, key=lambda v: ("go", "rerun", "abort").index(v.action))


def _migrate_passes(
    settings: Settings,
    handle: MigrationHandle,
    share: WriteShare,
    run: Passes,
    baseline: StorageVersionObservation | None,
    bar: ProgressBar | None,
    rec: RunRecorder,
) -> None:
    """Chunk after chunk until the LIST is complete, asking after each checkpoint
    whether the API servers still agree (seed 001), and again from the beginning
    while the storage version moved during the pass. Raises `MigrationAborted`
    (agreement lost, or a verdict of the chunk loop) and `MigrationCancelled`."""
    shown = time.monotonic()
    while True:
        began = time.monotonic()
        chunk = migrate_chunk_task(settings, handle, run.token)
        if chunk.token_out is None:
            share.leave()  # the last write is done: the others get its share now
        run.progress = add_progress(run.progress, chunk)
        run.failures = (run.failures + chunk.failures)[:MAX_RECORDED_FAILURES]
        # Issue 13: the checkpoint and the agreement check run side by side (both after the
        # chunk settled, both before the next one writes); the artifact follows at most every
        # ARTIFACT_SECONDS. Bookkeeping between chunks is time the writers stand idle.
        saved = checkpoint.submit(settings, handle, token=chunk.token_out, progress=run.progress,
                                  failures=run.failures, pass_resource_version=chunk.pass_resource_version)  # fmt: skip
        asked = check_agreement.submit(settings, handle)
        heard = observe_configs.submit(settings) if handle.encryption_key else None
        if bar is not None and time.monotonic() - shown >= ARTIFACT_SECONDS:
            bar.show(_percent(run.progress))  # issue 37: a thread of its own shows it; never waited on
            shown = time.monotonic()
        saved.result()
        rec.chunk(chunk, duration_seconds=time.monotonic() - began, progress=run.progress)
        run.token = chunk.token_out
        now = asked.result()
        moment: AgreementMoment = "end" if run.token is None else "chunk"
        verdict = decide_agreement(resource=handle.group_resource, moment=moment, baseline=baseline, now=now,
                                   passes=run.passes)  # fmt: skip
        configs = heard.result() if heard is not None else None
        if configs is not None:
            verdict = _worst(verdict, check_configs(configs, moment=moment, baseline=run.config_hash,
                                                    passes=run.passes, override=handle.skip_server_check))  # fmt: skip
        _forget_task_results(saved, asked, *([heard] if heard is not None else []))
        if verdict.action == "abort":
            raise MigrationAborted(verdict.reason, verdict.message)
        if verdict.action == "rerun":
            get_run_logger().warning("%s", verdict.message)
            if configs is not None and configs.common_hash is not None:
                run.config_hash = rec.encryption_config_hash = configs.common_hash
            restart_pass(settings, handle, reason=verdict.reason, message=verdict.message, config_hash=run.config_hash)
            run.progress, run.failures, run.token = MigrationProgress(), [], None
            run.passes, baseline = run.passes + 1, now
            share.join()  # left after the last chunk of the pass before
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
    cluster: str | None = None,
    engine: EngineSetting | None = None,
) -> MigrationSummary | State[Any]:
    """Migrate one resource: `migration` names an existing request; else `resource`
    (with `group`, `version`) creates one. `cluster` names a KubernetesClusterConfig
    block (issue 20; left out: the cluster of the environment). `engine` (issue 36):
    client, in-tree or auto; in pull mode only the install's may be named. Other
    parameters override the settings."""
    # Issue 12: an ephemeral run ends once its events are stored; our threads' warnings reach its log.
    with delivered_events(), our_logs_in_the_run():
        return _migrate(resource=resource, group=group, version=version, migration=migration,
                        chunk_size=chunk_size, write_rate_per_second=write_rate_per_second,
                        write_concurrency=write_concurrency, kubeconfig=kubeconfig, context=context,
                        cluster=cluster, engine=engine)  # fmt: skip


def _migrate(
    *,
    resource: str | None,
    group: str,
    version: str | None,
    migration: str | None,
    chunk_size: int | None,
    write_rate_per_second: float | None,
    write_concurrency: int | None,
    kubeconfig: str | None,
    context: str | None,
    cluster: str | None,
    engine: EngineSetting | None,
) -> MigrationSummary | State[Any]:
    """The run itself (see the module docstring)."""
    dead = _marked_dead()
    if dead is not None:
        get_run_logger().warning("%s", dead)
        return Cancelled(message=dead)
    settings = cluster_settings(
        cluster, chunk_size=chunk_size, write_rate_per_second=write_rate_per_second,
        write_concurrency=write_concurrency, kubeconfig=kubeconfig, context=context, engine=engine,
    )  # fmt: skip
    # Issue 37: a run that ends while the Prefect server is down reports its end once it answers.
    # Issue 20: the cluster is the one recorded under its name, before anything is written (a request included).
    with reported_end(settings.prefect_outage_seconds), entered_cluster(settings):
        return _resolve_and_run(settings, resource=resource, group=group, version=version, migration=migration)


def _marked_dead() -> str | None:
    """Why this run must not start: a dispatcher presumed it dead and resumed its request elsewhere."""
    run_id = flow_run.id
    if run_id is None:
        return None
    with get_client(sync_client=True) as client:
        history = [(str(s.type.value), s.message) for s in client.read_flow_run_states(run_id)]
    if not was_presumed_dead(history):
        return None
    return ("a run-migrations dispatcher marked this run Crashed before it started (it was slower to start than "
            "lease_seconds) and resumed its request in another run: nothing written here")  # fmt: skip


def _resolve_and_run(settings: Settings, *, resource: str | None, group: str, version: str | None,
                     migration: str | None) -> MigrationSummary | State[Any]:  # fmt: skip
    """The request resolved (or created) and its Lease taken, the run labelled and recorded, then `_run`."""
    logger = get_run_logger()
    handle = resolve_migration(settings, resource=resource, group=group, version=version, migration=migration)
    if flow_run.id is not None:  # issue 31: the run claims the request at its start; its writes are fenced
        handle = handle.model_copy(update={"owner": str(flow_run.id)})
    _label_run(handle, settings.cluster)
    if handle.finished:
        logger.info("%s/%s has already %s: nothing to do", MIGRATIONS_KIND_NAME, handle.name, handle.finished)
        return MigrationSummary(migration=handle.name, resource=handle.group_resource, phase=handle.finished,
                                progress=MigrationProgress())  # fmt: skip
    try:
        # Issue 37: one writer per request. Taken before anything of the request is written; a live
        # holder's request is refused here, its holder and its Lease's end named, nothing written.
        with held_request(settings, name=handle.name, uid=handle.uid, flow_run=handle.owner) as lease:
            if lease.taken != "created":
                logger.warning("%s", lease.taken)
            return _recorded_run(settings, handle, lease)
    except RequestHeld as exc:
        logger.warning("%s", exc.message)
        return Cancelled(message=exc.message)


def _recorded_run(settings: Settings, handle: MigrationHandle, lease: RequestLease) -> MigrationSummary | State[Any]:
    """`_run`, recorded in the ledger."""
    # Issue 12: the ledger records in-process (no task runs); a ledger outage only delays its rows.
    rec = RunRecorder.begin(
        writer_from_settings(settings), migration=handle.name, migration_uid=handle.uid,
        resource=handle.group_resource, version=handle.version, target_hash=handle.target_hash,
        encryption_key=handle.encryption_key, requested_by=handle.requested_by,
        flow_run_id=str(flow_run.id) if flow_run.id else None,
        cluster=cluster_name(settings.cluster),
    )  # fmt: skip
    try:
        return _run(settings, handle, rec, lease)
    except BaseException as exc:
        rec.ended("crashed", rec.progress, reason=type(exc).__name__,
                  message="the run stopped on an error: see the flow run's logs")  # fmt: skip
        raise
    finally:
        if not rec.writer.failing:  # during an outage the rows wait in the background instead
            rec.writer.flush(settings.ledger_flush_seconds)


def _gate(settings: Settings, handle: MigrationHandle, rec: RunRecorder) -> GateOutcome | None:
    """Issue 19: a request that names a key waits until every API server runs one configuration."""
    if not handle.encryption_key:
        return None
    gate = wait_for_one_config(settings, what=f"{handle.name} (key {handle.encryption_key})", key=handle.name,
                               override=handle.skip_server_check)  # fmt: skip
    if gate.verdict.action == "go":  # the ledger records a check that passed, or the override
        rec.encryption_config_hash = gate.configs.common_hash
        rec.server_check = "overridden" if gate.overridden else "agreed"
    return gate


def _run(settings: Settings, handle: MigrationHandle, rec: RunRecorder,
         lease: RequestLease) -> MigrationSummary | State[Any]:  # fmt: skip
    """Seed 002's worker for one request: check agreement, start, the chunks, the verdict."""
    logger = get_run_logger()
    # Seed 001: start only while the servers agree. A resumed run takes its baseline
    # here too: a move between the crash and the resume is not seen (the request
    # has no field to carry the first start's resourceVersion).
    baseline = check_agreement(settings, handle)
    verdict = decide_agreement(resource=handle.group_resource, moment="start", baseline=None, now=baseline)
    gate = _gate(settings, handle, rec) if verdict.action == "go" else None
    if gate is not None:
        verdict = gate.verdict
    if verdict.action == "abort":
        logger.warning("%s: %s", handle.name, verdict.message)
        rec.started(resumed=False)
        return _fail(settings, handle, rec, MigrationProgress(), reason=verdict.reason, message=verdict.message)
    # Issue 36: where the engine is in-tree, kube-controller-manager writes (no budget, no writer's Lease of ours).
    handle, ended = in_tree_engine(settings, handle, rec, baseline=baseline, gate=gate)
    if ended is not None:
        return ended
    try:
        start = start_migration(settings, handle, flow_run=str(flow_run.id) if flow_run.id else None,
                                config_hash=gate.configs.common_hash if gate is not None else None)  # fmt: skip
    except MigrationCancelled as exc:
        rec.started(resumed=False)
        rec.ended("cancelled", MigrationProgress(), reason=exc.reason, message=str(exc))
        _emit("cancelled", handle, MigrationProgress(), str(exc))
        return Cancelled(message=str(exc))
    rec.started(resumed=start.token is not None)
    rec.progress = start.progress
    _emit("started", handle, start.progress)
    logger.info("migrating %s (%s, %s mode) from %s", handle.ref, handle.name, handle.write_mode,
                "its checkpoint" if start.token else "the beginning")  # fmt: skip
    artifact: UUID | None = None
    with best_effort("the progress artifact"):
        artifact = cast(UUID, create_progress_artifact(progress=_percent(start.progress), key=_artifact_key(handle.name, settings.cluster),
                                                       description=f"Migrating {handle.ref} ({handle.name})"))  # fmt: skip
    run = Passes(progress=start.progress, failures=list(start.failures), token=start.token,
                 config_hash=gate.configs.common_hash if gate is not None else None)  # fmt: skip
    bar = ProgressBar(artifact) if artifact is not None else None
    try:
        # The write budget (issue 37): the run counts among the cluster's writers while its chunks
        # write. The one seam an engine that is not bound by our budget leaves out.
        with write_share(settings, lease) as share:
            _migrate_passes(settings, handle, share, run, baseline, bar, rec)
    except MigrationCancelled as exc:
        logger.warning("%s", exc)
        _emit("cancelled", handle, run.progress, str(exc))
        rec.ended("cancelled", run.progress, reason=exc.reason, message=str(exc), passes=run.passes)
        return Cancelled(message=str(exc))
    except MigrationAborted as exc:
        logger.warning("%s: %s", handle.name, exc.message)
        return _fail(settings, handle, rec, run.progress, reason=exc.reason, message=exc.message, passes=run.passes)
    finally:
        if bar is not None:
            bar.close()
    progress = run.progress
    if artifact is not None:
        with best_effort("the progress artifact"):
            update_progress_artifact(artifact_id=artifact, progress=100.0)
    if progress.failed:
        message = failure_summary(run.failures, progress.failed)
        return _fail(settings, handle, rec, progress, reason="ObjectsFailed", message=message, passes=run.passes,
                     failures=run.failures)  # fmt: skip
    message = (f"{progress.listed} objects: {progress.rewritten} rewritten, {progress.unchanged} unchanged, "
               f"{progress.gone} gone, {progress.conflicted} written by others meanwhile")  # fmt: skip
    message += verdict_notes(handle, rec, passes=run.passes, config_hash=run.config_hash)
    finish_migration(settings, handle, succeeded=True, reason="Completed", message=message)
    rec.ended("succeeded", progress, reason="Completed", message=message, passes=run.passes)
    _outcome_table(settings, handle, progress, "Succeeded")
    _emit("succeeded", handle, progress, message)
    logger.info("%s succeeded: %s", handle.name, message)
    return MigrationSummary(migration=handle.name, resource=handle.group_resource, phase=CONDITION_SUCCEEDED,
                            progress=progress, passes=run.passes, message=message)  # fmt: skip
