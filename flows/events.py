"""Our Prefect events (DESIGN 4.10), and making sure they reach the API.

Every event is named `storage-migrator.<what>.<happened>`, concerns one of our
objects (`storage-migrator.storageversionmigration.<name>`,
`storage-migrator.storagestate.<name>`; `...<cluster>.<name>` for a named
cluster, issue 20) with the label `storage-migrator.cluster`, and carries names,
hashes and counters only: never anything read from a migrated object (DESIGN 8). docs/observability.md ("Events")
lists them with their payload keys; Prefect automations match on these names.

Delivery (issue 12, item 5). `emit_event` only queues: a background worker
sends the event over a websocket, and the server stores it a few seconds later
(its event persister flushes every 5 s or 20 events). A flow called directly,
with no `PREFECT_API_URL`, talks to a temporary server that Prefect stops as
soon as the Python process exits; what it has not stored by then is lost, and
its services log ERRORs with tracebacks while they are cut off mid-write. So
the outermost flow of a run that has no server of its own waits, at its end,
until the events it emitted are readable through the API (bounded; a WARNING,
never an ERROR, if they are not). Against a real server nothing is waited for:
the server outlives the process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final
from uuid import UUID

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.events import Event, emit_event
from prefect.events.filters import EventFilter, EventIDFilter
from prefect.settings import PREFECT_API_URL

from storage_migrator.detection.changes import HashChanged, MigrationRequested, PollChanges, StateRefined
from storage_migrator.fleet.names import DEFAULT_CLUSTER
from storage_migrator.kube.in_tree import InTreeMigration
from storage_migrator.models import MigrationProgress, ObjectFailure

PREFIX: Final = "storage-migrator"
MIGRATION_EVENTS: Final = tuple(f"{PREFIX}.migration.{o}" for o in ("started", "succeeded", "failed", "cancelled"))
STORAGE_VERSION_CHANGED: Final = f"{PREFIX}.storage-version.changed"
MIGRATION_REQUESTED: Final = f"{PREFIX}.migration.requested"
STATE_REFINED: Final = f"{PREFIX}.state.refined"
#: Issue 36: `storage-migrator.in-tree-migration.<pending|running|succeeded|failed>`, once per object and phase.
IN_TREE_EVENTS: Final = tuple(f"{PREFIX}.in-tree-migration.{p}" for p in ("pending", "running", "succeeded", "failed"))

#: How long the outermost flow of an ephemeral run waits for its events to be stored.
DELIVERY_TIMEOUT_SECONDS: Final = 30.0

_emitted: ContextVar[list[Event] | None] = ContextVar("storage_migrator_emitted_events", default=None)
#: The cluster the run is for (flows/cluster_scope.py sets it): every event says it.
CLUSTER: ContextVar[str] = ContextVar("storage_migrator_cluster", default=DEFAULT_CLUSTER)


def _our_object(kind: str, name: str) -> str:
    """A resource id per cluster: two clusters' requests may share a name (the default keeps today's ids)."""
    cluster = CLUSTER.get()
    return f"{kind}.{name}" if cluster == DEFAULT_CLUSTER else f"{kind}.{cluster}.{name}"


def migration_resource_id(name: str) -> str:
    return _our_object(f"{PREFIX}.storageversionmigration", name)


def state_resource_id(name: str) -> str:
    return _our_object(f"{PREFIX}.storagestate", name)


def in_tree_resource_id(name: str) -> str:
    return _our_object(f"{PREFIX}.in-tree-migration", name)


def emit(event: str, *, resource: Mapping[str, str], payload: Mapping[str, Any],
         related: list[dict[str, str]] | None = None) -> None:  # fmt: skip
    """`emit_event`, remembered for the delivery check of the enclosing flow."""
    labelled = {**resource, f"{PREFIX}.cluster": CLUSTER.get()}
    sent = emit_event(event=event, resource=labelled, payload=dict(payload), related=related)
    pending = _emitted.get()
    if sent is not None and pending is not None:
        pending.append(sent)


def emit_migration(outcome: str, *, migration: str, group_resource: str, progress: MigrationProgress,
                   message: str = "", failures: list[ObjectFailure] | None = None,
                   engine: str | None = None) -> None:  # fmt: skip
    """`storage-migrator.migration.<outcome>`: counters, our own summary (names, codes,
    reasons, field paths) and, when it failed, the failed objects' records (names, codes,
    reasons and field paths: storage_migrator.migration.failures); `engine` (issue 36)
    when kube-controller-manager's in-tree migrator wrote."""
    payload: dict[str, Any] = {"progress": progress.model_dump(), "message": message[:1000]}
    if engine is not None:
        payload["engine"] = engine
    if failures is not None:
        payload["failures"] = [f.model_dump(exclude_none=True) for f in failures]
    emit(
        f"{PREFIX}.migration.{outcome}",
        resource={
            "prefect.resource.id": migration_resource_id(migration),
            "prefect.resource.name": migration,
            "storage-migrator.resource": group_resource,
        },
        payload=payload,
    )


def _state_resource(state: str, group_resource: str) -> dict[str, str]:
    return {
        "prefect.resource.id": state_resource_id(state),
        "prefect.resource.name": state,
        "storage-migrator.resource": group_resource,
    }


def emit_poll_changes(changes: PollChanges) -> None:
    """Detection's events (seed 000's controller made visible): a new storage version
    hash, a migration it requested, a StorageState refined to the current hash."""
    for changed in changes.hash_changes:
        _emit_hash_changed(changed)
    for requested in changes.requested:
        _emit_requested(requested)
    for refined in changes.refined:
        _emit_refined(refined)


def _emit_hash_changed(changed: HashChanged) -> None:
    emit(STORAGE_VERSION_CHANGED, resource=_state_resource(changed.state, changed.group_resource),
         payload={"previous_hash": changed.previous_hash, "current_hash": changed.current_hash})  # fmt: skip


def _emit_requested(requested: MigrationRequested) -> None:
    emit(
        MIGRATION_REQUESTED,
        resource={
            "prefect.resource.id": migration_resource_id(requested.migration),
            "prefect.resource.name": requested.migration,
            "storage-migrator.resource": requested.group_resource,
        },
        related=[{"prefect.resource.id": state_resource_id(requested.state), "prefect.resource.role": "storage-state"}],
        payload={"target_hash": requested.target_hash, "requested_by": "detection"},
    )


def _emit_refined(refined: StateRefined) -> None:
    emit(STATE_REFINED, resource=_state_resource(refined.state, refined.group_resource),
         payload={"current_hash": refined.current_hash, "previous_persisted": refined.previous_persisted,
                  "persisted": [refined.current_hash], "migration": refined.migration})  # fmt: skip


def emit_in_tree(migration: InTreeMigration) -> None:
    """`storage-migrator.in-tree-migration.<phase>`: a storagemigration.k8s.io migration, anyone's, seen
    in a phase for the first time (issue 36): who created it, where it migrated up to, its condition."""
    emit(
        f"{PREFIX}.in-tree-migration.{migration.phase.lower()}",
        resource={
            "prefect.resource.id": in_tree_resource_id(migration.name),
            "prefect.resource.name": migration.name,
            "storage-migrator.resource": migration.group_resource,
        },
        related=[
            {
                "prefect.resource.id": state_resource_id(migration.group_resource),
                "prefect.resource.role": "storage-state",
            }
        ],
        payload={
            "api_version": migration.api_version,
            "uid": migration.uid,
            "phase": migration.phase,
            "created_by": migration.created_by,
            "resource_version": migration.resource_version,
            "reason": migration.reason,
            "message": migration.message[:1000],
        },
    )


@contextmanager
def delivered_events() -> Iterator[None]:
    """Around a flow's body: at its end, with no Prefect server of its own (ephemeral
    mode), wait until the events emitted inside are stored. Nested flows leave it to
    the outermost one."""
    if _emitted.get() is not None:
        yield
        return
    if PREFECT_API_URL.value() == "":
        # Empty in a Prefect profile: flows/__init__.py only clears the environment's.
        get_run_logger().warning(
            "PREFECT_API_URL is set but empty: this run's events cannot be sent (EventsWorker errors); "
            "unset it (`prefect config unset PREFECT_API_URL`, `unset PREFECT_API_URL`) to use a temporary "
            "server, or set it to your server's API URL"
        )
    pending: list[Event] = []
    token = _emitted.set(pending)
    try:
        yield
    finally:
        _emitted.reset(token)
        if pending and PREFECT_API_URL.value() is None:
            wait_until_stored(pending)


def wait_until_stored(events: list[Event], *, timeout: float = DELIVERY_TIMEOUT_SECONDS) -> None:
    """Poll the events API until every one of `events` is readable, or warn after `timeout`."""
    wanted = {e.id for e in events}
    deadline = time.monotonic() + timeout
    missing: set[UUID] = set(wanted)
    try:
        with get_client(sync_client=True) as client:
            while missing and time.monotonic() < deadline:
                page = client.read_events(filter=EventFilter(id=EventIDFilter(id=sorted(missing))), limit=50)
                missing -= {e.id for e in page.events}
                if missing:
                    time.sleep(0.25)
    except Exception as exc:  # noqa: BLE001 - delivery is best effort; the run's outcome stands
        get_run_logger().warning("could not check that the run's events were stored: %s", exc)
        return
    if missing:
        get_run_logger().warning(
            "%d of %d events not stored after %.0f s; run a Prefect server (PREFECT_API_URL) to keep every event",
            len(missing), len(wanted), timeout,
        )  # fmt: skip
