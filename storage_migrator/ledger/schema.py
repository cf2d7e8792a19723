"""The ledger's tables, as a typed SQLAlchemy 2 ORM (DESIGN 4.9).

Design decision: every table is append-only. A run is two rows, written when
they happen: `migration_runs` when it starts and `run_outcomes` when it ends,
so nothing is ever updated and a run without an outcome is visibly one that is
still going or died. Rows refer to their run by a client-made id, without a
foreign key: when the database was down at a run's start, its chunks and
outcome still land (the gap is recorded in `ledger_gaps`). Tokens and counters
only, never object contents (DESIGN 8).

Issue 20 (revision r0003): one ledger holds the history of a fleet, so every
row that belongs to one cluster says which (`cluster`: the KubernetesClusterConfig
block's name, or `default`); rows written before are the environment's cluster.
Each table's queries filter by cluster first, so the cluster leads its index.

Changing a table means a new Alembic revision in `schema_migrations/versions/`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, Float, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from storage_migrator.fleet.names import DEFAULT_CLUSTER

__all__ = [
    "Base",
    "ChunkRow",
    "GapRow",
    "InTreeMigrationRow",
    "PerCluster",
    "PollRow",
    "RunOutcomeRow",
    "RunRow",
    "StateChangeRow",
    "UtcDateTime",
]


class UtcDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in and out, whatever the database keeps (SQLite keeps no zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the ledger stores UTC times only")
        return value.astimezone(UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


#: The clusters of a gap row written before r0003: a ledger had one cluster then.
DEFAULT_CLUSTERS_JSON = f'["{DEFAULT_CLUSTER}"]'


class Base(DeclarativeBase):
    pass


class Counters:
    """The object counters of seed 002's outcomes (DESIGN 4.5 table), shared by chunk and outcome rows."""

    listed: Mapped[int] = mapped_column(Integer, default=0)
    rewritten: Mapped[int] = mapped_column(Integer, default=0)
    unchanged: Mapped[int] = mapped_column(Integer, default=0)
    gone: Mapped[int] = mapped_column(Integer, default=0)
    conflicted: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)


class PerCluster:
    """The cluster a row belongs to (issue 20): rows from before r0003 are the environment's cluster."""

    cluster: Mapped[str] = mapped_column(String(253), default=DEFAULT_CLUSTER, server_default=DEFAULT_CLUSTER)


class RunRow(PerCluster, Base):
    """One migration run (one flow run of migrate-resource), written when it starts."""

    __tablename__ = "migration_runs"
    __table_args__ = (Index("ix_migration_runs_cluster_started_at", "cluster", "started_at"),)

    run_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    migration: Mapped[str] = mapped_column(String(253), index=True)
    migration_uid: Mapped[str] = mapped_column(String(64), index=True)
    resource: Mapped[str] = mapped_column(String(253), index=True)
    version: Mapped[str] = mapped_column(String(63))
    target_storage_version_hash: Mapped[str | None] = mapped_column(String(64))
    encryption_key: Mapped[str | None] = mapped_column(String(253))
    requested_by: Mapped[str] = mapped_column(String(63))
    flow_run_id: Mapped[str | None] = mapped_column(String(36))
    started_at: Mapped[datetime] = mapped_column(UtcDateTime(), index=True)
    resumed_from_token: Mapped[bool] = mapped_column(default=False)


class RunOutcomeRow(PerCluster, Counters, Base):
    """How a run ended, written when it ends (the run's identity is repeated: see the module docstring)."""

    __tablename__ = "run_outcomes"
    __table_args__ = (Index("ix_run_outcomes_cluster_finished_at", "cluster", "finished_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(36), index=True)
    migration: Mapped[str] = mapped_column(String(253))
    migration_uid: Mapped[str] = mapped_column(String(64))
    resource: Mapped[str] = mapped_column(String(253), index=True)
    finished_at: Mapped[datetime] = mapped_column(UtcDateTime(), index=True)
    outcome: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(128), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    chunks: Mapped[int] = mapped_column(Integer, default=0)
    passes: Mapped[int] = mapped_column(Integer, default=1)
    #: Issue 19 (revision r0002): the configuration hash every API server ran, for a run naming a key.
    encryption_config_hash: Mapped[str | None] = mapped_column(String(71), default=None)
    #: ``agreed`` (every server reported that hash) or ``overridden`` (an operator accepted the risk).
    server_check: Mapped[str | None] = mapped_column(String(16), default=None)
    #: Issue 36 (revision r0005): ``client`` or ``in-tree`` (NULL before: client), and why when auto chose.
    engine: Mapped[str | None] = mapped_column(String(16), default=None)
    engine_note: Mapped[str | None] = mapped_column(Text, default=None)


class ChunkRow(PerCluster, Counters, Base):
    """One settled chunk of a run, written after its checkpoint: tokens and counters only."""

    __tablename__ = "migration_chunks"
    __table_args__ = (Index("ix_migration_chunks_cluster_resource", "cluster", "resource"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(36), index=True)
    resource: Mapped[str] = mapped_column(String(253), index=True)
    sequence: Mapped[int] = mapped_column(Integer)
    token_in: Mapped[str | None] = mapped_column(Text)
    token_out: Mapped[str | None] = mapped_column(Text)
    retries: Mapped[int] = mapped_column(Integer, default=0)
    relisted: Mapped[int] = mapped_column(Integer, default=0)
    duration_seconds: Mapped[float] = mapped_column(Float)
    recorded_at: Mapped[datetime] = mapped_column(UtcDateTime())


class StateChangeRow(PerCluster, Base):
    """One StorageState created or updated by a detection poll."""

    __tablename__ = "state_changes"
    __table_args__ = (Index("ix_state_changes_cluster_recorded_at", "cluster", "recorded_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    recorded_at: Mapped[datetime] = mapped_column(UtcDateTime(), index=True)
    state: Mapped[str] = mapped_column(String(253), index=True)
    action: Mapped[str] = mapped_column(String(16))
    old_current_hash: Mapped[str | None] = mapped_column(String(64))
    new_current_hash: Mapped[str | None] = mapped_column(String(64))
    old_persisted: Mapped[str] = mapped_column(Text, default="[]")
    new_persisted: Mapped[str] = mapped_column(Text, default="[]")
    reason: Mapped[str] = mapped_column(Text, default="")
    flow_run_id: Mapped[str | None] = mapped_column(String(36))


class PollRow(PerCluster, Base):
    """One detection poll: what it saw and did."""

    __tablename__ = "detection_polls"
    __table_args__ = (Index("ix_detection_polls_cluster_finished_at", "cluster", "finished_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    started_at: Mapped[datetime] = mapped_column(UtcDateTime())
    finished_at: Mapped[datetime] = mapped_column(UtcDateTime(), index=True)
    duration_seconds: Mapped[float] = mapped_column(Float)
    resources_seen: Mapped[int] = mapped_column(Integer)
    changes: Mapped[int] = mapped_column(Integer)
    requests_made: Mapped[int] = mapped_column(Integer)
    errors: Mapped[int] = mapped_column(Integer, default=0)
    flow_run_id: Mapped[str | None] = mapped_column(String(36))


class InTreeMigrationRow(PerCluster, Base):
    """An in-tree migration (``storagemigration.k8s.io``, anyone's) seen by a poll in one phase (issue 36).

    One row per object and phase, never more (unique uid and phase per cluster: a
    second poll's row for the same phase is dropped by the database, issue 36's
    "once per object and outcome"), so its history is the phases polls saw it in.
    """

    __tablename__ = "in_tree_migrations"
    __table_args__ = (
        UniqueConstraint("cluster", "uid", "phase", name="uq_in_tree_migrations_cluster_uid_phase"),
        Index("ix_in_tree_migrations_cluster_observed_at", "cluster", "observed_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    uid: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(253))
    api_version: Mapped[str] = mapped_column(String(63))
    resource: Mapped[str] = mapped_column(String(253), index=True)
    phase: Mapped[str] = mapped_column(String(16))
    created_by: Mapped[str | None] = mapped_column(String(253))
    created_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    running_since: Mapped[datetime | None] = mapped_column(UtcDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    resource_version: Mapped[str | None] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(String(128), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    observed_at: Mapped[datetime] = mapped_column(UtcDateTime())
    flow_run_id: Mapped[str | None] = mapped_column(String(36))


class GapRow(Base):
    """Rows a writer could not write (database unreachable for too long, queue full): the gap is the record."""

    __tablename__ = "ledger_gaps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    recorded_at: Mapped[datetime] = mapped_column(UtcDateTime(), index=True)
    first_lost_at: Mapped[datetime] = mapped_column(UtcDateTime())
    last_lost_at: Mapped[datetime] = mapped_column(UtcDateTime())
    rows_lost: Mapped[int] = mapped_column(Integer)
    kinds: Mapped[str] = mapped_column(Text)
    resources: Mapped[str] = mapped_column(Text, default="[]")
    #: Issue 20 (r0003): the clusters of the lost rows (a writer serves every cluster of its process), as JSON.
    clusters: Mapped[str] = mapped_column(Text, default=DEFAULT_CLUSTERS_JSON, server_default=DEFAULT_CLUSTERS_JSON)
    reason: Mapped[str] = mapped_column(Text)
