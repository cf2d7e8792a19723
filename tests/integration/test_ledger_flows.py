"""The ledger fed by the real flows, against kubesim over etcd, on SQLite and on PostgreSQL.

Issue 12: "Ledger rows after a migration, a failed migration, a resumed one and
a detection cycle; on SQLite and on PostgreSQL; Alembic upgrade from empty.
Metrics scraped and parsed with prometheus_client's parser; values equal the
ledger's. The database unreachable during a migration: the migration
succeeds; the gap is reported by `history`."
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from kubesim.codec import decode
from kubesim.etcd import prefix_end
from storage_migrator.agreement.apiservers import observe_server_configs
from storage_migrator.cli import main
from storage_migrator.conditions import phase_from_conditions
from storage_migrator.fleet.names import DEFAULT_CLUSTER
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.ledger import in_tree_history, queries
from storage_migrator.ledger.database import head_revision, ledger_engine, schema_revision
from storage_migrator.ledger.records import PollRecord
from storage_migrator.ledger.writer import writer_for
from storage_migrator.migration.chunk_terms import ChunkOptions, add_progress
from storage_migrator.migration.chunks import migrate_chunk
from storage_migrator.migration.requests import MigrationRecord, list_migrations, read_migration
from storage_migrator.models import UNKNOWN, MigrationProgress, storage_state_name
from storage_migrator.settings import Settings

pytestmark = pytest.mark.usefixtures("migration_crds", "prefect_api")
FAST = {"write_rate_per_second": 2000.0, "write_concurrency": 8}
REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION = "migration.k8s.io", "v1alpha1"
CRONJOBS_V1 = "sd5LIXh4Fjs="  # as kube-apiserver computes it (test_detection_lifecycle.py)
#: docs/observability.md: the keys of every object `history -o json` prints.
HISTORY_KEYS = {
    "kind", "run_id", "cluster", "migration", "migration_uid", "resource", "version", "target_storage_version_hash",
    "encryption_key", "requested_by", "flow_run_id", "flow_run_url", "started_at", "finished_at",
    "duration_seconds", "outcome", "reason", "message", "listed", "rewritten", "unchanged", "gone", "conflicted",
    "failed", "chunks", "passes", "encryption_config_hash", "server_check",
}  # fmt: skip


@pytest.fixture(params=["sqlite", "postgresql"])
def any_ledger(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An empty ledger of each kind, which the flows of the test use (STORAGE_MIGRATOR_DATABASE_URL)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    monkeypatch.setenv("STORAGE_MIGRATOR_DATABASE_URL", url)
    return url


@pytest.fixture
def sqlite_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv("STORAGE_MIGRATOR_DATABASE_URL", url)
    return url


@pytest.fixture
def core(kubesim: Any) -> Iterator[Any]:
    api = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    yield k8s.CoreV1Api(api)
    api.close()


def make_configmaps(core: Any, namespace: str, count: int) -> list[str]:
    names = [f"cm-{i:03d}" for i in range(count)]
    for name in names:
        core.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name),
                                                                     data={"k": name}))  # fmt: skip
    return names


def migrate(kubesim: Any, **params: Any) -> Any:
    from flows.migrate_resource import migrate_resource

    return migrate_resource(kubeconfig=kubesim.kubeconfig, return_state=True, **{**FAST, **params})


def flushed(url: str) -> Any:
    """The ledger's engine once the process's writer has written what the flows queued."""
    assert writer_for(url).flush(30), "the ledger writer did not catch up"
    return ledger_engine(url)


def chunks_of(engine: Any, run_id: str) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT sequence, token_in, token_out, listed, rewritten, unchanged, failed "
                                      "FROM migration_chunks WHERE run_id = :r ORDER BY sequence"), {"r": run_id}))  # fmt: skip


def history_json(kubesim: Any, capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["--kubeconfig", kubesim.kubeconfig, "history", *args, "-o", "json"]) == 0
    rows: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    for row in rows:
        assert set(row) == HISTORY_KEYS, set(row) ^ HISTORY_KEYS
    return rows


def test_an_in_tree_migration_is_kept_once_per_phase_in_either_database(any_ledger: str) -> None:
    """Issue 36: a row per in-tree migration and phase; a second poll's row for the same phase
    (submitted before the first one's landed) is dropped by the database (ON CONFLICT DO NOTHING,
    SQLite's and PostgreSQL's), not lost as a gap."""
    from storage_migrator.kube.in_tree import InTreeMigration
    from storage_migrator.ledger.in_tree import record_in_tree, sighting

    writer = writer_for(any_ledger)
    now = datetime.now(UTC)
    seen = InTreeMigration(api_version="storagemigration.k8s.io/v1", name="by-gardener", uid="u-1", group="",
                           resource="secrets", phase="Running", resource_version="41", created_by="gardenlet")  # fmt: skip
    assert record_in_tree(writer, [seen], cluster=DEFAULT_CLUSTER, now=now, flow_run_id=None) == [seen]
    writer.submit(sighting(seen, cluster=DEFAULT_CLUSTER, now=now, flow_run_id=None))  # the race, by hand
    engine = flushed(any_ledger)
    assert record_in_tree(writer, [seen], cluster=DEFAULT_CLUSTER, now=now, flow_run_id=None) == []
    done = seen.model_copy(update={"phase": "Succeeded", "reason": "StorageVersionMigrationSucceeded"})
    assert record_in_tree(writer, [done], cluster=DEFAULT_CLUSTER, now=now, flow_run_id=None) == [done]
    engine = flushed(any_ledger)
    (history,) = in_tree_history.in_tree_history(engine, cluster=DEFAULT_CLUSTER)
    assert (history.phases_seen, history.created_by, history.resource_version) == (
        ["Running", "Succeeded"], "gardenlet", "41")  # fmt: skip
    assert queries.gaps(engine) == [] and writer.lost_rows == 0


def test_a_detection_cycle_and_the_migration_it_requested(
    kubesim: Any, clean_slate: Any, namespace: str, any_ledger: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 000's first poll creates the StorageState (["Unknown"]) and requests a migration;
    when it has completed the state is refined: one row per StorageState change and per
    poll, one run (who asked: detection) with its chunks — in an empty database of each
    kind, brought up to date by Alembic on first use."""
    from flows.detect_storage_changes import detect_storage_changes
    from flows.run_migrations import run_migrations

    monkeypatch.setenv("STORAGE_MIGRATOR_INCLUDE_RESOURCES", "cronjobs.batch")
    monkeypatch.setenv("STORAGE_MIGRATOR_CHUNK_SIZE", "2")
    batch = k8s.BatchV1Api(clean_slate)
    for i in range(3):
        batch.create_namespaced_cron_job(namespace, {
            "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": f"nightly-{i}"},
            "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}},
        })  # fmt: skip
    detect_storage_changes(settle_seconds=0, start_migrations=False, kubeconfig=kubesim.kubeconfig)
    outcome = run_migrations(kubeconfig=kubesim.kubeconfig, **FAST)  # ends with a poll that refines
    assert set(outcome.outcomes.values()) == {"Completed"}, outcome.outcomes

    engine = flushed(any_ledger)
    with engine.connect() as conn:
        assert schema_revision(conn) == head_revision()
        polls = list(conn.execute(text("SELECT resources_seen, changes, requests_made, errors, flow_run_id "
                                       "FROM detection_polls ORDER BY finished_at")))  # fmt: skip
    assert len(polls) == 2
    # The first poll created the state and requested a migration; the last refined the state.
    assert polls[0].resources_seen >= 1 and (polls[0].changes, polls[0].requests_made) == (2, 1)
    assert (polls[1].changes, polls[1].requests_made) == (1, 0)
    assert all(p.errors == 0 and p.flow_run_id for p in polls)

    changes = queries.state_changes(engine, state="cronjobs.batch")
    assert [(c.action, c.old_persisted, c.new_persisted) for c in changes] == [
        ("created", [], [UNKNOWN]),
        ("updated", [UNKNOWN], [CRONJOBS_V1]),  # "sets .status.persistedStorageVersionHashes to [batch/v2alpha1]"
    ]
    assert changes[0].old_current_hash is None and changes[1].new_current_hash == CRONJOBS_V1

    [run] = queries.history(engine, resource="cronjobs.batch")
    request = read_migration(api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig)), run.migration)
    assert run.requested_by == "detection" and run.outcome == "succeeded" and run.flow_run_id
    assert run.migration_uid == request.metadata.uid and run.target_storage_version_hash == CRONJOBS_V1
    progress = request.status.progress
    assert progress is not None and (run.listed, run.rewritten, run.chunks) == (
        progress.listed, progress.rewritten, progress.chunks)  # fmt: skip
    rows = chunks_of(engine, run.run_id)
    assert len(rows) == progress.chunks >= 2 and rows[0].token_in is None and rows[-1].token_out is None
    assert all(later.token_in == earlier.token_out for earlier, later in itertools.pairwise(rows))
    assert sum(r.listed for r in rows) == progress.listed
    last = queries.last_full_migration(engine, "cronjobs.batch")
    assert last is not None and last.run_id == run.run_id


def test_a_failed_run_and_a_resumed_run(
    kubesim: Any, namespace: str, core: Any, any_ledger: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failed run keeps its verdict and the object named; a run resumed from a checkpoint says
    so and its first chunk starts from the stored token (seed 002 "Failure recovery"). Who
    asked and the encryption key come from the request's label and annotation."""
    names = make_configmaps(core, namespace, 12)
    kubesim.admin.set_storage_version("configmaps", "v2")
    kubesim.admin.set_faults(
        [{"verb": "patch", "resource": "configmaps", "name": names[5], "code": 422, "message": "denied by webhook"}]
    )
    state = migrate(kubesim, resource="configmaps", chunk_size=50)
    assert state.is_failed()
    kubesim.admin.clear_faults()

    # A run that died after its first checkpoint: the next run resumes from the token.
    api = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    created = k8s.CustomObjectsApi(api).create_cluster_custom_object(GROUP, VERSION, "storageversionmigrations", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "StorageVersionMigration", "metadata": {
            "generateName": "cm-", "labels": {"migration.k8s.io/requested-by": "rotate-encryption-key"},
            "annotations": {"migration.k8s.io/encryption-key": "key2"}},
        "spec": {"resource": {"version": "v1", "resource": "configmaps"}}})  # fmt: skip
    record = MigrationRecord.open(api, name=created["metadata"]["name"], uid=created["metadata"]["uid"])
    first = migrate_chunk(api, ResourceRef(group="", version="v1", resource="configmaps"), continue_token=None,
                          options=ChunkOptions(limit=5))  # fmt: skip
    assert first.token_out
    # As the flow starts a request that names a key (issue 19): under the configuration every API
    # server runs; a checkpoint taken under none recorded would be migrated again from the beginning.
    configs = observe_server_configs(api, Settings(kubeconfig=kubesim.kubeconfig))
    assert configs.common_hash is not None, configs.rows()
    record.start(
        now=datetime.now(UTC), target_hash=None, message="a run that will die", config_hash=configs.common_hash
    )
    record.save(token=first.token_out, progress=add_progress(MigrationProgress(), first), failures=[],
                now=datetime.now(UTC))  # fmt: skip
    resumed = migrate(kubesim, migration=record.name, chunk_size=50)
    assert resumed.is_completed(), resumed.message

    engine = flushed(any_ledger)
    runs = {r.outcome: r for r in queries.history(engine, resource="configmaps")}
    failed, done = runs["failed"], runs["succeeded"]
    assert failed.reason == "ObjectsFailed" and failed.failed == 1 and names[5] in failed.message
    assert failed.flow_run_id == str(state.state_details.flow_run_id)
    assert done.flow_run_id == str(resumed.state_details.flow_run_id)
    assert (failed.requested_by, failed.encryption_key) == ("manual", None)
    assert (done.requested_by, done.encryption_key) == ("rotation", "key2")  # as rotate-encryption-key labels it
    with engine.connect() as conn:
        flag = conn.execute(text("SELECT resumed_from_token FROM migration_runs WHERE run_id = :r"),
                            {"r": done.run_id}).scalar()  # fmt: skip
    assert flag
    rows = chunks_of(engine, done.run_id)
    assert rows[0].token_in == first.token_out and rows[-1].token_out is None
    progress = read_migration(api, record.name).status.progress
    assert progress is not None
    # The outcome carries the request's counters, the checkpointed chunk included; the chunk rows this run's.
    assert done.listed == progress.listed == first.listed + sum(r.listed for r in rows)

    printed = history_json(kubesim, capsys, "configmaps")
    assert {(r["kind"], r["outcome"], r["migration"]) for r in printed} >= {
        ("run", "failed", failed.migration), ("run", "succeeded", record.name)}  # fmt: skip


def _run_log(flow_run_id: Any) -> list[str]:
    """The messages of a flow run's log, through the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        return [log.message for log in client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))]


def _scrape(port: int, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
                return str(answer.read().decode())
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_scraped_equal_the_ledger_and_the_cluster(
    kubesim: Any, clean_slate: Any, namespace: str, core: Any, sqlite_ledger: str, tmp_path: Path
) -> None:
    """Issue 12 item 3: computed from the ledger and the cluster's objects at scrape time,
    parsed with prometheus_client's parser; `remaining_objects` is set for running migrations."""
    make_configmaps(core, namespace, 7)
    kubesim.admin.set_storage_version("configmaps", "v2")
    assert migrate(kubesim, resource="configmaps", chunk_size=3).is_completed()
    now = datetime.now(UTC)
    writer_for(sqlite_ledger).submit(PollRecord(started_at=now, finished_at=now, duration_seconds=1.25,
                                                resources_seen=4, changes=0, requests_made=0))  # fmt: skip
    custom = k8s.CustomObjectsApi(clean_slate)
    custom.create_cluster_custom_object(GROUP, VERSION, "storageversionmigrations", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "StorageVersionMigration", "metadata": {"name": "running-one"},
        "spec": {"resource": {"group": "apps", "version": "v1", "resource": "deployments"}}})  # fmt: skip
    custom.patch_cluster_custom_object_status(GROUP, VERSION, "storageversionmigrations", "running-one", {"status": {
        "conditions": [{"type": "Running", "status": "True", "lastUpdateTime": "2026-11-25T00:00:00Z"}],
        "progress": {"listed": 10, "remainingItemCount": 40}}})  # fmt: skip
    engine = flushed(sqlite_ledger)

    port = _free_port()
    env = {**os.environ, "STORAGE_MIGRATOR_DATABASE_URL": sqlite_ledger}
    log = tmp_path / "metrics.log"
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "storage_migrator.cli", "--kubeconfig", kubesim.kubeconfig,
                                 "metrics", "--port", str(port), "--address", "127.0.0.1"], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
        try:
            body = _scrape(port, proc)
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0, log.read_text()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(body) for s in family.samples}  # fmt: skip

    here = ("cluster", DEFAULT_CLUSTER)  # issue 20: every series says its cluster
    assert samples[("storage_migrator_up", (here, ("source", "ledger")))] == 1
    assert samples[("storage_migrator_up", (here, ("source", "cluster")))] == 1
    for row in queries.object_counts(engine):
        key = ("storage_migrator_objects_total", (here, ("outcome", row.outcome), ("resource", row.resource)))
        assert samples[key] == row.objects
    assert (
        samples[("storage_migrator_objects_total", (here, ("outcome", "rewritten"), ("resource", "configmaps")))] >= 7
    )
    durations = queries.finished_durations(engine)
    assert samples[("storage_migrator_migration_duration_seconds_count", (here,))] == len(durations) == 1
    assert samples[("storage_migrator_migration_duration_seconds_sum", (here,))] == pytest.approx(sum(durations))
    assert samples[("storage_migrator_last_poll_timestamp_seconds", (here,))] == pytest.approx(now.timestamp())
    assert samples[("storage_migrator_poll_duration_seconds", (here,))] == 1.25
    phases: dict[tuple[str, str], int] = {}
    for m in list_migrations(api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))):
        key = (
            storage_state_name(m.spec.resource.group, m.spec.resource.resource),
            phase_from_conditions(m.status.conditions),
        )
        phases[key] = phases.get(key, 0) + 1
    for (resource, phase), count in phases.items():
        assert samples[("storage_migrator_migrations", (here, ("phase", phase), ("resource", resource)))] == count
    assert samples[("storage_migrator_migrations", (here, ("phase", "Running"), ("resource", "deployments.apps")))] == 1
    assert samples[("storage_migrator_remaining_objects", (here, ("resource", "deployments.apps")))] == 40


def _stored_versions(kubesim: Any, namespace: str) -> set[str]:
    raw = f"/registry/configmaps/{namespace}/".encode()
    return {decode(kv.value, read_keys=["key1", "key2"]).api_version
            for kv in kubesim.etcd.range(raw, prefix_end(raw)).kvs}  # fmt: skip


def test_the_database_unreachable_during_a_migration(
    kubesim: Any, namespace: str, core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], wait_for: Any,
) -> None:  # fmt: skip
    """Issue 12: "A ledger outage never fails or blocks a migration: the write is retried in
    the background, logged, and the gap shows in `history`; the Kubernetes objects stay the
    source of truth." The database is a SQLite file in a directory that does not exist yet."""
    down = tmp_path / "down"
    url = f"sqlite:///{down / 'ledger.db'}"
    monkeypatch.setenv("STORAGE_MIGRATOR_DATABASE_URL", url)
    monkeypatch.setenv("STORAGE_MIGRATOR_LEDGER_RETRY_SECONDS", "1")
    make_configmaps(core, namespace, 6)
    kubesim.admin.set_storage_version("configmaps", "v2")
    state = migrate(kubesim, resource="configmaps")
    assert state.is_completed(), state.message
    assert _stored_versions(kubesim, namespace) == {"v2"}  # judged by etcd
    name = state.result().migration

    # Every row of the run was retried in the background, then given up (run, chunk, outcome),
    # and the writer's warning is in the run's log, where an operator reads it (flows/run_logs.py).
    assert writer_for(url).flush(30) and writer_for(url).lost_rows >= 3
    wait_for(lambda: [m for m in _run_log(state.state_details.flow_run_id) if "unreachable" in m and "ledger" in m],
             what="the ledger's warning in the flow run's log", timeout=60)  # fmt: skip
    down.mkdir()  # the database is back: history finds the request the ledger missed
    rows = history_json(kubesim, capsys, "configmaps")
    [missed] = [r for r in rows if r["migration"] == name]
    assert (missed["kind"], missed["outcome"], missed["reason"], missed["run_id"]) == (
        "unrecorded", "succeeded", "NotInLedger", None)  # fmt: skip
    assert missed["listed"] == state.result().progress.listed

    # The next row the writer gets through carries the gap row with it.
    now = datetime.now(UTC)
    writer_for(url).submit(PollRecord(started_at=now, finished_at=now, duration_seconds=0.1, resources_seen=1,
                                      changes=0, requests_made=0))  # fmt: skip
    assert writer_for(url).flush(30) and writer_for(url).lost_rows == 0
    rows = history_json(kubesim, capsys, "configmaps")
    [gap] = [r for r in rows if r["kind"] == "gap"]
    assert gap["resource"] == "configmaps" and "run" in gap["message"] and "outcome" in gap["message"]
    assert "unable to open database file" in gap["message"]
