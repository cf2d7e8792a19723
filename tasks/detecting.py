"""Tasks of a detection poll: observe the cluster, then apply the planned actions.

The plan itself is `storage_migrator.detection.plan_detection`, a pure
function. Applying is best effort per action: a write that lost a race (409)
or hit a transient error is reported and left to the next poll, which plans
again from what it then observes (seed 000's controller is level-triggered).
"""

from __future__ import annotations

import contextlib

from prefect import get_run_logger, task
from pydantic import BaseModel, Field

from storage_migrator.agreement import AgreementSource
from storage_migrator.apiservers import observe_agreement
from storage_migrator.detection import (
    SETTLE_ANNOTATION,
    SINCE_ANNOTATION,
    CrdObservation,
    CreateMigration,
    CreateState,
    DeleteMigration,
    DetectionPlan,
    TrimStoredVersions,
    UpdateState,
)
from storage_migrator.kube.discovery import DiscoveredResource, discover
from storage_migrator.kube.errors import KubeError, NotFound
from storage_migrator.kube.listing import iterate_items
from storage_migrator.kube.writing import delete_object, patch_object
from storage_migrator.migrations import MIGRATIONS, create_migration, list_migrations
from storage_migrator.models import (
    MIGRATIONS_KIND_NAME,
    STATES_KIND_NAME,
    StorageState,
    StorageVersionMigration,
    new_storage_version_migration,
)
from storage_migrator.poll_changes import PollChanges
from storage_migrator.reporters import ReporterHash
from storage_migrator.settings import Settings
from storage_migrator.states import create_state, list_states, write_state
from tasks.common import PRIVATE, connected
from tasks.dispatching import CRDS

OUR_ANNOTATIONS = (SINCE_ANNOTATION, SETTLE_ANNOTATION)
DETECTION_LABELS = {"migration.k8s.io/requested-by": "detection"}


class Observations(BaseModel):
    """What one poll saw: discovery, StorageStates, migrations and CRDs (no object data)."""

    discovered: list[DiscoveredResource]
    failed_group_versions: list[str] = Field(default_factory=list)
    states: list[StorageState]
    migrations: list[StorageVersionMigration]
    crds: list[CrdObservation]
    reporters: list[ReporterHash] = Field(default_factory=list, description="What each API server encodes in.")
    agreement_source: AgreementSource = "discovery"
    api_servers: list[str] = Field(default_factory=list, description="The reporters heard (IDs or URLs).")


class Applied(BaseModel):
    """What a poll changed, by action, and what it could not."""

    done: list[str] = Field(default_factory=list)
    created_migrations: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    changes: PollChanges = Field(default_factory=PollChanges, description="What was applied, for events.")


@task(name="observe", **PRIVATE)
def observe(settings: Settings) -> Observations:
    with connected(settings) as api:
        found = discover(api, timeout=settings.request_timeout_seconds)
        crds = [c for c in (CrdObservation.from_object(o) for o in iterate_items(api, CRDS, limit=500)) if c]
        agreement = observe_agreement(api, settings, found.resources)
        for server, why in agreement.unheard.items():
            # Not heard: its entry ages, which blocks new migrations until it reports
            # again or is collected after 3 periods (seed 000).
            get_run_logger().warning("API server %s not heard in this poll: %s", server, why)
        return Observations(
            discovered=found.resources,
            failed_group_versions=[f.group_version for f in found.failed],
            states=list_states(api),
            migrations=list_migrations(api),
            crds=crds,
            reporters=agreement.reporters,
            agreement_source=agreement.source,
            api_servers=agreement.servers,
        )


def _ours(annotations: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (annotations or {}).items() if k in OUR_ANNOTATIONS}


@task(name="apply-detection-plan", **PRIVATE)
def apply_plan(settings: Settings, plan: DetectionPlan, states: list[StorageState]) -> Applied:
    logger = get_run_logger()
    by_name = {s.metadata.name: s for s in states}
    applied = Applied()
    with connected(settings) as api:
        for action in plan.actions:
            try:
                if isinstance(action, CreateState):
                    create_state(api, name=action.name, group=action.group, resource=action.resource,
                                 current_hash=action.current_hash, persisted=action.persisted,
                                 heartbeat=action.heartbeat, annotations=_ours(action.annotations),
                                 current_hashes=action.current_hashes)  # fmt: skip
                    done = f"created {STATES_KIND_NAME}/{action.name}: {action.reason}"
                elif isinstance(action, UpdateState):
                    old = by_name.get(action.name)
                    write_state(api, name=action.name, resource_version=action.resource_version,
                                current_hash=action.current_hash, persisted=action.persisted,
                                heartbeat=action.heartbeat, annotations=_ours(action.annotations),
                                old_annotations=_ours(old.metadata.annotations if old else None),
                                current_hashes=action.current_hashes)  # fmt: skip
                    applied.changes.add_update(action, old)
                    done = f"updated {STATES_KIND_NAME}/{action.name}: {action.reason}"
                elif isinstance(action, DeleteMigration):
                    with contextlib.suppress(NotFound):  # already gone: what we wanted
                        delete_object(api, MIGRATIONS, name=action.name, uid=action.uid)
                    done = f"deleted {MIGRATIONS_KIND_NAME}/{action.name}: {action.reason}"
                elif isinstance(action, CreateMigration):
                    request = new_storage_version_migration(group=action.group, version=action.version,
                                                            resource=action.resource, labels=DETECTION_LABELS)  # fmt: skip
                    created = create_migration(api, request)
                    applied.created_migrations.append(created.metadata.name or "")
                    applied.changes.add_request(action, created.metadata.name or "")
                    done = f"requested {MIGRATIONS_KIND_NAME}/{created.metadata.name}: {action.reason}"
                elif isinstance(action, TrimStoredVersions):
                    patch_object(api, CRDS, name=action.crd_name, subresource="status",
                                 resource_version=action.resource_version,
                                 patch={"status": {"storedVersions": action.stored_versions}})  # fmt: skip
                    done = f"trimmed customresourcedefinition {action.crd_name} storedVersions: {action.reason}"
                else:  # pragma: no cover - the union is closed
                    raise TypeError(f"unknown action {action!r}")
            except KubeError as exc:
                # Lost a race or a transient error: the next poll plans again from what it sees.
                applied.errors.append(f"{action.kind}: {exc}")
                logger.warning("could not %s: %s (the next poll retries)", action.kind, exc)
                continue
            applied.done.append(done)
            logger.info("%s", done)
    return applied
