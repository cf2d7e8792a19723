"""The ledger writer: rows appended from a background thread, never an error in a migration.

Design decision (issue 12: "a ledger outage never fails or blocks a
migration"): `submit` only puts the row on a bounded queue and returns. One
daemon thread per database URL writes what is queued in batches, retrying a
failing database with exponential backoff for up to `retry_seconds`. Rows it
finally cannot write (the outage lasted longer, the queue overflowed, a row
the database refused) are counted, logged, and written as one `ledger_gaps`
row in the same transaction as the next rows that do land, so the gap shows in
`history`. If the database never comes back while this process lives, the gap
row is lost with it; `history` then finds the StorageVersionMigration objects
that ran without a run row (the Kubernetes objects stay the source of truth).
"""

from __future__ import annotations

import atexit
import json
import logging
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from storage_migrator.ledger.records import LedgerRecord

if TYPE_CHECKING:
    from sqlalchemy import Table

    from storage_migrator.ledger.schema import GapRow

__all__ = ["LedgerWriter", "WriterOptions", "writer_for"]

logger = logging.getLogger("storage_migrator.ledger")

#: Rows written in one transaction at most.
BATCH = 200
FIRST_DELAY_SECONDS = 0.2
MAX_DELAY_SECONDS = 10.0


@dataclass(frozen=True)
class WriterOptions:
    retry_seconds: float = 300.0
    queue_size: int = 10_000
    flush_seconds: float = 10.0


@dataclass
class Lost:
    """Rows not written since the last gap row."""

    kinds: Counter[str] = field(default_factory=Counter)
    resources: set[str] = field(default_factory=set)
    clusters: set[str] = field(default_factory=set)
    first: datetime | None = None
    last: datetime | None = None
    reason: str = ""

    def add(self, records: list[LedgerRecord], reason: str) -> None:
        now = datetime.now(UTC)
        self.first = self.first or now
        self.last = now
        self.reason = reason
        for record in records:
            self.kinds[record.kind] += 1
            if record.resource_name:
                self.resources.add(record.resource_name)
            if record.cluster_name:
                self.clusters.add(record.cluster_name)

    def merged(self, newer: Lost) -> Lost:
        """These rows and the `newer` ones, as one gap."""
        return Lost(kinds=self.kinds + newer.kinds, resources=self.resources | newer.resources,
                    clusters=self.clusters | newer.clusters, first=self.first or newer.first,
                    last=newer.last or self.last,                    reason=newer.reason or self.reason)  # fmt: skip

    @property
    def count(self) -> int:
        return sum(self.kinds.values())

    def row(self) -> GapRow:
        from storage_migrator.ledger.schema import GapRow

        assert self.first is not None and self.last is not None
        return GapRow(recorded_at=datetime.now(UTC), first_lost_at=self.first, last_lost_at=self.last,
                      rows_lost=self.count, kinds=json.dumps(dict(sorted(self.kinds.items()))),
                      resources=json.dumps(sorted(self.resources)), clusters=json.dumps(sorted(self.clusters)),
                      reason=self.reason[:1000])  # fmt: skip


def _transient(exc: BaseException) -> bool:
    """The database is unreachable or busy (retry), rather than refusing the row (give up on it)."""
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    if isinstance(exc, OperationalError | InterfaceError | PoolTimeout | OSError | ConnectionError):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def _why(exc: BaseException) -> str:
    """The error without SQLAlchemy's echo of the statement and its parameters."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip().splitlines()
    return f"{type(orig or exc).__name__}: {text[0] if text else ''}"[:300]


class LedgerWriter:
    """Appends records to one database from a background thread (see the module docstring)."""

    def __init__(self, url: str, options: WriterOptions | None = None) -> None:
        self.url = url
        self.options = options or WriterOptions()
        self._queue: queue.Queue[LedgerRecord] = queue.Queue(maxsize=self.options.queue_size)
        self._lost = Lost()
        self._lost_lock = threading.Lock()
        self._idle = threading.Condition()
        self._pending = 0
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="storage-migrator-ledger", daemon=True)
        self._thread.start()

    def submit(self, record: LedgerRecord) -> None:
        """Queue one row; never raises and never waits (a full queue loses the row, counted as a gap)."""
        with self._idle:
            self._pending += 1
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self._done(1)
            self._lose([record], f"the ledger's queue is full ({self.options.queue_size} rows waiting)")

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued row is written or given up (True), or `timeout` seconds (False)."""
        limit = self.options.flush_seconds if timeout is None else timeout
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=limit)

    @property
    def failing(self) -> bool:
        """The database did not answer the last write (rows are being retried)."""
        return self._failing

    @property
    def lost_rows(self) -> int:
        """Rows given up and not yet recorded in a gap row."""
        with self._lost_lock:
            return self._lost.count

    def _done(self, n: int) -> None:
        with self._idle:
            self._pending -= n
            if self._pending == 0:
                self._idle.notify_all()

    def _lose(self, records: list[LedgerRecord], reason: str) -> None:
        with self._lost_lock:
            self._lost.add(records, reason)
        logger.error("ledger %s: %d row(s) not written (%s); recorded as a gap when the database answers again",
                     self._safe_url, len(records), reason)  # fmt: skip

    @property
    def _safe_url(self) -> str:
        from storage_migrator.ledger.database import display_url

        return display_url(self.url)

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._write_with_retries(batch)
            except Exception as exc:  # noqa: BLE001 - the thread must live on whatever happens
                self._lose(batch, _why(exc))
            finally:
                self._done(len(batch))

    def _write_with_retries(self, batch: list[LedgerRecord]) -> None:
        deadline = time.monotonic() + self.options.retry_seconds
        delay = FIRST_DELAY_SECONDS
        while True:
            try:
                self._write(batch)
            except Exception as exc:  # noqa: BLE001 - classified below; nothing escapes into a migration
                if not _transient(exc):
                    self._write_one_by_one(batch, exc)
                    return
                if not self._failing:
                    logger.warning("ledger %s unreachable (%s): retrying in the background for up to %.0f s",
                                   self._safe_url, _why(exc), self.options.retry_seconds)  # fmt: skip
                    self._failing = True
                if time.monotonic() + delay > deadline:
                    self._lose(batch, f"database unreachable for {self.options.retry_seconds:.0f} s: {_why(exc)}")
                    return
                time.sleep(delay)
                delay = min(delay * 2, MAX_DELAY_SECONDS)
                continue
            if self._failing:
                logger.warning("ledger %s answers again", self._safe_url)
                self._failing = False
            return

    def _write_one_by_one(self, batch: list[LedgerRecord], exc: BaseException) -> None:
        """A refused batch: keep the rows the database takes, give up only on the refused ones."""
        if len(batch) == 1:
            self._lose(batch, f"refused by the database: {_why(exc)}")
            return
        for record in batch:
            try:
                self._write([record])
            except Exception as one:  # noqa: BLE001 - that row is lost, the others are not
                self._lose([record], f"refused by the database: {_why(one)}")

    def _write(self, batch: list[LedgerRecord]) -> None:
        from sqlalchemy.orm import Session

        from storage_migrator.ledger.database import engine_for, ensure_schema

        engine = engine_for(self.url)
        ensure_schema(engine)
        with self._lost_lock:
            lost, self._lost = self._lost, Lost()
        try:
            with Session(engine) as session, session.begin():
                if lost.count:
                    session.add(lost.row())
                session.add_all([record.to_row() for record in batch if not record.once])
                for record in (r for r in batch if r.once):
                    session.execute(_insert_once(engine.dialect.name, record))
        except BaseException:
            with self._lost_lock:
                self._lost = lost.merged(self._lost)
            raise


def _insert_once(dialect: str, record: LedgerRecord) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING of a row its table keeps once (SQLite and PostgreSQL both
    say it so): a duplicate is what another poll already recorded, not a row the database refuses."""
    from sqlalchemy.dialects import postgresql, sqlite

    table = cast("Table", record.to_row().__table__)
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return insert(table).values(**record.model_dump()).on_conflict_do_nothing()


_writers: dict[str, LedgerWriter] = {}
_writers_lock = threading.Lock()


def writer_for(url: str, options: WriterOptions | None = None) -> LedgerWriter:
    """The process's writer for `url` (made on first use; later options are ignored)."""
    with _writers_lock:
        writer = _writers.get(url)
        if writer is None:
            writer = _writers[url] = LedgerWriter(url, options)
        return writer


@atexit.register
def _flush_all() -> None:
    """A process that ends (a flow run's worker process) writes what it queued, for a bounded time."""
    for writer in list(_writers.values()):
        writer.flush()
