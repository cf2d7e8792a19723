"""In-tree migrations made by anyone: which hold our requests back, and which are news for the record.

Design decision (issue 36, item 4): objects of ``storagemigration.k8s.io``
(kube-controller-manager's own migrator) are created by ``kubectl``, Gardener or
a provider's tooling, not by us. Detection observes them every poll
(:mod:`storage_migrator.kube.in_tree` reads them):

- while one runs for a resource, detection requests no migration of its own for
  it (two migrations of one resource rewrite every object twice); one that no
  controller has picked up (no condition yet) holds our requests for
  ``pickup_seconds`` after it was created (two poll periods), no longer: the API
  can be served while kube-controller-manager's gate is off, and a request
  nobody runs must not stop detection for good;
- a succeeded one refines a StorageState exactly as our own do
  (:mod:`storage_migrator.detection.ordering`, in ``status_draft.refine``);
- each one gets a ledger row and an event once per phase it is seen in: the
  ledger is the memory (uid and phase), :func:`news` is what it has not seen.
Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from storage_migrator.kube.in_tree import InTreeMigration
from storage_migrator.models import format_time

__all__ = ["creator_text", "hold_reason", "holding", "news", "not_picked_up"]


def creator_text(migration: InTreeMigration) -> str:
    """``created by kubectl-create``, or that the object does not say."""
    return f"created by {migration.created_by}" if migration.created_by else "creator unknown (no field manager)"


def _waiting_for_pickup(migration: InTreeMigration, *, now: datetime, pickup_seconds: float) -> bool:
    created = migration.created_at
    return created is None or (now - created).total_seconds() <= pickup_seconds


def holding(
    migrations: Sequence[InTreeMigration], *, now: datetime, pickup_seconds: float
) -> tuple[InTreeMigration | None, list[InTreeMigration]]:
    """The in-tree migration that holds our requests for a resource (the first running, else the
    first pending young enough), and the pending ones no controller picked up in time."""
    running = [m for m in migrations if m.phase == "Running"]
    pending = [m for m in migrations if m.phase == "Pending"]
    young = [m for m in pending if _waiting_for_pickup(m, now=now, pickup_seconds=pickup_seconds)]
    stuck = [m for m in pending if m not in young]
    return next(iter(running + young), None), stuck


def hold_reason(migration: InTreeMigration) -> str:
    """Why detection requests nothing while ``migration`` runs (the poll's report)."""
    state = "running" if migration.phase == "Running" else "waiting for kube-controller-manager's controller"
    return (
        f"in-tree migration {migration.display_name} ({migration.api_version}, {creator_text(migration)}) "
        f"is {state}: no request of ours beside it"
    )


def not_picked_up(migration: InTreeMigration, *, pickup_seconds: float) -> str:
    """Why an in-tree migration no longer holds our requests (the poll's report)."""
    since = format_time(migration.created_at) if migration.created_at else "an unknown time"
    return (
        f"in-tree migration {migration.display_name} has had no status since {since}, more than "
        f"{pickup_seconds:g}s: no controller runs it (kube-controller-manager's StorageVersionMigrator gate "
        "off, or its controller down), so it does not hold our requests"
    )


def news(migrations: Iterable[InTreeMigration], recorded: set[tuple[str, str]]) -> list[InTreeMigration]:
    """The in-tree migrations in a phase the ledger has not recorded them in ((uid, phase) pairs)."""
    return [m for m in migrations if (m.uid, m.phase) not in recorded]
