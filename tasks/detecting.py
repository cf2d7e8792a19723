"""Tasks of a detection poll: observe the cluster (storage_migrator/detection/observation.py), then apply the planned actions.

The plan itself is `storage_migrator.detection.planner.plan_detection`, a pure
function. Applying is best effort per action: a write that lost a race (409)
or hit a transient error is reported and left to the next poll, which plans
again from what it then observes (seed 000's controller is level-triggered);
a request whose StorageState was not written is held back with it (issue 24).
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime

from kubernetes.client import ApiClient
from prefect import get_run_logger, task
from prefect.runtime import flow_run
from pydantic import BaseModel, Field

from storage_migrator.detection.changes import PollChanges
from storage_migrator.detection.observation import Observations, observe_cluster
from storage_migrator.detection.planner import (
    DETECTION_LABEL,
    DETECTION_LABEL_VALUE,
    SETTLE_ANNOTATION,
    SINCE_ANNOTATION,
    Action,
    CreateMigration,
    CreateState,
    DeleteMigration,
    DetectionPlan,
    TrimStoredVersions,
    UpdateState,
)
from storage_migrator.detection.states import create_state, write_state
from storage_migrator.fleet.names import cluster_name
from storage_migrator.kube.crds import CRDS
from storage_migrator.kube.errors import Forbidden, KubeError, NotFound
from storage_migrator.kube.listing import current_resource_version
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.writing import delete_object, patch_object
from storage_migrator.ledger.recorder import writer_from_settings
from storage_migrator.ledger.records import StateChange
from storage_migrator.migration.requests import MIGRATIONS, create_migration
from storage_migrator.models import (
    MIGRATIONS_KIND_NAME,
    STATES_KIND_NAME,
    StorageState,
    new_storage_version_migration,
)
from storage_migrator.settings import Settings
from tasks.common import PRIVATE, api_client, connected

__all__ = ["Applied", "Observations", "apply_plan", "observe"]

OUR_ANNOTATIONS = (SINCE_ANNOTATION, SETTLE_ANNOTATION)


class Applied(BaseModel):
    """What a poll changed, by action, and what it could not."""

    done: list[str] = Field(default_factory=list)
    created_migrations: list[str] = Field(default_factory=list)
    heartbeats: int = Field(default=0, description="StorageStates whose heartbeat alone was written (no change).")
    errors: list[str] = Field(default_factory=list)
    denied: list[str] = Field(
        default_factory=list, description="Of the errors, the permissions RBAC denied (no later poll heals them)."
    )
    changes: PollChanges = Field(default_factory=PollChanges, description="What was applied, for events.")


@task(name="observe", **PRIVATE)
def observe(settings: Settings) -> Observations:
    with connected(settings) as api:
        seen = observe_cluster(api, settings, connect=lambda server: api_client(settings, server=server))
    for server, why in seen.unheard.items():
        # Not heard: its entry ages, which blocks new migrations until it reports
        # again or is collected after 3 periods (seed 000).
        get_run_logger().warning("API server %s not heard in this poll: %s", server, why)
    return seen


def _state_change(action: CreateState | UpdateState, old: StorageState | None) -> StateChange | None:
    """The ledger row of a StorageState write that changed its hashes (a heartbeat alone is no change)."""
    old_hash = old.status.current_storage_version_hash if old else None
    old_persisted = list(old.status.persisted_storage_version_hashes) if old else []
    if old is not None and old_hash == action.current_hash and old_persisted == action.persisted:
        return None
    return StateChange(recorded_at=datetime.now(UTC), state=action.name,
                       action="created" if isinstance(action, CreateState) else "updated",
                       old_current_hash=old_hash, new_current_hash=action.current_hash, old_persisted=old_persisted,
                       new_persisted=list(action.persisted), reason=action.reason,
                       flow_run_id=str(flow_run.id) if flow_run.id else None)  # fmt: skip


def _ours(annotations: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (annotations or {}).items() if k in OUR_ANNOTATIONS}


@task(name="apply-detection-plan", **PRIVATE)
def apply_plan(
    settings: Settings, plan: DetectionPlan, states: list[StorageState], *, requested_by: str = DETECTION_LABEL_VALUE
) -> Applied:
    """The actions in plan order; requests are labelled ``requested-by=<requested_by>`` (who applied the plan).

    A request whose StorageState write failed in this poll is not made (issue 24): the
    migration must start after its state recorded the hash, or it can never refine it
    (seed 000), and a lost race means another poll made the state and its request."""
    logger = get_run_logger()
    by_name = {s.metadata.name: s for s in states}
    applied = Applied()
    unwritten: set[str] = set()
    unordered: set[str] = set()
    ledger = writer_from_settings(settings)  # issue 12: in this task, no task run of its own
    with connected(settings) as api:
        for action in plan.actions:
            if isinstance(action, CreateMigration) and action.group_resource in unwritten | unordered:
                why = "write failed" if action.group_resource in unwritten else "switch has no resourceVersion"
                applied.errors.append(f"{action.kind}: not requested for {action.group_resource}: its "
                                      f"{STATES_KIND_NAME} {why} (the next poll plans again)")  # fmt: skip
                logger.warning("%s", applied.errors[-1])
                continue
            if isinstance(action, CreateState | UpdateState) and action.record_switch is not None:
                action = _with_switch(api, action, settings, applied, unordered)
            try:
                done, change = _apply_one(api, action, by_name, applied, requested_by=requested_by)
            except KubeError as exc:
                applied.errors.append(f"{action.kind}: {exc}")
                if isinstance(action, CreateState | UpdateState):
                    unwritten.add(action.name)
                if isinstance(exc, Forbidden) and exc.permission:
                    # Issue 14: a missing permission, named with its fix (str(exc)); it fails the poll.
                    applied.denied.append(f"{action.kind}: {exc}")
                    logger.error("could not %s: %s", action.kind, exc)
                    continue
                # Lost a race or a transient error: the next poll plans again from what it sees.
                logger.warning("could not %s: %s (the next poll retries)", action.kind, exc)
                continue
            applied.done.append(done)
            logger.info("%s", done)
            if change is not None:
                ledger.submit(change.model_copy(update={"cluster": cluster_name(settings.cluster)}))
            elif isinstance(action, UpdateState):
                applied.heartbeats += 1
    return applied


def _with_switch(
    api: ApiClient, action: CreateState | UpdateState, settings: Settings, applied: Applied, unordered: set[str]
) -> CreateState | UpdateState:
    """The state write with the resource's list resourceVersion now, read after discovery showed the hash
    (issue 36: what refinement is ordered by). A read that fails leaves the write without one (its hashes
    are still the truth to record), holds back its request (a migration could not be ordered after it) and
    is reported; the next poll reads it again."""
    ref = action.record_switch
    assert ref is not None
    try:
        switch = current_resource_version(api, ResourceRef(group=ref.group, version=ref.version,
                                                           resource=ref.resource),
                                          timeout=settings.request_timeout_seconds)  # fmt: skip
    except KubeError as exc:
        message = f"{action.kind}: the resourceVersion of {action.name} could not be read: {exc}"
        applied.errors.append(message)
        if isinstance(exc, Forbidden) and exc.permission:
            applied.denied.append(message)
        get_run_logger().warning("%s (written without it; the next poll reads it again)", message)
        unordered.add(action.name)
        switch = None
    return action.model_copy(update={"record_switch": None, "switch_resource_version": switch})


def _apply_one(
    api: ApiClient, action: Action, by_name: dict[str | None, StorageState], applied: Applied, *, requested_by: str
) -> tuple[str, StateChange | None]:
    """One action against the API: what was done, for the log, and its ledger row (state changes only)."""
    if isinstance(action, CreateState):
        create_state(api, name=action.name, group=action.group, resource=action.resource,
                     current_hash=action.current_hash, persisted=action.persisted,
                     heartbeat=action.heartbeat, annotations=_ours(action.annotations),
                     current_hashes=action.current_hashes,
                     switch_resource_version=action.switch_resource_version)  # fmt: skip
        return f"created {STATES_KIND_NAME}/{action.name}: {action.reason}", _state_change(action, None)
    if isinstance(action, UpdateState):
        old = by_name.get(action.name)
        write_state(api, name=action.name, resource_version=action.resource_version,
                    current_hash=action.current_hash, persisted=action.persisted,
                    heartbeat=action.heartbeat, annotations=_ours(action.annotations),
                    old_annotations=_ours(old.metadata.annotations if old else None),
                    current_hashes=action.current_hashes,
                    switch_resource_version=action.switch_resource_version)  # fmt: skip
        applied.changes.add_update(action, old)
        return f"updated {STATES_KIND_NAME}/{action.name}: {action.reason}", _state_change(action, old)
    if isinstance(action, DeleteMigration):
        with contextlib.suppress(NotFound):  # already gone: what we wanted
            delete_object(api, MIGRATIONS, name=action.name, uid=action.uid)
        return f"deleted {MIGRATIONS_KIND_NAME}/{action.name}: {action.reason}", None
    if isinstance(action, CreateMigration):
        request = new_storage_version_migration(group=action.group, version=action.version, resource=action.resource,
                                                labels={DETECTION_LABEL: requested_by})  # fmt: skip
        created = create_migration(api, request)
        applied.created_migrations.append(created.metadata.name or "")
        applied.changes.add_request(action, created.metadata.name or "")
        return f"requested {MIGRATIONS_KIND_NAME}/{created.metadata.name}: {action.reason}", None
    if isinstance(action, TrimStoredVersions):
        patch_object(api, CRDS, name=action.crd_name, subresource="status", resource_version=action.resource_version,
                     patch={"status": {"storedVersions": action.stored_versions}})  # fmt: skip
        return f"trimmed customresourcedefinition {action.crd_name} storedVersions: {action.reason}", None
    raise TypeError(f"unknown action {action!r}")  # pragma: no cover - the union is closed
