"""Reading the ledger's in-tree migrations (issue 36): what a poll has seen, and their history.

Design decision: apart from ``queries.py`` so that a poll that sees no in-tree
migration imports nothing of SQLAlchemy for them (issue 29); `history` reads
them beside the runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from storage_migrator.ledger.schema import InTreeMigrationRow

__all__ = ["InTreeHistory", "in_tree_history", "in_tree_seen"]


class InTreeHistory(BaseModel):
    """An in-tree migration (storagemigration.k8s.io, anyone's) as polls saw it: its last phase (issue 36)."""

    cluster: str
    migration: str
    migration_uid: str
    api_version: str
    resource: str
    created_by: str | None = Field(description="The field manager that created it; None: the object does not say.")
    created_at: datetime | None
    started_at: datetime | None = Field(description="When its controller began (Running), else when it was created.")
    finished_at: datetime | None
    phase: str = Field(description="The last phase a poll saw it in: Pending, Running, Succeeded or Failed.")
    phases_seen: list[str] = Field(description="Every phase a poll saw it in, in the order they were first seen.")
    resource_version: str | None = Field(
        description="status.resourceVersion: the list resourceVersion it migrated up to."
    )
    reason: str
    message: str


def in_tree_seen(engine: Engine, *, cluster: str, uids: Iterable[str]) -> set[tuple[str, str]]:
    """The (uid, phase) pairs the ledger has of these in-tree migrations: what a poll need not record again."""
    wanted = sorted(set(uids))
    if not wanted:
        return set()
    query = select(InTreeMigrationRow.uid, InTreeMigrationRow.phase).where(
        InTreeMigrationRow.cluster == cluster, InTreeMigrationRow.uid.in_(wanted)
    )
    with Session(engine) as session:
        return {(uid, phase) for uid, phase in session.execute(query).all()}


def in_tree_history(
    engine: Engine,
    *,
    cluster: str | None = None,
    resource: str | None = None,
    since: datetime | None = None,
    limit: int = 1000,
) -> list[InTreeHistory]:
    """In-tree migrations newest first, each with the last phase polls saw it in."""
    query = select(InTreeMigrationRow).order_by(InTreeMigrationRow.observed_at, InTreeMigrationRow.id)
    if cluster is not None:
        query = query.where(InTreeMigrationRow.cluster == cluster)
    if resource:
        query = query.where(InTreeMigrationRow.resource == resource)
    rows_of: dict[tuple[str, str], list[InTreeMigrationRow]] = {}
    with Session(engine) as session:
        for row in session.scalars(query):
            rows_of.setdefault((row.cluster, row.uid), []).append(row)
    out = []
    for (row_cluster, uid), rows in rows_of.items():
        last = rows[-1]
        started = next((r.running_since for r in reversed(rows) if r.running_since), None) or last.created_at
        if since and (started or last.observed_at) < since:
            continue
        out.append(InTreeHistory(
            cluster=row_cluster, migration=last.name, migration_uid=uid, api_version=last.api_version,
            resource=last.resource, created_by=last.created_by, created_at=last.created_at, started_at=started,
            finished_at=last.finished_at, phase=last.phase, phases_seen=[r.phase for r in rows],
            resource_version=last.resource_version, reason=last.reason, message=last.message,
        ))  # fmt: skip
    out.sort(key=lambda h: h.started_at or h.created_at or datetime.min.replace(tzinfo=UTC), reverse=True)
    return out[:limit]
