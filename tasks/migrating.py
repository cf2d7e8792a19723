"""The tasks of one migration run: resolve the request, check the API servers'
agreement (seed 001), start, one task per chunk, checkpoint, finish.

Design decision (PREFECT.md "Costs"): one task run per LIST chunk, never one
per object (a task run costs ~30 ms of server time). A chunk task's result is
counters and the next continue token only; a retry of it re-does that chunk
(the writes are no-ops for objects already re-encoded). Every task is
`PRIVATE` (no cache, no persisted result): the chunk task holds object
metadata, and in PUT mode whole objects, in memory (DESIGN 8).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prefect import task
from prefect.tasks import exponential_backoff
from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.agreement.storage_versions import StorageVersionObservation
from storage_migrator.agreement.storageversion_api import read_storage_version
from storage_migrator.conditions import is_condition_true
from storage_migrator.kube.discovery import discover
from storage_migrator.kube.errors import NotFound
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.ledger.recorder import encryption_key_of, requested_by
from storage_migrator.migration.chunk_terms import (
    ChunkOptions,
    ChunkResult,
    MigrationAborted,
    WriteMode,
)
from storage_migrator.migration.chunks import migrate_chunk
from storage_migrator.migration.engines import Engine
from storage_migrator.migration.lookahead import PageAhead
from storage_migrator.migration.requests import (
    MigrationCancelled,
    MigrationRecord,
    create_migration,
    read_migration,
)
from storage_migrator.migration.targets import UnknownResource, resolve_target
from storage_migrator.models import (
    CONDITION_FAILED,
    CONDITION_SUCCEEDED,
    MIGRATIONS_KIND_NAME,
    MigrationProgress,
    ObjectFailure,
    new_storage_version_migration,
)
from storage_migrator.rotation.decisions import skips_server_check
from storage_migrator.settings import Settings
from tasks.common import PRIVATE, REQUEST_RETRIES, api_client, connected
from tasks.request_lease import chunk_pacer


class MigrationHandle(BaseModel):
    """What the tasks of a run need to find its StorageVersionMigration again."""

    model_config = ConfigDict(frozen=True)

    name: str
    uid: str
    group: str
    version: str
    resource: str
    write_mode: WriteMode = "patch"
    target_hash: str = ""
    finished: str | None = Field(default=None, description="Succeeded/Failed when there is nothing left to do.")
    requested_by: str = Field(default="manual", description="Who asked, for the ledger (label requested-by).")
    encryption_key: str | None = Field(default=None, description="The write key a rotation request names.")
    skip_server_check: bool = Field(
        default=False, description="Issue 19: the request's override of the API servers' configuration check."
    )
    owner: str | None = Field(
        default=None, description="Issue 31: the flow run that claims the request (its writes are fenced)."
    )
    engine: Engine = Field(default="client", description="Issue 36: the engine that rewrites the objects.")
    engine_note: str = Field(
        default="",
        description="Issue 36: why that engine (auto's choice, a fallback), said in the request's conditions.",
    )

    @property
    def ref(self) -> ResourceRef:
        return ResourceRef(group=self.group, version=self.version, resource=self.resource)

    @property
    def group_resource(self) -> str:
        return self.ref.group_resource


class Checkpointed(BaseModel):
    """Where a run starts: the stored token and counters (a resumed run continues from them)."""

    token: str | None
    progress: MigrationProgress
    failures: list[ObjectFailure]


def _now() -> datetime:
    return datetime.now(UTC)


def _noted(handle: MigrationHandle, message: str) -> str:
    """Issue 36: a message of the request says which engine ran it when the setting alone does not."""
    return f"{message} ({handle.engine_note})" if handle.engine_note else message


def _record(api: Any, handle: MigrationHandle, *, claiming: bool = False) -> MigrationRecord:
    return MigrationRecord.open(api, name=handle.name, uid=handle.uid, owner=handle.owner, claiming=claiming)


@task(name="resolve-migration", **REQUEST_RETRIES, **PRIVATE)
def resolve_migration(
    settings: Settings,
    *,
    resource: str | None,
    group: str,
    version: str | None,
    migration: str | None,
) -> MigrationHandle:
    """Find the request to run, or create one for a resource named by hand.

    An unknown resource raises `UnknownResource` naming it and what is served,
    before anything is created (DESIGN 8).
    """
    with connected(settings) as api:
        found = discover(api, timeout=settings.request_timeout_seconds)
        if migration:
            try:
                existing = read_migration(api, migration)
            except NotFound as exc:
                raise ValueError(
                    f"{MIGRATIONS_KIND_NAME}/{migration} not found: list them with `kubectl get {MIGRATIONS_KIND_NAME}`"
                ) from exc
            spec = existing.spec.resource
            base = MigrationHandle(name=migration, uid=existing.metadata.uid or "", group=spec.group,
                                   version=spec.version, resource=spec.resource,
                                   requested_by=requested_by(existing.metadata.labels),
                                   encryption_key=encryption_key_of(existing.metadata.annotations),
                                   skip_server_check=skips_server_check(existing.metadata.annotations))  # fmt: skip
            conditions = existing.status.conditions
            for done in (CONDITION_SUCCEEDED, CONDITION_FAILED):
                if is_condition_true(conditions, done):
                    # seed 003: a succeeded object is the record that it ran; never re-run it.
                    return base.model_copy(update={"finished": done})
            try:
                target = resolve_target(found.resources, resource=spec.resource, group=spec.group,
                                        version=spec.version or None)  # fmt: skip
            except UnknownResource as exc:
                record = MigrationRecord(api, existing)
                record.finish(succeeded=False, now=_now(), reason="ResourceNotServed", message=str(exc))
                return base.model_copy(update={"finished": CONDITION_FAILED})
            return base.model_copy(update={"write_mode": target.write_mode, "target_hash": target.storage_version_hash})
        if not resource:
            raise ValueError("name a resource to migrate (resource=secrets, group=apps, ...) or a migration")
        target = resolve_target(found.resources, resource=resource, group=group, version=version)
        request = new_storage_version_migration(
            group=target.ref.group, version=target.ref.version, resource=target.ref.resource
        )
        created = create_migration(api, request)
        return MigrationHandle(
            name=created.metadata.name or "",
            uid=created.metadata.uid or "",
            group=target.ref.group,
            version=target.ref.version,
            resource=target.ref.resource,
            write_mode=target.write_mode,
            target_hash=target.storage_version_hash,
        )


@task(name="start-migration", **REQUEST_RETRIES, **PRIVATE)
def start_migration(
    settings: Settings, handle: MigrationHandle, *, flow_run: str | None, config_hash: str | None = None
) -> Checkpointed:
    """Mark the request Running and read where it stands (a resumed run continues).

    Issue 19: ``config_hash`` is the encryption configuration every API server runs now. A
    checkpoint taken under another one (or under none recorded) is worth nothing as a proof: the
    pass starts again from the beginning."""
    with connected(settings) as api:
        record = _record(api, handle, claiming=True)
        record.claim()  # issues 31, 37: after its Lease: a run taken over stops at its next write of the request
        token, progress = record.load()
        stored = record.migration.status.encryption_config_hash
        if token and config_hash and stored != config_hash:
            record.restart_pass(now=_now(), reason="EncryptionConfigurationChanged", config_hash=config_hash,
                                message=f"the checkpoint was taken under encryption configuration {stored or 'unknown'}, "
                                        f"the API servers run {config_hash}: migrating again from the beginning")  # fmt: skip
            token, progress = record.load()
        resumed = "resuming from its checkpoint" if token else "from the beginning"
        who = f" by flow run {flow_run}" if flow_run else ""
        record.start(now=_now(), target_hash=handle.target_hash or None, config_hash=config_hash,
                     message=_noted(handle, f"migrating {handle.ref} {resumed}{who}"))  # fmt: skip
        return Checkpointed(token=token, progress=progress, failures=list(record.migration.status.failures))


#: The page asked for ahead by each migration's last chunk (by uid), for its next chunk task in
#: this process (issue 13: writers do not wait for a LIST). Metadata only; dropped at the end.
_AHEAD: dict[str, PageAhead] = {}


def _not_aborted(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a chunk on unexpected errors, never on a verdict about the migration."""
    try:
        state.result()
    except (MigrationAborted, MigrationCancelled):
        return False
    except Exception:  # noqa: BLE001 - anything else may be transient
        return True
    return False


@task(
    name="migrate-chunk",
    retries=2,
    retry_delay_seconds=exponential_backoff(backoff_factor=2),
    retry_jitter_factor=0.5,
    retry_condition_fn=_not_aborted,
    **PRIVATE,
)
def migrate_chunk_task(settings: Settings, handle: MigrationHandle, token: str | None) -> ChunkResult:
    """One chunk, paced by the run's request Lease (tasks/request_lease.py): a run that lost its
    request stops before the chunk's first write, and at its next write within it (issue 37)."""
    options = ChunkOptions(
        limit=settings.chunk_size,
        write_mode=handle.write_mode,
        write_concurrency=settings.write_concurrency,
        max_write_attempts=settings.max_write_attempts,
        backoff_base_seconds=settings.backoff_base_seconds,
        backoff_max_seconds=settings.backoff_max_seconds,
        request_timeout_seconds=settings.request_timeout_seconds,
        settle_window_seconds=settings.apiserver_restart_window_seconds,
        settle_timeout_seconds=settings.apiserver_settle_timeout_seconds,
    )
    pacer = chunk_pacer(settings, handle.uid)
    # The LIST ahead outlives this task's client: it gets one of its own.
    ahead = _AHEAD.setdefault(handle.uid, PageAhead(connect=lambda: api_client(settings)))
    try:
        with connected(settings) as api:
            result = migrate_chunk(api, handle.ref, continue_token=token, options=options, pacer=pacer, ahead=ahead)
    except BaseException:
        _AHEAD.pop(handle.uid, None)
        raise
    if result.token_out is None:
        _AHEAD.pop(handle.uid, None)
    return result


@task(name="checkpoint", **REQUEST_RETRIES, **PRIVATE)
def checkpoint(
    settings: Settings,
    handle: MigrationHandle,
    *,
    token: str | None,
    progress: MigrationProgress,
    failures: list[ObjectFailure],
    pass_resource_version: str | None = None,
) -> None:
    """Save the next token and the counters (and, after a pass's first chunk, its list
    resourceVersion: issue 36); `MigrationCancelled` if the request is gone."""
    with connected(settings) as api:
        _record(api, handle).save(token=token, progress=progress, failures=failures, now=_now(),
                                  pass_resource_version=pass_resource_version)  # fmt: skip


@task(name="check-agreement", **REQUEST_RETRIES, **PRIVATE)
def check_agreement(settings: Settings, handle: MigrationHandle) -> StorageVersionObservation | None:
    """The StorageVersion object of the resource being migrated (seed 001), or None: no check.

    None when the API is not served, and for resources without an object of their
    own: custom resources and aggregated APIs (none on v1.36), and a resource that
    shares another's storage (`events.events.k8s.io` is published as `core.events`
    only; the initializer migrates the storage owner, DESIGN 4.7).
    """
    with connected(settings) as api:
        return read_storage_version(api, group=handle.group, resource=handle.resource,
                                    timeout=settings.request_timeout_seconds)  # fmt: skip


@task(name="restart-pass", **REQUEST_RETRIES, **PRIVATE)
def restart_pass(
    settings: Settings, handle: MigrationHandle, *, reason: str, message: str, config_hash: str | None = None
) -> None:
    """Reset the checkpoint for a new pass from the beginning; `MigrationCancelled` if the request is gone."""
    with connected(settings) as api:
        _record(api, handle).restart_pass(now=_now(), reason=reason, message=message, config_hash=config_hash)


@task(name="note-migration-step", **REQUEST_RETRIES, **PRIVATE)
def note_migration_step(settings: Settings, handle: MigrationHandle, *, reason: str, message: str) -> None:
    """The step the run waits on, in its request's Running condition; `MigrationCancelled` if it is gone."""
    with connected(settings) as api:
        _record(api, handle).note_step(now=_now(), reason=reason, message=message)


@task(name="finish-migration", **REQUEST_RETRIES, **PRIVATE)
def finish_migration(
    settings: Settings, handle: MigrationHandle, *, succeeded: bool, reason: str, message: str
) -> None:
    with connected(settings) as api:
        _record(api, handle).finish(succeeded=succeeded, now=_now(), reason=reason, message=_noted(handle, message))
