"""A single-cluster ledger upgrades to the fleet's schema and keeps its history (issue 20, revision r0003).

A ledger made by Alembic at r0002 and filled the way r0002's code wrote it is
opened by this code: the schema is brought to head on first use, every row is
still there, and every row is the environment's cluster (`default`), so
`history` without `--cluster` shows what it showed before. On SQLite and on
PostgreSQL, as the ledger ships on both.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import MetaData, inspect, select

from storage_migrator.fleet.names import DEFAULT_CLUSTER
from storage_migrator.ledger import queries
from storage_migrator.ledger.database import _alembic_config, engine_for, head_revision, ledger_engine, schema_revision

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
PER_CLUSTER = ("migration_runs", "run_outcomes", "migration_chunks", "state_changes", "detection_polls")
COUNTERS = {"listed": 3, "rewritten": 2, "unchanged": 1, "gone": 0, "conflicted": 0, "failed": 0}


@pytest.fixture(params=["sqlite", "postgresql"])
def r0002_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A ledger at revision r0002 holding one run (start, chunk, outcome), a state change, a poll and a gap."""
    url = f"sqlite:///{tmp_path / 'r0002.db'}" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    engine = engine_for(url)
    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "r0002")
    with engine.begin() as conn:
        assert schema_revision(conn) == "r0002"
        tables = MetaData()
        tables.reflect(conn)  # the tables as r0002 made them: no cluster anywhere
        assert all("cluster" not in tables.tables[name].c for name in PER_CLUSTER)
        conn.execute(tables.tables["migration_runs"].insert(), [{
            "run_id": "run-1", "migration": "secrets-abcde", "migration_uid": "uid-1", "resource": "secrets",
            "version": "v1", "target_storage_version_hash": "h2", "encryption_key": "key2", "requested_by": "rotation",
            "flow_run_id": "fr-1", "started_at": T0, "resumed_from_token": False}])  # fmt: skip
        conn.execute(tables.tables["migration_chunks"].insert(), [{
            "run_id": "run-1", "resource": "secrets", "sequence": 1, "token_in": None, "token_out": None,
            "retries": 0, "relisted": 0, "duration_seconds": 0.5, "recorded_at": T0 + timedelta(seconds=5),
            **COUNTERS}])  # fmt: skip
        conn.execute(tables.tables["run_outcomes"].insert(), [{
            "run_id": "run-1", "migration": "secrets-abcde", "migration_uid": "uid-1", "resource": "secrets",
            "finished_at": T0 + timedelta(seconds=10), "outcome": "succeeded", "reason": "Completed", "message": "",
            "chunks": 1, "passes": 1, "encryption_config_hash": "sha256:abc", "server_check": "agreed",
            **COUNTERS}])  # fmt: skip
        conn.execute(tables.tables["state_changes"].insert(), [{
            "recorded_at": T0, "state": "secrets", "action": "updated", "old_current_hash": "h1",
            "new_current_hash": "h2", "old_persisted": '["h1"]', "new_persisted": '["h1", "h2"]', "reason": "changed",
            "flow_run_id": "fr-0"}])  # fmt: skip
        conn.execute(tables.tables["detection_polls"].insert(), [{
            "started_at": T0, "finished_at": T0 + timedelta(seconds=2), "duration_seconds": 2.0, "resources_seen": 4,
            "changes": 1, "requests_made": 1, "errors": 0, "flow_run_id": "fr-0"}])  # fmt: skip
        conn.execute(tables.tables["ledger_gaps"].insert(), [{
            "recorded_at": T0, "first_lost_at": T0, "last_lost_at": T0, "rows_lost": 2, "kinds": '{"chunk": 2}',
            "resources": '["configmaps"]', "reason": "database unreachable"}])  # fmt: skip
    return url


def test_a_single_cluster_ledger_upgrades_and_every_row_is_the_default_cluster(r0002_ledger: str) -> None:
    engine = ledger_engine(r0002_ledger)  # what any reader or writer does first: upgrade to head

    with engine.connect() as conn:
        # r0004: in-tree migrations seen (issue 36, item 4); r0005: the engine of a run (issue 36, item 2)
        assert schema_revision(conn) == head_revision() == "r0005"
        schema = inspect(conn)
        tables = MetaData()
        tables.reflect(conn)
        for table in PER_CLUSTER:
            column = next(c for c in schema.get_columns(table) if c["name"] == "cluster")
            assert column["nullable"] is False, table
            rows = conn.execute(select(tables.tables[table].c.cluster)).scalars().all()
            assert rows == [DEFAULT_CLUSTER], table
            assert any(ix["column_names"][0] == "cluster" for ix in schema.get_indexes(table)), table

    [run] = queries.history(engine, cluster=DEFAULT_CLUSTER)
    assert (run.run_id, run.cluster, run.outcome, run.listed, run.encryption_key, run.server_check) == (
        "run-1", DEFAULT_CLUSTER, "succeeded", 3, "key2", "agreed")  # fmt: skip
    assert queries.history(engine, cluster="other") == []
    assert queries.clusters(engine) == [DEFAULT_CLUSTER]
    [counts] = [c for c in queries.object_counts(engine, cluster=DEFAULT_CLUSTER) if c.outcome == "rewritten"]
    assert counts.objects == 2
    assert queries.finished_durations(engine, cluster=DEFAULT_CLUSTER) == [10.0]
    assert queries.last_poll(engine, cluster=DEFAULT_CLUSTER) is not None
    [change] = queries.state_changes(engine, cluster=DEFAULT_CLUSTER)
    assert change.new_persisted == ["h1", "h2"]
    [gap] = queries.gaps(engine, cluster=DEFAULT_CLUSTER)
    assert gap.clusters == [DEFAULT_CLUSTER] and gap.resources == ["configmaps"]
    assert queries.gaps(engine, cluster="other") == []
