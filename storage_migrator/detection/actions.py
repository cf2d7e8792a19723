"""The typed actions of one detection poll, and the plan that orders them.

Design decision (DESIGN 3): the planner (:mod:`storage_migrator.detection.planner`)
returns these and nothing else; the detection task applies them one by one
(tasks/detecting.py). Each StorageState gets at most one write per poll, and
every action carries the reason a person reads in the flow run's log.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.detection.tracking import SkippedResource
from storage_migrator.models import GroupVersionResource, StorageVersionHash, storage_state_name

__all__ = [
    "INITIALIZE_REQUESTER",
    "PLANNER_REQUESTERS",
    "Action",
    "CreateMigration",
    "CreateState",
    "DeleteMigration",
    "DetectionPlan",
    "TrimStoredVersions",
    "UpdateState",
]

#: ``migration.k8s.io/requested-by`` of the requests ``initialize`` makes by applying a plan.
INITIALIZE_REQUESTER: Final = "initialize"
#: Requesters whose requests are this planner's own (cancelled on a change, counted in the
#: back-off): the detection poll, and ``initialize``, the same poll on first install (issue 24).
PLANNER_REQUESTERS: Final = frozenset({"detection", INITIALIZE_REQUESTER})


class _Action(BaseModel):
    model_config = ConfigDict(frozen=True)

    reason: str = Field(description="Why, for a person to read (the seed rule that applies).")


class CreateState(_Action):
    """Create the StorageState of a resource seen for the first time (seed 000)."""

    kind: Literal["CreateState"] = "CreateState"
    name: str = Field(description="metadata.name: ``<resource>.<group>`` or ``<resource>`` for core.")
    group: str
    resource: str
    current_hash: str = Field(description="status.currentStorageVersionHash.")
    persisted: list[str] = Field(description="status.persistedStorageVersionHashes.")
    heartbeat: datetime = Field(description="status.lastHeartbeatTime.")
    annotations: dict[str, str] = Field(description="metadata.annotations of the new object.")
    current_hashes: list[StorageVersionHash] = Field(
        default_factory=list, description="status.currentStorageVersionHashes: one entry per reporter (seed 000, HA)."
    )
    record_switch: GroupVersionResource | None = Field(
        default=None,
        description=(
            "Issue 36: LIST this resource (limit 1) when applying, and record its list resourceVersion as "
            "status.currentHashResourceVersion; None: the reporters disagree, no hash is recorded yet."
        ),
    )
    switch_resource_version: str | None = Field(
        default=None, description="status.currentHashResourceVersion, once the apply step has read it."
    )


class UpdateState(_Action):
    """The whole new status of interest of one StorageState, as one update guarded by its resourceVersion.

    ``annotations`` is the complete ``metadata.annotations`` to write (the
    object's other annotations are carried over; a detection annotation missing
    from it is to be removed).
    """

    kind: Literal["UpdateState"] = "UpdateState"
    name: str
    resource_version: str = Field(description="metadata.resourceVersion of the object read (CAS); '' if it had none.")
    current_hash: str = Field(description="status.currentStorageVersionHash: the last hash the reporters agreed on.")
    persisted: list[str] = Field(description="status.persistedStorageVersionHashes.")
    heartbeat: datetime = Field(description="status.lastHeartbeatTime.")
    annotations: dict[str, str]
    current_hashes: list[StorageVersionHash] = Field(
        default_factory=list,
        description=(
            "status.currentStorageVersionHashes, complete (merged and garbage collected): one "
            "entry per reporter (seed 000, HA). Empty only in plans made before reporters existed."
        ),
    )
    refined_by: str | None = Field(
        default=None,
        description=(
            "The Succeeded migration that refines persisted to [current] in this update, if it does: our "
            "request's name, or storageversionmigrations.storagemigration.k8s.io/<name> for an in-tree one."
        ),
    )
    switch_resource_version: str | None = Field(
        default=None,
        description="status.currentHashResourceVersion to write: the one read (None: none, or record_switch).",
    )
    record_switch: GroupVersionResource | None = Field(
        default=None,
        description=(
            "Issue 36: the current hash is recorded (again) in this write: LIST this resource (limit 1) "
            "when applying, and write its list resourceVersion instead of switch_resource_version."
        ),
    )


class DeleteMigration(_Action):
    """Delete a pending migration detection created for a hash that is no longer current (seed 000)."""

    kind: Literal["DeleteMigration"] = "DeleteMigration"
    name: str
    uid: str | None = Field(description="metadata.uid: precondition of the delete, so a same-named successor survives.")


class CreateMigration(_Action):
    """Request a migration of a resource to its current storage version (label DETECTION_LABEL=detection)."""

    kind: Literal["CreateMigration"] = "CreateMigration"
    group: str
    version: str = Field(description="The preferred version from discovery: the endpoint the migration uses.")
    resource: str
    target_hash: str = Field(description="The current hash this migration is meant to reach.")

    @property
    def group_resource(self) -> str:
        """``<resource>.<group>`` or ``<resource>`` for core."""
        return storage_state_name(self.group, self.resource)


class TrimStoredVersions(_Action):
    """Set a CRD's status.storedVersions to its storage version, guarded by the resourceVersion read."""

    kind: Literal["TrimStoredVersions"] = "TrimStoredVersions"
    crd_name: str
    stored_versions: list[str]
    resource_version: str


_A = TypeVar("_A", bound=_Action)

Action = Annotated[
    CreateState | UpdateState | DeleteMigration | CreateMigration | TrimStoredVersions,
    Field(discriminator="kind"),
]


class DetectionPlan(BaseModel):
    """What one poll does: the actions, in order, and the resources it does not track."""

    model_config = ConfigDict(frozen=True)

    actions: list[Action] = Field(
        default_factory=list,
        description=(
            "Per resource (sorted by group, resource): deletions first, then the state "
            "write, then a CRD trim, then a migration request."
        ),
    )
    skipped: list[SkippedResource] = Field(default_factory=list, description="Resources not tracked, and why.")

    @property
    def creates_migrations(self) -> bool:
        """Whether the poll requests any migration (then run-migrations should be started)."""
        return any(isinstance(a, CreateMigration) for a in self.actions)

    def of_kind(self, kind: type[_A]) -> list[_A]:
        """The actions of one class, in plan order."""
        return [a for a in self.actions if isinstance(a, kind)]
