"""A rotation's StorageVersionMigration in a given state, for the rotation's table tests."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from storage_migrator.conditions import set_condition
from storage_migrator.models import (
    MigrationProgress,
    ObjectFailure,
    StorageVersionMigration,
    new_storage_version_migration,
)
from storage_migrator.rotation.decisions import ENCRYPTION_KEY_ANNOTATION

__all__ = ["rotation_request"]


def rotation_request(
    name: str,
    state: str = "new",
    *,
    resource: str = "secrets",
    key: str | None = "key2",
    progress: MigrationProgress | None = None,
    failures: Sequence[str] = (),
    under: str | None = None,
) -> StorageVersionMigration:
    """A request `name` in `state` (new, running, succeeded or failed), for `key`, with these
    failures (422 each) and made under encryption configuration `under`."""
    m = new_storage_version_migration(group="", version="v1", resource=resource, name=name)
    if key is not None:
        m.metadata.annotations = {ENCRYPTION_KEY_ANNOTATION: key}
    now = datetime(2026, 11, 22, tzinfo=UTC)
    if state == "running":
        m.status.conditions = set_condition([], condition_type="Running", status="True", now=now)
    elif state in ("succeeded", "failed"):
        m.status.conditions = set_condition([], condition_type=state.capitalize(), status="True", now=now)
    m.status.progress = progress
    m.status.failures = [ObjectFailure(namespace="ns", name=n, code=422) for n in failures]
    m.status.encryption_config_hash = under
    return m
