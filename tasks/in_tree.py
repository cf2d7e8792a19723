"""The tasks of a run on the in-tree engine: choose the engine, open kube-controller-manager's object
for our request, watch it, count, and tidy up (issue 36, item 2).

Each task is one thing over the access layer (storage_migrator/kube/); every decision is
storage_migrator/migration/engines.py's or in_tree_runs.py's. Names, uids, resourceVersions
and counters only cross a task's boundary: the count reads metadata-only LIST pages and
returns numbers (DESIGN 8). Reads and writes of our own objects are retried like the
others (`REQUEST_RETRIES`): an API server restarting answers 403 for a few seconds.
"""

from __future__ import annotations

from contextlib import suppress
from datetime import UTC, datetime
from typing import Any

from prefect import task
from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.agreement.apiservers import observe_server_configs
from storage_migrator.agreement.server_configs import ServerConfigs
from storage_migrator.agreement.storage_versions import StorageVersionObservation
from storage_migrator.agreement.storageversion_api import read_storage_version
from storage_migrator.kube.crds import CRDS, read_crds
from storage_migrator.kube.discovery import discover
from storage_migrator.kube.errors import AlreadyExists, Conflict, NotFound
from storage_migrator.kube.in_tree import InTreeMigration, in_tree_version
from storage_migrator.kube.listing import current_resource_version, iterate_items
from storage_migrator.kube.reading import read_object
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.writing import create_object, delete_object, patch_object
from storage_migrator.migration.engines import (
    ENGINE_ANNOTATION,
    ENGINE_NOTE_ANNOTATION,
    IN_TREE_UNSEEN_ANNOTATION,
    Engine,
    EngineChoice,
    choose_engine,
    in_tree_refusal,
    recent_unseen,
)
from storage_migrator.migration.in_tree_runs import (
    BASELINE_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    STORED_VERSIONS_ANNOTATION,
    count_since,
    in_tree_name,
    in_tree_object,
    in_tree_ref,
    ownership,
    restored_stored_versions,
)
from storage_migrator.migration.requests import (
    MIGRATIONS,
    MigrationCancelled,
    MigrationRecord,
    list_migrations,
    read_migration,
)
from storage_migrator.models import MIGRATIONS_KIND_NAME, MigrationProgress, format_time
from storage_migrator.settings import Settings
from tasks.common import PRIVATE, REQUEST_RETRIES, api_client, connected
from tasks.migrating import MigrationHandle

__all__ = [
    "InTreeOpened",
    "InTreeWatch",
    "choose_run_engine",
    "count_in_tree",
    "delete_in_tree",
    "mark_engine",
    "open_in_tree",
    "put_back_stored_versions",
    "watch_in_tree",
]

APISERVICES = ResourceRef(group="apiregistration.k8s.io", version="v1", resource="apiservices")
_PASS_ANNOTATION = "migration.k8s.io/pass"


class InTreeOpened(BaseModel):
    """The in-tree object a run watches: where, which pass, and the baseline its counts compare with."""

    model_config = ConfigDict(frozen=True)

    version: str = Field(description="The in-tree API's version it was created in (v1, else v1beta1).")
    name: str
    uid: str
    passes: int = Field(ge=1)
    baseline: str = Field(description="The resource's list resourceVersion read just before it was created.")
    stored_versions: list[str] | None = Field(default=None, description="A CRD's storedVersions before it.")
    adopted: bool = Field(default=False, description="Created by an earlier run of this request, watched again.")


def _aggregated_groups(api: Any) -> frozenset[str]:
    return frozenset(str((o.get("spec") or {}).get("group") or "") for o in iterate_items(api, APISERVICES, limit=500)
                     if (o.get("spec") or {}).get("service") is not None)  # fmt: skip


def _ours(api: Any, version: str, handle: MigrationHandle) -> list[dict[str, Any]]:
    """This request's in-tree objects (our label, its uid), oldest pass first."""
    found = [o for o in iterate_items(api, in_tree_ref(version), limit=500, label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}")
             if ownership(o.get("metadata") or {}, request_uid=handle.uid) == "this-request"]  # fmt: skip
    return sorted(found, key=lambda o: int((o["metadata"].get("annotations") or {}).get(_PASS_ANNOTATION, "1")))


def _delete(api: Any, version: str, name: str, uid: str) -> None:
    # Gone already, or another object of the name now (the uid precondition): not ours to delete.
    with suppress(NotFound, Conflict):
        delete_object(api, in_tree_ref(version), name=name, uid=uid)


@task(name="choose-engine", **REQUEST_RETRIES, **PRIVATE)
def choose_run_engine(settings: Settings, handle: MigrationHandle) -> EngineChoice:
    """The engine of this run (migration/engines.py decides). On the client engine, nothing is read but
    our request, unless an earlier run of it used the in-tree engine: the in-tree objects it left are
    deleted first (one writer per request)."""
    with connected(settings) as api:
        before = (read_migration(api, handle.name).metadata.annotations or {}).get(ENGINE_ANNOTATION)
        if settings.engine == "client" and before != "in-tree":
            return choose_engine("client", served_version=None, refusal=None, unseen=None,
                                 recheck_seconds=settings.in_tree_recheck_seconds)  # fmt: skip
        found = discover(api, timeout=settings.request_timeout_seconds)
        version = in_tree_version(found.resources)
        refusal = unseen = None
        if version is not None:
            served = [r for r in found.resources if (r.group, r.resource, r.version) ==
                      (handle.group, handle.resource, handle.version)]  # fmt: skip
            if served:
                refusal = in_tree_refusal(served[0], aggregated_groups=_aggregated_groups(api))
            if settings.engine == "auto" and settings.in_tree_recheck_seconds > 0:
                unseen = recent_unseen(list_migrations(api), now=datetime.now(UTC),
                                       within_seconds=settings.in_tree_recheck_seconds)  # fmt: skip
        choice = choose_engine(settings.engine, served_version=version, refusal=refusal, unseen=unseen,
                               recheck_seconds=settings.in_tree_recheck_seconds)  # fmt: skip
        left = _ours(api, version, handle) if choice.engine == "client" and version is not None else []
        for obj in left:
            _delete(api, version or "", obj["metadata"]["name"], obj["metadata"]["uid"])
        if left and not choice.note:
            names = ", ".join(o["metadata"]["name"] for o in left)
            choice = choice.model_copy(update={"note": f"engine client: deleted the in-tree migration(s) {names} an "
                                                       "earlier run of the request left (one writer per request)"})  # fmt: skip
        return choice


def _stored_versions(api: Any, handle: MigrationHandle) -> list[str] | None:
    crd = next((c for c in read_crds(api) if (c.group, c.plural) == (handle.group, handle.resource)), None)
    return list(crd.stored_versions) if crd is not None else None


def _opened(obj: dict[str, Any], version: str, *, adopted: bool) -> InTreeOpened:
    meta = obj["metadata"]
    notes = meta.get("annotations") or {}
    stored = notes.get(STORED_VERSIONS_ANNOTATION)
    return InTreeOpened(version=version, name=meta["name"], uid=meta["uid"], passes=int(notes.get(_PASS_ANNOTATION, "1")),
                        baseline=notes.get(BASELINE_ANNOTATION, "0"), adopted=adopted,
                        stored_versions=stored.split(",") if stored else None if stored is None else [])  # fmt: skip


@task(name="open-in-tree-migration", **REQUEST_RETRIES, **PRIVATE)
def open_in_tree(settings: Settings, handle: MigrationHandle, *, version: str, passes: int | None) -> InTreeOpened:
    """The in-tree object of this request's pass: `passes=None` adopts the newest one an earlier run of the
    request left (a resumed run), else creates pass 1; a number creates that pass (deleting older ones).

    The baseline (a LIST with limit 1 of the resource) is read just before the create, so every write of
    kube-controller-manager for it is newer. A name taken by an object that is not ours is never touched:
    `ValueError` naming it and the fix."""
    ref = in_tree_ref(version)
    with connected(settings) as api:
        mine = _ours(api, version, handle)
        if passes is None and mine:
            newest = mine[-1]
            for stale in mine[:-1]:
                _delete(api, version, stale["metadata"]["name"], stale["metadata"]["uid"])
            return _opened(newest, version, adopted=True)
        wanted = passes or 1
        for old in mine:
            _delete(api, version, old["metadata"]["name"], old["metadata"]["uid"])
        name = in_tree_name(handle.name, wanted)
        try:
            existing = read_object(api, ref, name=name)
        except NotFound:
            existing = None
        if existing is not None:
            meta = existing.get("metadata") or {}
            if ownership(meta, request_uid=handle.uid) == "not-ours":
                raise ValueError(f"storageversionmigrations.storagemigration.k8s.io/{name} exists and is not this "
                                 f"request's ({MIGRATIONS_KIND_NAME}/{handle.name}): rename the request, or delete "
                                 "that in-tree migration once it has ended")  # fmt: skip
            _delete(api, version, name, str(meta.get("uid") or ""))  # an earlier request of the same name
        baseline = current_resource_version(api, handle.ref, timeout=settings.request_timeout_seconds)
        stored = _stored_versions(api, handle) if handle.group else None
        body = in_tree_object(version=version, name=name, group=handle.group, resource=handle.resource,
                              request=handle.name, request_uid=handle.uid, baseline=baseline,
                              stored_versions=stored)  # fmt: skip
        body["metadata"]["annotations"][_PASS_ANNOTATION] = str(wanted)
        try:
            created = create_object(api, ref, body)
        except AlreadyExists:  # our own create, answered to a retry of this task: it is ours, watch it
            created = read_object(api, ref, name=name)
            if ownership(created.get("metadata") or {}, request_uid=handle.uid) != "this-request":
                raise
        return _opened(created, version, adopted=False)


class InTreeWatch(BaseModel):
    """One look at a run on the in-tree engine: its in-tree object (None: gone) and what the gates ask."""

    observed: InTreeMigration | None
    storage_version: StorageVersionObservation | None = Field(description="The resource's StorageVersion object.")
    configs: ServerConfigs | None = Field(default=None, description="Every API server's encryption configuration.")


@task(name="watch-in-tree-migration", **REQUEST_RETRIES, **PRIVATE)
def watch_in_tree(settings: Settings, handle: MigrationHandle, opened: InTreeOpened) -> InTreeWatch:
    """One look, in one task run (the flow looks every in_tree_poll_seconds for hours: a task run per look
    is what our process spends): our request first (`MigrationCancelled` when it was deleted or taken over:
    the run stops and deletes the object), the in-tree object (None when deleted, or replaced by another of
    the name), the resource's StorageVersion object, and for a key's request every server's configuration."""
    with connected(settings) as api:
        MigrationRecord.open(api, name=handle.name, uid=handle.uid, owner=handle.owner)
        try:
            raw: dict[str, Any] | None = read_object(api, in_tree_ref(opened.version), name=opened.name)
        except NotFound:
            raw = None
        if raw is not None and (raw.get("metadata") or {}).get("uid") != opened.uid:
            raw = None
        version = read_storage_version(api, group=handle.group, resource=handle.resource,
                                       timeout=settings.request_timeout_seconds)  # fmt: skip
        configs = (observe_server_configs(api, settings, connect=lambda server: api_client(settings, server=server))
                   if handle.encryption_key else None)  # fmt: skip
        return InTreeWatch(observed=InTreeMigration.from_object(raw) if raw is not None else None,
                           storage_version=version, configs=configs)  # fmt: skip


@task(name="delete-in-tree-migration", **REQUEST_RETRIES, **PRIVATE)
def delete_in_tree(settings: Settings, opened: InTreeOpened) -> None:
    """Stop kube-controller-manager's work on it: the only stop its API offers (no new scan, no Succeeded)."""
    with connected(settings) as api:
        _delete(api, opened.version, opened.name, opened.uid)


@task(name="count-in-tree-migration", **REQUEST_RETRIES, **PRIVATE)
def count_in_tree(settings: Settings, handle: MigrationHandle, opened: InTreeOpened) -> MigrationProgress:
    """Our own counts: one metadata-only LIST of the resource, compared with the baseline (in_tree_runs.py)."""
    with connected(settings) as api:
        items = iterate_items(api, handle.ref, limit=settings.chunk_size, metadata_only=True,
                              timeout=settings.request_timeout_seconds)  # fmt: skip
        return count_since((str((i.get("metadata") or {}).get("resourceVersion") or "") for i in items),
                           baseline=opened.baseline)  # fmt: skip


@task(name="mark-engine", **REQUEST_RETRIES, **PRIVATE)
def mark_engine(settings: Settings, handle: MigrationHandle, *, engine: Engine, note: str,
                unseen: bool = False) -> None:  # fmt: skip
    """Say on our request which engine runs it and why (`status` shows it); `unseen`: auto saw kube-controller-
    manager's controller not working now (later runs fall back at once for in_tree_recheck_seconds)."""
    annotations: dict[str, str | None] = {ENGINE_ANNOTATION: engine, ENGINE_NOTE_ANNOTATION: note or None}
    if unseen:
        annotations[IN_TREE_UNSEEN_ANNOTATION] = format_time(datetime.now(UTC))
    with connected(settings) as api:
        try:  # the uid in the patch is a precondition: never the annotation of a re-created request
            patch_object(api, MIGRATIONS, name=handle.name, patch={"metadata": {"uid": handle.uid,
                                                                                "annotations": annotations}})  # fmt: skip
        except (NotFound, Conflict) as exc:
            raise MigrationCancelled(f"{MIGRATIONS_KIND_NAME}/{handle.name} was deleted: run cancelled") from exc


@task(name="put-back-stored-versions", **REQUEST_RETRIES, **PRIVATE)
def put_back_stored_versions(settings: Settings, handle: MigrationHandle, opened: InTreeOpened) -> list[str] | None:
    """kube-controller-manager trims a CRD's status.storedVersions at the end of its migration, on failure
    too: when our request did not succeed, the versions read before are put back (None: nothing to do)."""
    if opened.stored_versions is None:
        return None
    with connected(settings) as api:
        crd = next((c for c in read_crds(api) if (c.group, c.plural) == (handle.group, handle.resource)), None)
        if crd is None:
            return None
        restored = restored_stored_versions(opened.stored_versions, crd.stored_versions)
        if restored is None:
            return None
        patch_object(api, CRDS, name=crd.name, subresource="status", resource_version=crd.resource_version,
                     patch={"status": {"storedVersions": restored}})  # fmt: skip
        return restored
