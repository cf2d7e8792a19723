"""What the migrator hands the ledger writer: one pydantic model per row kind.

Design decision: the flows and tasks build these plain values (validated where
they are made, so a bad value fails in a test, not in a background thread),
and only the writer turns them into ORM rows, in its own thread and session.
Names, tokens, hashes and counters only: there is no field an object body fits
in (DESIGN 8). Every record of a run or a poll names its cluster (issue 20),
the environment's (`default`) unless told.

Issue 29: a record names its table (`row`, a class of schema.py) instead of
holding it, so that making a record imports no SQLAlchemy: a flow-run process
loads it in the writer's thread, when the first row is written, not before
its first task.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.fleet.names import DEFAULT_CLUSTER

if TYPE_CHECKING:
    from storage_migrator.ledger.schema import Base

__all__ = [
    "ChunkRecord",
    "InTreeSeen",
    "LedgerRecord",
    "Outcome",
    "PollRecord",
    "RunFinished",
    "RunStarted",
    "StateChange",
]

#: How a run ended: the StorageVersionMigration's verdict, or that the run itself stopped.
Outcome = Literal["succeeded", "failed", "cancelled", "crashed"]
#: Issue 19: every API server reported the run's configuration hash, or an operator overrode the check.
ServerCheck = Literal["agreed", "overridden"]


class LedgerRecord(BaseModel):
    """One row to append; `kind` names it in logs and gap rows."""

    model_config = ConfigDict(frozen=True)

    kind: ClassVar[str] = "row"
    #: The ORM class of its table in storage_migrator/ledger/schema.py.
    row: ClassVar[str]
    #: A row its table keeps once (a unique key): a second one is dropped, not refused (writer.py).
    once: ClassVar[bool] = False

    def to_row(self) -> Base:
        return self._table()(**self.model_dump())

    def _table(self) -> type[Base]:
        from storage_migrator.ledger import schema  # the writer's thread: see the module docstring

        table: type[Base] = getattr(schema, self.row)
        return table

    @property
    def resource_name(self) -> str | None:
        """The resource the row is about, if any (listed in a gap row)."""
        return getattr(self, "resource", None)

    @property
    def cluster_name(self) -> str | None:
        """The cluster the row is about, if any (listed in a gap row)."""
        return getattr(self, "cluster", None)


#: A KubernetesClusterConfig block's name, or `default` (storage_migrator/fleet/names.py).
Cluster = Annotated[str, Field(min_length=1, max_length=253)]


class Counted(LedgerRecord):
    listed: int = Field(default=0, ge=0)
    rewritten: int = Field(default=0, ge=0)
    unchanged: int = Field(default=0, ge=0)
    gone: int = Field(default=0, ge=0)
    conflicted: int = Field(default=0, ge=0)
    failed: int = Field(default=0, ge=0)


class RunStarted(LedgerRecord):
    kind: ClassVar[str] = "run"
    row: ClassVar[str] = "RunRow"

    cluster: Cluster = DEFAULT_CLUSTER
    run_id: str
    migration: str
    migration_uid: str
    resource: str = Field(description="`<resource>.<group>`, or `<resource>` for core.")
    version: str
    target_storage_version_hash: str | None = None
    encryption_key: str | None = None
    requested_by: str
    flow_run_id: str | None = None
    started_at: datetime
    resumed_from_token: bool = False


class RunFinished(Counted):
    kind: ClassVar[str] = "outcome"
    row: ClassVar[str] = "RunOutcomeRow"

    cluster: Cluster = DEFAULT_CLUSTER
    run_id: str
    migration: str
    migration_uid: str
    resource: str
    finished_at: datetime
    outcome: Outcome
    reason: str = ""
    message: str = Field(default="", max_length=4000)
    chunks: int = Field(default=0, ge=0)
    passes: int = Field(default=1, ge=1)
    encryption_config_hash: str | None = Field(default=None, max_length=71)
    server_check: ServerCheck | None = None
    engine: Literal["client", "in-tree"] | None = Field(default=None, description="Issue 36: which engine wrote.")
    engine_note: str | None = Field(default=None, max_length=4000, description="Why that engine, when auto chose.")


class ChunkRecord(Counted):
    kind: ClassVar[str] = "chunk"
    row: ClassVar[str] = "ChunkRow"

    cluster: Cluster = DEFAULT_CLUSTER
    run_id: str
    resource: str
    sequence: int = Field(ge=1)
    token_in: str | None
    token_out: str | None
    retries: int = Field(default=0, ge=0)
    relisted: int = Field(default=0, ge=0)
    duration_seconds: float = Field(ge=0)
    recorded_at: datetime


class StateChange(LedgerRecord):
    kind: ClassVar[str] = "state_change"
    row: ClassVar[str] = "StateChangeRow"

    cluster: Cluster = DEFAULT_CLUSTER
    recorded_at: datetime
    state: str = Field(description="The StorageState's name: `<resource>.<group>` or `<resource>`.")
    action: Literal["created", "updated"]
    old_current_hash: str | None = None
    new_current_hash: str | None = None
    old_persisted: list[str] = Field(default_factory=list)
    new_persisted: list[str] = Field(default_factory=list)
    reason: str = ""
    flow_run_id: str | None = None

    def to_row(self) -> Base:
        data = self.model_dump()
        data["old_persisted"] = json.dumps(self.old_persisted)
        data["new_persisted"] = json.dumps(self.new_persisted)
        return self._table()(**data)

    @property
    def resource_name(self) -> str | None:
        return self.state


class PollRecord(LedgerRecord):
    kind: ClassVar[str] = "poll"
    row: ClassVar[str] = "PollRow"

    cluster: Cluster = DEFAULT_CLUSTER
    started_at: datetime
    finished_at: datetime
    duration_seconds: float = Field(ge=0)
    resources_seen: int = Field(ge=0)
    changes: int = Field(ge=0)
    requests_made: int = Field(ge=0)
    errors: int = Field(default=0, ge=0)
    flow_run_id: str | None = None


class InTreeSeen(LedgerRecord):
    """An in-tree migration (storagemigration.k8s.io, anyone's) a poll saw in a phase (issue 36).

    Kept once per cluster, uid and phase: what a poll submits again is dropped."""

    kind: ClassVar[str] = "in_tree"
    row: ClassVar[str] = "InTreeMigrationRow"
    once: ClassVar[bool] = True

    cluster: Cluster = DEFAULT_CLUSTER
    uid: str = Field(min_length=1, max_length=64)
    name: str
    api_version: str = Field(description="storagemigration.k8s.io/v1 or /v1beta1, as read.")
    resource: str = Field(description="`<resource>.<group>`, or `<resource>` for core.")
    phase: Literal["Pending", "Running", "Succeeded", "Failed"]
    created_by: str | None = Field(default=None, description="The field manager that created it; None: unknown.")
    created_at: datetime | None = None
    running_since: datetime | None = None
    finished_at: datetime | None = None
    resource_version: str | None = Field(default=None, description="status.resourceVersion: migrated up to it.")
    reason: str = Field(default="", max_length=128)
    message: str = Field(default="", max_length=4000)
    observed_at: datetime
    flow_run_id: str | None = None
