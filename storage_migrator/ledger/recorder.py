"""The rows of one migration run, and who asked for it.

Design decision (issue 12, PREFECT.md "Costs"): the flow records in-process,
with no task run of its own: start, each chunk after its checkpoint, the
outcome. Every method only queues a row (`LedgerWriter.submit`), so a ledger
outage never fails or slows a migration. Every row of the run names the
cluster it ran on (issue 20), given once to `begin`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal

from storage_migrator.fleet.names import DEFAULT_CLUSTER
from storage_migrator.ledger.records import (
    ChunkRecord,
    LedgerRecord,
    Outcome,
    RunFinished,
    RunStarted,
    ServerCheck,
)
from storage_migrator.ledger.writer import LedgerWriter, WriterOptions, writer_for
from storage_migrator.migration.chunk_terms import ChunkResult
from storage_migrator.models import MigrationProgress
from storage_migrator.rotation.decisions import ENCRYPTION_KEY_ANNOTATION, REQUESTED_BY_LABEL, ROTATION_REQUESTER
from storage_migrator.settings import Settings

__all__ = ["RunRecorder", "encryption_key_of", "requested_by", "writer_from_settings"]

logger = logging.getLogger("storage_migrator.ledger")

#: The `migration.k8s.io/requested-by` values our flows set, as `history` names them.
REQUESTERS = {"detection": "detection", "initialize": "initializer", ROTATION_REQUESTER: "rotation"}
MANUAL = "manual"


def requested_by(labels: dict[str, str] | None) -> str:
    """Who asked: our flows label their requests; a request without the label was made by hand (kubectl)."""
    value = (labels or {}).get(REQUESTED_BY_LABEL)
    if not value:
        return MANUAL
    return REQUESTERS.get(value, value)


def encryption_key_of(annotations: dict[str, str] | None) -> str | None:
    """The write key a rotation request was made for (seed 003), if it says."""
    return (annotations or {}).get(ENCRYPTION_KEY_ANNOTATION) or None


def writer_from_settings(settings: Settings) -> LedgerWriter:
    return writer_for(settings.database_url, WriterOptions(
        retry_seconds=settings.ledger_retry_seconds, queue_size=settings.ledger_queue_size,
        flush_seconds=settings.ledger_flush_seconds,
    ))  # fmt: skip


def _now() -> datetime:
    return datetime.now(UTC)


class RunRecorder:
    """Queues the rows of one run; each method may be called from the flow at any point and never raises."""

    def __init__(self, writer: LedgerWriter, start: RunStarted) -> None:
        self.writer = writer
        self.start = start
        self.chunks = 0
        self.finished = False
        self.announced = False
        self.progress = MigrationProgress()
        #: Issue 19: set by a run that names a key, once the API servers' check passed (or was overridden).
        self.encryption_config_hash: str | None = None
        self.server_check: ServerCheck | None = None
        #: Issue 36: the engine that rewrote the objects, and why when the setting alone does not say it.
        self.engine: Literal["client", "in-tree"] = "client"
        self.engine_note = ""

    @classmethod
    def begin(
        cls,
        writer: LedgerWriter,
        *,
        migration: str,
        migration_uid: str,
        resource: str,
        version: str,
        target_hash: str | None,
        encryption_key: str | None,
        requested_by: str,
        flow_run_id: str | None,
        cluster: str = DEFAULT_CLUSTER,
    ) -> RunRecorder:
        start = RunStarted(run_id=str(uuid.uuid4()), cluster=cluster, migration=migration,
                           migration_uid=migration_uid, resource=resource, version=version,
                           target_storage_version_hash=target_hash or None, encryption_key=encryption_key,
                           requested_by=requested_by, flow_run_id=flow_run_id, started_at=_now())  # fmt: skip
        return cls(writer, start)

    def _queue(self, build: Callable[[], LedgerRecord]) -> None:
        """Queue the record `build` makes; a record that cannot be made is logged, never raised."""
        try:
            record = build()
        except Exception:  # the ledger never fails a migration (issue 12)
            logger.exception("ledger: a row of run %s could not be made", self.start.run_id)
            return
        self.writer.submit(record)

    def started(self, *, resumed: bool) -> None:
        """The run row, once (`ended` writes it first if the run stopped before it said)."""
        if not self.announced:
            self.announced = True
            self._queue(lambda: self.start.model_copy(update={"resumed_from_token": resumed}))

    def chunk(self, result: ChunkResult, *, duration_seconds: float, progress: MigrationProgress) -> None:
        """A chunk row, after its checkpoint; `progress` is the request's counters after it."""
        self.chunks += 1
        self.progress = progress
        self._queue(lambda: ChunkRecord(
            run_id=self.start.run_id, cluster=self.start.cluster, resource=self.start.resource,
            sequence=self.chunks, token_in=result.token_in, token_out=result.token_out, listed=result.listed,
            rewritten=result.rewritten, unchanged=result.unchanged, gone=result.gone,
            conflicted=result.conflicted, failed=result.failed, retries=result.retries, relisted=result.relisted,
            duration_seconds=max(0.0, duration_seconds), recorded_at=_now(),
        ))  # fmt: skip

    def ended(
        self, outcome: Outcome, progress: MigrationProgress, *, reason: str = "", message: str = "", passes: int = 1
    ) -> None:
        """The outcome row, once (a second call is ignored: the first verdict is the run's)."""
        if self.finished:
            return
        self.finished = True
        self.started(resumed=False)
        self._queue(lambda: RunFinished(
            run_id=self.start.run_id, cluster=self.start.cluster, migration=self.start.migration,
            migration_uid=self.start.migration_uid, resource=self.start.resource, finished_at=_now(),
            outcome=outcome, reason=reason[:128], message=message[:4000], listed=progress.listed,
            rewritten=progress.rewritten, unchanged=progress.unchanged, gone=progress.gone,
            conflicted=progress.conflicted, failed=progress.failed, chunks=progress.chunks, passes=max(1, passes),
            encryption_config_hash=self.encryption_config_hash, server_check=self.server_check,
            engine=self.engine, engine_note=self.engine_note[:4000] or None,
        ))  # fmt: skip
