"""The ledger on its own (storage_migrator/ledger/): schema, writer, gaps, queries, on real SQLite files.

Issue 12: "A ledger outage never fails or blocks a migration: the write is
retried in the background, logged, and the gap shows in `history`".
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import inspect

from storage_migrator.cli.history import parse_since
from storage_migrator.kube.in_tree import InTreeMigration
from storage_migrator.ledger import in_tree_history, queries
from storage_migrator.ledger.database import (
    LedgerConfigError,
    display_url,
    engine_for,
    head_revision,
    ledger_engine,
    schema_revision,
)
from storage_migrator.ledger.in_tree import record_in_tree, sighting
from storage_migrator.ledger.recorder import RunRecorder, encryption_key_of, requested_by
from storage_migrator.ledger.records import PollRecord, StateChange
from storage_migrator.ledger.writer import LedgerWriter, WriterOptions
from storage_migrator.migration.chunk_terms import ChunkResult
from storage_migrator.models import (
    GroupVersionResource,
    MigrationProgress,
    ObjectMeta,
    StorageVersionMigration,
    StorageVersionMigrationSpec,
    StorageVersionMigrationStatus,
)

TABLES = {"migration_runs", "run_outcomes", "migration_chunks", "state_changes", "detection_polls", "ledger_gaps",
          "in_tree_migrations"}  # fmt: skip


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


def _run(writer: LedgerWriter, *, resource: str = "secrets", uid: str = "uid-1") -> RunRecorder:
    rec = RunRecorder.begin(writer, migration=f"{resource}-abcde", migration_uid=uid, resource=resource, version="v1",
                            target_hash="hash2", encryption_key=None, requested_by="manual", flow_run_id="fr-1")  # fmt: skip
    rec.started(resumed=False)
    return rec


def test_alembic_upgrade_from_an_empty_database_creates_every_table(tmp_path: Path) -> None:
    """Issue 12: "schema migrations with Alembic, applied automatically on first use"."""
    engine = engine_for(_url(tmp_path / "empty.db"))
    with engine.connect() as conn:
        assert schema_revision(conn) is None
    ledger_engine(_url(tmp_path / "empty.db"))
    with engine.connect() as conn:
        assert schema_revision(conn) == head_revision()
        assert set(inspect(conn).get_table_names()) >= TABLES
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_a_ledger_written_by_a_newer_version_is_refused_with_the_fix(tmp_path: Path) -> None:
    url = _url(tmp_path / "newer.db")
    ledger_engine(url)
    with engine_for(url).begin() as conn:
        conn.exec_driver_sql("UPDATE ledger_schema_version SET version_num = 'r9999'")
    other = f"sqlite:///{tmp_path}/./newer.db"  # another URL string: checked afresh, as in a new process
    with pytest.raises(LedgerConfigError, match=r"r9999.*upgrade storage-migrator"):
        ledger_engine(other)


def test_a_url_that_is_not_a_database_names_the_setting() -> None:
    with pytest.raises(LedgerConfigError, match="STORAGE_MIGRATOR_DATABASE_URL"):
        engine_for("mysql://somewhere/ledger")


def test_no_message_shows_the_database_password() -> None:
    """The ledger's URL is shown in errors and logs (DESIGN 8's rule for bodies holds for
    credentials too): its password never is, even when the URL cannot be parsed."""
    assert display_url("postgresql+psycopg://ledger:hunter2@db:5432/ledger") == (
        "postgresql+psycopg://ledger:***@db:5432/ledger"
    )
    assert "hunter2" not in display_url("postgresql+psycopg://ledger:hunter2@db:notaport/ledger")
    with pytest.raises(LedgerConfigError) as caught:
        engine_for("postgres ql://ledger:hunter2@db/ledger")
    assert "hunter2" not in str(caught.value)


def test_a_run_its_chunks_and_its_outcome_read_back_as_history(tmp_path: Path) -> None:
    url = _url(tmp_path / "l.db")
    writer = LedgerWriter(url)
    rec = _run(writer)
    rec.chunk(ChunkResult(token_in=None, token_out="t1", listed=2, rewritten=2), duration_seconds=0.5,
              progress=MigrationProgress(listed=2, rewritten=2, chunks=1))  # fmt: skip
    rec.chunk(ChunkResult(token_in="t1", token_out=None, listed=1, unchanged=1), duration_seconds=0.25,
              progress=MigrationProgress(listed=3, rewritten=2, unchanged=1, chunks=2))  # fmt: skip
    rec.ended("succeeded", rec.progress, reason="Completed")
    rec.ended("failed", rec.progress)  # the first verdict is the run's
    assert writer.flush(10)
    engine = ledger_engine(url)
    [run] = queries.history(engine, ui_url="http://ui:4200/")
    assert (run.outcome, run.requested_by, run.listed, run.rewritten, run.unchanged, run.chunks) == (
        "succeeded", "manual", 3, 2, 1, 2)  # fmt: skip
    assert run.flow_run_url == "http://ui:4200/runs/flow-run/fr-1"
    assert run.duration_seconds is not None and run.duration_seconds >= 0
    counts = {(c.resource, c.outcome): c.objects for c in queries.object_counts(engine)}
    assert counts[("secrets", "rewritten")] == 2 and counts[("secrets", "unchanged")] == 1
    last = queries.last_full_migration(engine, "secrets")
    assert last is not None and last.target_storage_version_hash == "hash2"
    assert queries.history(engine, resource="configmaps") == []
    assert queries.history(engine, since=datetime.now(UTC) + timedelta(hours=1)) == []


def test_an_outage_longer_than_the_retries_leaves_a_gap_row_when_the_database_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer never raises and never waits; rows it gave up on become one gap row."""
    missing = tmp_path / "not-yet"
    url = _url(missing / "ledger.db")  # SQLite cannot open a file in a directory that does not exist
    writer = LedgerWriter(url, WriterOptions(retry_seconds=0.5))
    with caplog.at_level(logging.WARNING, logger="storage_migrator.ledger"):
        rec = _run(writer)
        rec.ended("succeeded", MigrationProgress(listed=1, rewritten=1))
        assert writer.flush(10)
    assert writer.lost_rows == 2
    assert "unreachable" in caplog.text and "not written" in caplog.text
    missing.mkdir()
    writer.submit(PollRecord(started_at=datetime.now(UTC), finished_at=datetime.now(UTC), duration_seconds=0.1,
                             resources_seen=3, changes=0, requests_made=0))  # fmt: skip
    assert writer.flush(10) and writer.lost_rows == 0
    engine = ledger_engine(url)
    [gap] = queries.gaps(engine)
    assert gap.rows_lost == 2 and gap.kinds == {"outcome": 1, "run": 1} and gap.resources == ["secrets"]
    assert "unable to open database file" in gap.reason
    assert queries.last_poll(engine) is not None


def test_a_full_queue_loses_rows_without_waiting(tmp_path: Path) -> None:
    url = _url(tmp_path / "q.db")
    writer = LedgerWriter(url, WriterOptions(queue_size=1))
    gate = threading.Event()
    # Hold the writer thread on its first row so the queue fills behind it.
    original = writer._write
    writer._write = lambda batch: (gate.wait(10), original(batch))[1]  # type: ignore[method-assign]
    for i in range(5):
        writer.submit(PollRecord(started_at=datetime.now(UTC), finished_at=datetime.now(UTC), duration_seconds=i,
                                 resources_seen=1, changes=0, requests_made=0))  # fmt: skip
    gate.set()
    assert writer.flush(10)
    [gap] = queries.gaps(ledger_engine(url))
    assert gap.rows_lost >= 3 and "queue is full" in gap.reason


def test_a_row_the_database_refuses_does_not_take_the_others_with_it(tmp_path: Path) -> None:
    url = _url(tmp_path / "r.db")
    writer = LedgerWriter(url)
    rec = _run(writer)
    rec.started(resumed=False)
    twin = RunRecorder(writer, rec.start.model_copy())  # same run_id: the primary key refuses it
    twin.announced = False
    twin.started(resumed=False)
    writer.submit(StateChange(recorded_at=datetime.now(UTC), state="secrets", action="created", new_current_hash="h",
                              new_persisted=["Unknown"], reason="first poll"))  # fmt: skip
    assert writer.flush(10)
    engine = ledger_engine(url)
    assert len(queries.history(engine)) == 1
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM state_changes").scalar() == 1
    # A refused row stays a gap until the next write lands.
    writer.submit(PollRecord(started_at=datetime.now(UTC), finished_at=datetime.now(UTC), duration_seconds=0,
                             resources_seen=1, changes=0, requests_made=0))  # fmt: skip
    assert writer.flush(10)
    [gap] = queries.gaps(engine)
    assert gap.kinds == {"run": 1} and "refused" in gap.reason


@pytest.mark.parametrize(
    ("labels", "who"),
    [
        (None, "manual"),
        ({"migration.k8s.io/requested-by": "detection"}, "detection"),
        ({"migration.k8s.io/requested-by": "initialize"}, "initializer"),
        ({"migration.k8s.io/requested-by": "rotate-encryption-key"}, "rotation"),
        ({"migration.k8s.io/requested-by": "openshift-kube-apiserver-operator"}, "openshift-kube-apiserver-operator"),
    ],
)
def test_who_asked_comes_from_the_requested_by_label(labels: dict[str, str] | None, who: str) -> None:
    assert requested_by(labels) == who


def test_the_key_of_a_rotation_request_comes_from_its_annotation() -> None:
    assert encryption_key_of({"migration.k8s.io/encryption-key": "key2"}) == "key2"
    assert encryption_key_of(None) is None


def _svm(name: str, uid: str, started: datetime | None) -> StorageVersionMigration:
    return StorageVersionMigration(
        metadata=ObjectMeta(name=name, uid=uid),
        spec=StorageVersionMigrationSpec(resource=GroupVersionResource(group="apps", version="v1",
                                                                       resource="deployments")),
        status=StorageVersionMigrationStatus(started_at=started),
    )  # fmt: skip


def test_requests_that_ran_without_a_run_row_are_the_ledgers_gap() -> None:
    now = datetime.now(UTC)
    requests = [_svm("ran", "u1", now), _svm("recorded", "u2", now), _svm("pending", "u3", None),
                _svm("old", "u4", now - timedelta(days=30))]  # fmt: skip
    missing = queries.unrecorded_migrations(requests, {"u2"}, since=now - timedelta(days=7))
    assert [(m.migration, m.resource, m.phase) for m in missing] == [("ran", "deployments.apps", "Pending")]


def test_since_takes_a_duration_or_a_date() -> None:
    now = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    assert parse_since("7d", now=now) == now - timedelta(days=7)
    assert parse_since("90m", now=now) == now - timedelta(minutes=90)
    assert parse_since("2026-11-20", now=now) == datetime(2026, 11, 20, tzinfo=UTC)
    assert parse_since("2026-11-20T10:00:00Z", now=now) == datetime(2026, 11, 20, 10, tzinfo=UTC)
    with pytest.raises(Exception, match="duration"):
        parse_since("last tuesday", now=now)


def test_state_change_lists_are_stored_as_json(tmp_path: Path) -> None:
    url = _url(tmp_path / "s.db")
    writer = LedgerWriter(url)
    writer.submit(StateChange(recorded_at=datetime.now(UTC), state="cronjobs.batch", action="updated",
                              old_current_hash="a", new_current_hash="b", old_persisted=["a"],
                              new_persisted=["a", "b"], reason="new storage version"))  # fmt: skip
    assert writer.flush(10)
    with ledger_engine(url).connect() as conn:
        row = conn.exec_driver_sql("SELECT old_persisted, new_persisted FROM state_changes").one()
    assert [json.loads(v) for v in row] == [["a"], ["a", "b"]]


def test_a_run_whose_end_never_reached_the_ledger_is_unknown_once_it_is_over(tmp_path: Path) -> None:
    """Issue 12: "the gap shows in `history`". A run's outcome row is lost with its process
    when the process dies first (killed, or the ledger down until its exit): it is shown as
    `unknown`, not `running`, once a later run of the request exists or the request is over."""
    url = _url(tmp_path / "open.db")
    writer = LedgerWriter(url)
    _run(writer, uid="killed")  # a run killed mid-way; the request's next run finished it
    later = _run(writer, uid="killed")
    later.ended("succeeded", later.progress, reason="Completed")
    _run(writer, resource="configmaps", uid="done-elsewhere")  # its request says Succeeded
    _run(writer, resource="serviceaccounts", uid="live")  # still running
    assert writer.flush(10)
    runs = queries.history(ledger_engine(url))
    phases = {"killed": "Succeeded", "done-elsewhere": "Succeeded", "live": "Running"}
    settled = {(r.migration_uid, r.outcome, r.reason) for r in queries.settle_open_runs(runs, phases)}
    assert settled == {("killed", "unknown", queries.NO_OUTCOME), ("killed", "succeeded", "Completed"),
                       ("done-elsewhere", "unknown", queries.NO_OUTCOME), ("live", "running", "")}  # fmt: skip
    # Without the cluster only a later run tells; a deleted request ends its run too.
    alone = {(r.migration_uid, r.outcome) for r in queries.settle_open_runs(runs, None)}
    assert alone == {("killed", "unknown"), ("killed", "succeeded"), ("done-elsewhere", "running"), ("live", "running")}
    gone = queries.settle_open_runs([r for r in runs if r.migration_uid == "live"], {})
    assert [(r.outcome, "deleted" in r.message) for r in gone] == [("unknown", True)]


def test_a_gap_names_the_clusters_of_the_rows_it_lost(tmp_path: Path) -> None:
    """Issue 20: one writer serves every cluster of its process; a gap shows under the clusters it lost rows of."""
    missing = tmp_path / "not-yet"
    url = _url(missing / "ledger.db")
    writer = LedgerWriter(url, WriterOptions(retry_seconds=0.2))
    rec = RunRecorder.begin(writer, migration="secrets-abcde", migration_uid="uid-a", resource="secrets",
                            version="v1", target_hash=None, encryption_key=None, requested_by="manual",
                            flow_run_id=None, cluster="prod-a")  # fmt: skip
    rec.ended("succeeded", MigrationProgress(listed=1, rewritten=1))
    assert writer.flush(10) and writer.lost_rows == 2
    missing.mkdir()
    writer.submit(PollRecord(cluster="prod-b", started_at=datetime.now(UTC), finished_at=datetime.now(UTC),
                             duration_seconds=0.1, resources_seen=1, changes=0, requests_made=0))  # fmt: skip
    assert writer.flush(10) and writer.lost_rows == 0
    engine = ledger_engine(url)
    [gap] = queries.gaps(engine, cluster="prod-a")
    assert gap.clusters == ["prod-a"] and gap.kinds == {"outcome": 1, "run": 1}
    assert queries.gaps(engine, cluster="prod-b") == []
    assert queries.last_poll(engine, cluster="prod-b") is not None
    assert queries.last_poll(engine, cluster="prod-a") is None
    assert queries.clusters(engine) == ["prod-b"]  # the run's rows were lost: only the poll is in the ledger


def test_every_record_names_a_table_of_the_schema() -> None:
    """Records name their table by class (issue 29: no SQLAlchemy until a row is written)."""
    from storage_migrator.ledger import records, schema

    kinds = [records.RunStarted, records.RunFinished, records.ChunkRecord, records.StateChange, records.PollRecord,
             records.InTreeSeen]  # fmt: skip
    assert {kind.row for kind in kinds} == {t.__name__ for t in schema.Base.__subclasses__()} - {"GapRow"}


def in_tree(
    uid: str, phase: str, *, by: str | None = "kubectl-create", resource: str = "configmaps"
) -> InTreeMigration:
    start = datetime(2026, 11, 29, 2, 7, 4, tzinfo=UTC)
    return InTreeMigration(
        api_version="storagemigration.k8s.io/v1beta1", name=f"svm-{uid}", uid=uid, group="", resource=resource,
        created_at=start, phase=phase, running_since=start + timedelta(seconds=5) if phase != "Pending" else None,
        finished_at=start + timedelta(seconds=80) if phase in ("Succeeded", "Failed") else None,
        resource_version="40835" if phase != "Pending" else None, created_by=by,
        reason="StorageVersionMigrationSucceeded" if phase == "Succeeded" else "",
    )  # fmt: skip


def test_an_in_tree_migration_is_recorded_once_per_phase(tmp_path: Path) -> None:
    """Issue 36: "a ledger row and an event each (once per object and outcome, not every poll)". The
    ledger knows what it has seen (cluster, uid, phase); a row a second poll submits anyway (it read
    the ledger before the first one's row landed) is dropped by the database, not lost as a gap."""
    url = _url(tmp_path / "l.db")
    writer = LedgerWriter(url)
    t = datetime(2026, 11, 29, 2, 8, tzinfo=UTC)
    first = record_in_tree(writer, [in_tree("a", "Pending"), in_tree("b", "Running", by=None)], cluster="prod",
                           now=t, flow_run_id="fr-1")  # fmt: skip
    assert [(m.uid, m.phase) for m in first] == [("a", "Pending"), ("b", "Running")]
    assert writer.flush(10)
    polled = [in_tree("a", "Running"), in_tree("b", "Running", by=None)]
    again = record_in_tree(writer, polled, cluster="prod", now=t + timedelta(minutes=10), flow_run_id="fr-2")
    assert [(m.uid, m.phase) for m in again] == [("a", "Running")], "b's Running is known"
    writer.submit(sighting(in_tree("b", "Running", by=None), cluster="prod", now=t, flow_run_id="fr-3"))
    assert writer.flush(10)
    assert writer.lost_rows == 0
    done = record_in_tree(writer, [in_tree("a", "Succeeded")], cluster="prod", now=t + timedelta(minutes=20),
                          flow_run_id="fr-4")  # fmt: skip
    assert [m.phase for m in done] == ["Succeeded"]
    # Another cluster's object of the same uid is its own.
    assert record_in_tree(writer, [in_tree("a", "Pending")], cluster="other", now=t, flow_run_id=None) != []
    assert writer.flush(10)
    engine = ledger_engine(url)
    assert queries.gaps(engine) == []
    history = in_tree_history.in_tree_history(engine, cluster="prod")
    by_uid = {h.migration_uid: h for h in history}
    assert by_uid["a"].phases_seen == ["Pending", "Running", "Succeeded"] and by_uid["a"].phase == "Succeeded"
    assert by_uid["a"].created_by == "kubectl-create" and by_uid["a"].resource_version == "40835"
    assert by_uid["a"].started_at == datetime(2026, 11, 29, 2, 7, 9, tzinfo=UTC)
    assert by_uid["b"].phases_seen == ["Running"] and by_uid["b"].created_by is None
    assert in_tree_history.in_tree_history(engine, cluster="prod", resource="secrets") == []
    assert {h.cluster for h in in_tree_history.in_tree_history(engine)} == {"prod", "other"}
    assert in_tree_history.in_tree_seen(engine, cluster="prod", uids=["a", "zzz"]) == {
        ("a", "Pending"), ("a", "Running"), ("a", "Succeeded")}  # fmt: skip
