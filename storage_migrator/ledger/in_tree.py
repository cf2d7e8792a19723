"""The ledger's record of in-tree migrations made by anyone (issue 36, item 4).

Design decision: a poll observes every ``storagemigration.k8s.io`` object; the
ledger keeps one row per object and phase. The ledger itself is the memory of
what was seen (its unique cluster, uid and phase), so a poll records, and
announces, only what the ledger does not have yet
(:func:`storage_migrator.detection.in_tree.news`), and the database drops a
row another poll wrote meanwhile. When the ledger cannot be read the poll
records nothing of them (the caller says so): a later poll catches up, and a
phase an object went through meanwhile is not recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from storage_migrator.detection.in_tree import news
from storage_migrator.kube.in_tree import InTreeMigration
from storage_migrator.ledger.records import InTreeSeen
from storage_migrator.ledger.writer import LedgerWriter

__all__ = ["record_in_tree", "sighting"]


def sighting(migration: InTreeMigration, *, cluster: str, now: datetime, flow_run_id: str | None) -> InTreeSeen:
    """The ledger row of one in-tree migration in the phase a poll saw it in."""
    return InTreeSeen(
        cluster=cluster, uid=migration.uid, name=migration.name, api_version=migration.api_version,
        resource=migration.group_resource, phase=migration.phase, created_by=migration.created_by,
        created_at=migration.created_at, running_since=migration.running_since, finished_at=migration.finished_at,
        resource_version=migration.resource_version, reason=migration.reason[:128],
        message=migration.message[:4000], observed_at=now, flow_run_id=flow_run_id,
    )  # fmt: skip


def record_in_tree(
    writer: LedgerWriter,
    seen: Sequence[InTreeMigration],
    *,
    cluster: str,
    now: datetime,
    flow_run_id: str | None,
) -> list[InTreeMigration]:
    """Queue a row for each in-tree migration in a phase the ledger has not recorded; those are returned
    (the poll's events). Raises when the ledger cannot be read (then nothing is queued)."""
    if not seen:
        return []
    from storage_migrator.ledger.database import ledger_engine  # SQLAlchemy only when there is one (issue 29)
    from storage_migrator.ledger.in_tree_history import in_tree_seen

    recorded = in_tree_seen(ledger_engine(writer.url), cluster=cluster, uids=[m.uid for m in seen])
    fresh = news(seen, recorded)
    for migration in fresh:
        writer.submit(sighting(migration, cluster=cluster, now=now, flow_run_id=flow_run_id))
    return fresh
