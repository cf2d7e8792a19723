"""What a detection poll changed, as typed records (for events, DESIGN 4.10).

Design decision: the flow emits `storage-migrator.storage-version.changed`,
`storage-migrator.migration.requested` and `storage-migrator.state.refined`
from these records, built from the actions that were applied and the objects
as they were read, never by parsing the reasons written for people. A record
holds names and hashes only.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from storage_migrator.detection.actions import CreateMigration, UpdateState
from storage_migrator.models import StorageState

__all__ = ["HashChanged", "MigrationRequested", "PollChanges", "StateRefined", "is_heartbeat", "update_changes"]


class HashChanged(BaseModel):
    """status.currentStorageVersionHash of a StorageState moved (seed 000: the API servers agree on a new one)."""

    state: str = Field(description="StorageState name: <resource>.<group>, or <resource> for core.")
    group_resource: str
    previous_hash: str | None
    current_hash: str


class MigrationRequested(BaseModel):
    """Detection created a StorageVersionMigration (seed 000)."""

    migration: str
    state: str
    group_resource: str
    target_hash: str


class StateRefined(BaseModel):
    """persistedStorageVersionHashes became [current] after a migration succeeded (seed 000)."""

    state: str
    group_resource: str
    current_hash: str
    previous_persisted: list[str]
    migration: str | None = Field(default=None, description="The Succeeded migration that proved it.")


class PollChanges(BaseModel):
    """Every change of one poll that an automation may care about."""

    hash_changes: list[HashChanged] = Field(default_factory=list)
    requested: list[MigrationRequested] = Field(default_factory=list)
    refined: list[StateRefined] = Field(default_factory=list)

    def add_update(self, action: UpdateState, old: StorageState | None) -> None:
        """Record what an applied UpdateState changed, compared with the object it replaced."""
        changed, refined = update_changes(action, old)
        if changed is not None:
            self.hash_changes.append(changed)
        if refined is not None:
            self.refined.append(refined)

    def add_request(self, action: CreateMigration, migration: str) -> None:
        gr = action.group_resource
        self.requested.append(
            MigrationRequested(migration=migration, state=gr, group_resource=gr, target_hash=action.target_hash)
        )


def update_changes(action: UpdateState, old: StorageState | None) -> tuple[HashChanged | None, StateRefined | None]:
    """The hash change and the refinement an UpdateState makes, if any (None, None for a heartbeat)."""
    if old is None:
        return None, None
    group_resource = action.name
    previous = old.status.current_storage_version_hash
    changed = None
    if previous != action.current_hash:
        changed = HashChanged(state=action.name, group_resource=group_resource, previous_hash=previous,
                              current_hash=action.current_hash)  # fmt: skip
    before = list(old.status.persisted_storage_version_hashes)
    refined = None
    if action.refined_by is not None and action.persisted == [action.current_hash] and before != action.persisted:
        refined = StateRefined(state=action.name, group_resource=group_resource, current_hash=action.current_hash,
                               previous_persisted=before, migration=action.refined_by)  # fmt: skip
    return changed, refined


def is_heartbeat(action: UpdateState, old: StorageState | None) -> bool:
    """Whether this update writes nothing but heartbeats: same hashes, persisted list, reporters and
    annotations as the object read (seed 000: "the controller simply updates the status.lastHeartbeatTime
    and is done"). What ``storage-migrator plan`` counts rather than lists: nothing to do."""
    if old is None:
        return False
    status = old.status
    reporters = [(e.reporter_id, e.current_storage_version_hash) for e in status.current_storage_version_hashes]
    return (
        action.current_hash == status.current_storage_version_hash
        and action.persisted == list(status.persisted_storage_version_hashes)
        and action.annotations == dict(old.metadata.annotations or {})
        and [(e.reporter_id, e.current_storage_version_hash) for e in action.current_hashes] == reporters
        and action.record_switch is None
        and action.switch_resource_version == status.current_hash_resource_version
    )
