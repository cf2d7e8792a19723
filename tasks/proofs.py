"""The task that records on a verification pass that it no longer proves a rotation (issue 39).

A run that sees the API servers on a configuration other than the one the newest
pass ran under, and does not prove under it (objects lost with a removed key,
servers that differ), writes what it saw into the pass's annotation
(storage_migrator/rotation/proofs.py's `OUTDATED_ANNOTATION`): writes may have gone
under another key meanwhile, so that pass never counts again, even if the servers
come back to its configuration. Only our own request is written; no object's content.
"""

from __future__ import annotations

from datetime import UTC, datetime

from prefect import task

from storage_migrator.kube.writing import patch_object
from storage_migrator.migration.requests import MIGRATIONS
from storage_migrator.rotation.proofs import OUTDATED_ANNOTATION
from storage_migrator.settings import Settings
from tasks.common import PRIVATE, REQUEST_RETRIES, connected

__all__ = ["mark_outdated"]


@task(name="mark-proofs-outdated", **REQUEST_RETRIES, **PRIVATE)
def mark_outdated(settings: Settings, passes: list[str], *, seen: str) -> None:
    """Annotate each verification pass in `passes`: the servers were seen running `seen`, which it does not prove."""
    note = f"the API servers ran {seen} at {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}, which it did not prove"
    with connected(settings) as api:
        for name in passes:
            patch_object(api, MIGRATIONS, name=name, patch={"metadata": {"annotations": {OUTDATED_ANNOTATION: note}}},
                         timeout=settings.request_timeout_seconds)  # fmt: skip
