"""StorageState objects: reading them and writing what detection decided.

Design decision (seed 000 "Storage migration triggering controller"): a hash
change is written "as a single operation" — heartbeat, current hash and the
appended persisted hash in one status update, conditional on the
resourceVersion the plan was made from, so a concurrent writer (another poll,
an operator resetting the state) makes the write fail instead of being
overwritten; the next poll plans again from what is there. Our bookkeeping
annotations (when the current hash was first seen, when the settle delay ends)
live in metadata and are written first, only when they change. Issue 36: the
resource's list resourceVersion when the current hash was recorded is written in
the same status update (``currentHashResourceVersion``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kubernetes.client import ApiClient

from storage_migrator.kube.listing import iterate_items
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.writing import create_object, patch_object
from storage_migrator.models import (
    GROUP,
    STORAGE_STATES,
    VERSION,
    GroupResource,
    ObjectMeta,
    StorageState,
    StorageStateSpec,
    StorageStateStatus,
    StorageVersionHash,
)

__all__ = ["STATES", "create_state", "list_states", "write_state"]

STATES = ResourceRef(group=GROUP, version=VERSION, resource=STORAGE_STATES)


def list_states(api: ApiClient) -> list[StorageState]:
    return [StorageState.model_validate(item) for item in iterate_items(api, STATES, limit=500)]


def _status(
    current_hash: str,
    persisted: list[str],
    heartbeat: datetime,
    current_hashes: list[StorageVersionHash],
    switch_resource_version: str | None,
) -> dict[str, Any]:
    wire = StorageStateStatus(
        current_storage_version_hash=current_hash,
        persisted_storage_version_hashes=persisted,
        last_heartbeat_time=heartbeat,
        current_storage_version_hashes=current_hashes,
        current_hash_resource_version=switch_resource_version,
    ).to_wire()
    # A merge patch keeps a key it does not name: null removes a resourceVersion no longer true.
    wire.setdefault("currentHashResourceVersion", None)
    return wire


def create_state(
    api: ApiClient,
    *,
    name: str,
    group: str,
    resource: str,
    current_hash: str,
    persisted: list[str],
    heartbeat: datetime,
    annotations: dict[str, str],
    current_hashes: list[StorageVersionHash] | None = None,
    switch_resource_version: str | None = None,
) -> StorageState:
    """Create the object, then its status (a status subresource ignores status on create)."""
    state = StorageState(
        metadata=ObjectMeta(name=name, annotations=annotations or None),
        spec=StorageStateSpec(resource=GroupResource(group=group, resource=resource)),
    )
    created = StorageState.model_validate(create_object(api, STATES, state.to_wire()))
    answer = patch_object(
        api, STATES, name=name, subresource="status", resource_version=created.metadata.resource_version,
        patch={"status": _status(current_hash, persisted, heartbeat, current_hashes or [], switch_resource_version)},
    )  # fmt: skip
    return StorageState.model_validate(answer)


def write_state(
    api: ApiClient,
    *,
    name: str,
    resource_version: str,
    current_hash: str,
    persisted: list[str],
    heartbeat: datetime,
    annotations: dict[str, str],
    old_annotations: dict[str, str],
    current_hashes: list[StorageVersionHash] | None = None,
    switch_resource_version: str | None = None,
) -> StorageState:
    """One status update conditional on `resource_version` (409 Conflict if the state moved)."""
    rv = resource_version
    if annotations != old_annotations:
        removed: dict[str, Any] = {k: None for k in old_annotations if k not in annotations}
        answer = patch_object(api, STATES, name=name, resource_version=rv,
                              patch={"metadata": {"annotations": {**removed, **annotations}}})  # fmt: skip
        rv = str(answer["metadata"]["resourceVersion"])
    answer = patch_object(
        api, STATES, name=name, subresource="status", resource_version=rv,
        patch={"status": _status(current_hash, persisted, heartbeat, current_hashes or [], switch_resource_version)},
    )  # fmt: skip
    return StorageState.model_validate(answer)
