"""The `migrate-resource` flow against kubesim over etcd, on a Prefect test server.

Judged by what etcd holds (DESIGN 8), not by what the flow reports.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from ledger_fixtures import sqlite_ledger_bytes

from kubesim.codec import decode
from kubesim.etcd import prefix_end
from storage_migrator.conditions import is_condition_true
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.migration.requests import list_migrations, read_migration
from storage_migrator.migration.write_budget import is_live
from storage_migrator.migration.writer_leases import lease_name, list_writer_leases
from storage_migrator.settings import Settings

pytestmark = pytest.mark.usefixtures("migration_crds", "prefect_api")
Kubesim = Any  # the conftest fixture type

REPO = Path(__file__).resolve().parents[2]
FAST = {"write_rate_per_second": 2000.0, "write_concurrency": 8}


@pytest.fixture
def core(kubesim: Kubesim) -> Any:
    api = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    yield k8s.CoreV1Api(api)
    api.close()


def make_configmaps(core: Any, namespace: str, count: int, *, prefix: str = "cm") -> list[str]:
    names = [f"{prefix}-{i:04d}" for i in range(count)]
    for name in names:
        core.create_namespaced_config_map(
            namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name), data={"k": name, "pad": "x" * 200})
        )
    return names


def stored(kubesim: Kubesim, prefix: str) -> dict[str, tuple[str, str | None, int, dict[str, Any]]]:
    """key -> (stored apiVersion, encryption key, mod_revision, object) for every value under prefix."""
    out = {}
    raw = prefix.encode()
    for kv in kubesim.etcd.range(raw, prefix_end(raw)).kvs:
        value = decode(kv.value, read_keys=["key1", "key2", "key3"])
        out[kv.key.decode()] = (value.api_version, value.key_name, kv.mod_revision, value.obj)
    return out


def content(obj: dict[str, Any]) -> dict[str, Any]:
    """What must never change: everything but apiVersion, resourceVersion and managedFields."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("resourceVersion", "managedFields")}
    return {**{k: v for k, v in obj.items() if k not in ("apiVersion", "metadata")}, "metadata": meta}


def run_flow(kubesim: Kubesim, **params: Any) -> Any:
    from flows.migrate_resource import migrate_resource

    return migrate_resource(kubeconfig=kubesim.kubeconfig, return_state=True, **{**FAST, **params})


def test_every_object_is_reencoded_and_a_second_run_rewrites_nothing(
    kubesim: Kubesim, namespace: str, core: Any
) -> None:
    """DESIGN 4.5: a no-op write of every object re-encodes it in the current storage
    version; "a second migration of a resource that has just been migrated must
    rewrite nothing (every answer 'unchanged')"."""
    make_configmaps(core, namespace, 45)
    prefix = f"/registry/configmaps/{namespace}/"
    before = stored(kubesim, prefix)
    assert {v[0] for v in before.values()} == {"v1"}
    kubesim.admin.set_storage_version("configmaps", "v2")

    state = run_flow(kubesim, resource="configmaps", chunk_size=10)
    assert state.is_completed(), state.message
    summary = state.result()
    after = stored(kubesim, prefix)
    assert set(after) == set(before)
    for key, (api_version, _, _, obj) in after.items():
        assert api_version == "v2", key
        assert content(obj) == content(before[key][3]), key
    assert summary.progress.failed == 0
    assert summary.progress.rewritten >= 45
    migration = read_migration(api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig)), summary.migration)
    assert is_condition_true(migration.status.conditions, "Succeeded")
    assert not is_condition_true(migration.status.conditions, "Running")
    assert migration.status.phase == "Succeeded"
    assert migration.status.progress is not None and migration.status.progress.chunks >= 5

    again = run_flow(kubesim, resource="configmaps", chunk_size=10)
    assert again.is_completed(), again.message
    second = again.result()
    assert second.progress.rewritten == 0
    assert second.progress.unchanged == second.progress.listed >= 45
    assert {k: v[2] for k, v in stored(kubesim, prefix).items()} == {k: v[2] for k, v in after.items()}


def test_a_chunk_leaves_nothing_of_prefects_task_bookkeeping_behind(
    kubesim: Kubesim, namespace: str, core: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 13: the flow's memory is flat from 10^4 to 10^6 objects. Prefect keeps, per task
    run, a link from its result to its state and a cancel event in its thread pool until the
    flow run ends; the flow drops them after each chunk, so chunk 8 holds what chunk 1 held."""
    from prefect.context import FlowRunContext

    import flows.migrate_resource as module

    held: list[tuple[int, int]] = []
    forget = module._forget_task_results

    def forget_and_count(*finished: Any) -> None:
        forget(*finished)
        context = FlowRunContext.get()
        assert context is not None
        held.append((len(context.run_results), len(context.task_runner._cancel_events)))  # type: ignore[attr-defined]

    monkeypatch.setattr(module, "_forget_task_results", forget_and_count)
    make_configmaps(core, namespace, 40)
    kubesim.admin.set_storage_version("configmaps", "v2")
    assert run_flow(kubesim, resource="configmaps", chunk_size=5).is_completed()
    assert len(held) >= 8
    assert held == [held[0]] * len(held), held


def test_unknown_resource_names_it_and_creates_nothing(kubesim: Kubesim) -> None:
    """DESIGN 8: bad input gives a clear error that names the object, and changes nothing."""
    api = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    before = {m.metadata.name for m in list_migrations(api)}
    state = run_flow(kubesim, resource="nosuchthings")
    assert state.is_failed()
    assert "nosuchthings" in state.message and "Served:" in state.message and "secrets" in state.message
    assert {m.metadata.name for m in list_migrations(api)} == before


def test_a_succeeded_request_is_the_record_and_does_not_run_again(kubesim: Kubesim, namespace: str, core: Any) -> None:
    """seed 003: "a succeeded object is the record that the migration happened"."""
    make_configmaps(core, namespace, 3)
    first = run_flow(kubesim, resource="configmaps").result()
    writes = kubesim.admin.counters()["requests"].get("patch", 0)
    again = run_flow(kubesim, migration=first.migration).result()
    assert again.phase == "Succeeded"
    assert again.progress.listed == 0
    assert kubesim.admin.counters()["requests"].get("patch", 0) == writes


def test_an_object_that_is_always_rejected_fails_the_migration_by_name(
    kubesim: Kubesim, namespace: str, core: Any
) -> None:
    """DESIGN 4.5: 400/403/422 "failed: recorded with the object's name and the API's
    reason; the migration goes on and ends Failed with a summary"."""
    names = make_configmaps(core, namespace, 12)
    kubesim.admin.set_storage_version("configmaps", "v2")
    kubesim.admin.set_faults(
        [{"verb": "patch", "resource": "configmaps", "name": names[5], "code": 422, "message": "denied by webhook"}]
    )
    state = run_flow(kubesim, resource="configmaps", chunk_size=5)
    assert state.is_failed()
    assert names[5] in state.message
    api = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    migration = next(m for m in list_migrations(api) if m.metadata.name and m.metadata.name in state.message)
    assert is_condition_true(migration.status.conditions, "Failed")
    failed = next(c for c in migration.status.conditions if c.type == "Failed")
    assert failed.reason == "ObjectsFailed"
    assert f"{namespace}/{names[5]} (422 Invalid)" in (failed.message or "")
    assert [f.name for f in migration.status.failures] == [names[5]]
    for key, (api_version, *_rest) in stored(kubesim, f"/registry/configmaps/{namespace}/").items():
        assert api_version == ("v1" if key.endswith(names[5]) else "v2"), key


MIGRATIONS_PREFIX = "/registry/migration.k8s.io/storageversionmigrations/"


def checkpoints(kubesim: Kubesim, *, since: int, name: str = "", timeout: float) -> Iterator[tuple[str, str]]:
    """(request, continue token) for each checkpoint that stored a new token in a request
    (named `name`, or any) after etcd revision `since`, as etcd sees the write: an event
    where the API was polled (issue 29). Ends after `timeout` seconds."""
    prefix = f"{MIGRATIONS_PREFIX}{name}".encode()
    events, cancel = kubesim.etcd.watch(prefix, start_revision=since + 1)
    deadline = time.monotonic() + timeout
    try:
        for batch in events:
            if isinstance(batch, Exception):
                raise batch
            for event in batch:
                key = event.kv.key.decode()
                if event.type != "PUT" or (name and key != prefix.decode()):
                    continue
                token = decode(event.kv.value, read_keys=[]).obj["spec"].get("continueToken")
                before = decode(event.prev.value, read_keys=[]).obj["spec"].get("continueToken") if event.prev else None
                if token and token != before:
                    yield key.removeprefix(MIGRATIONS_PREFIX), token
            if time.monotonic() > deadline:
                return
    finally:
        cancel()


def test_deleting_the_request_cancels_the_run_within_one_chunk(kubesim: Kubesim, namespace: str, core: Any) -> None:
    """DESIGN 4.5: "Deleting the StorageVersionMigration object really cancels its run"."""
    make_configmaps(core, namespace, 60)
    kubesim.admin.set_storage_version("configmaps", "v2")
    api = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    known = {m.metadata.name for m in list_migrations(api)}
    since = kubesim.etcd.revision()
    result: dict[str, Any] = {}
    runner = threading.Thread(
        target=lambda: result.setdefault(
            "state", run_flow(kubesim, resource="configmaps", chunk_size=5, write_rate_per_second=25.0)
        )
    )
    runner.start()
    try:
        # The first checkpoint waits on the shared budget, which reads the Prefect server:
        # a loaded CI machine has stalled that for a minute, so the wait is generous.
        with contextlib.closing(checkpoints(kubesim, since=since, timeout=150)) as stored_tokens:
            name = next((n for n, _ in stored_tokens if n not in known), None)
        assert name, "no new migration stored a continue token within 150 s"
        k8s.CustomObjectsApi(api).delete_cluster_custom_object(
            "migration.k8s.io", "v1alpha1", "storageversionmigrations", name
        )
        patches_at_delete = kubesim.admin.counters()["requestsByResource"].get("patch configmaps", 0)
        runner.join(timeout=120)
    finally:
        _stop_runs(api, known, runner)  # a failure here must not leave a run writing into the next test
    state = result["state"]
    assert state.is_cancelled(), state
    patches_after = kubesim.admin.counters()["requestsByResource"].get("patch configmaps", 0)
    assert patches_after - patches_at_delete <= 5  # at most the chunk in flight
    still_v1 = [k for k, v in stored(kubesim, f"/registry/configmaps/{namespace}/").items() if v[0] == "v1"]
    assert still_v1, "the run went on to the end instead of stopping"


def _stop_runs(api: Any, known: set[str], runner: threading.Thread) -> None:
    """Delete the test's migrations (which cancels their runs) and wait for the run's thread."""
    for migration in list_migrations(api):
        if migration.metadata.name not in known:
            try:
                k8s.CustomObjectsApi(api).delete_cluster_custom_object(
                    "migration.k8s.io", "v1alpha1", "storageversionmigrations", migration.metadata.name
                )
            except k8s.ApiException as exc:
                if exc.status != 404:
                    raise
    runner.join(timeout=180)


#: A process that imports the flow once, then runs each `migrate_resource(**params)` line of its
#: stdin in a fork of itself: a flow-run process as `python -c` starts one, less the imports (issue
#: 29: about 4 s of CPU a run; those made at a run's first call too: Prefect's engines and its
#: encoder of parameters, the ledger's schema check). It prints the fork's pid, then its exit code
#: once it has ended; the fork writes to the log file, and exits as `python -c` would (an
#: exception: 1, atexit run). The forker itself starts no thread, so that a fork holds no lock
#: another thread held.
FORKER = """
import json, os, sys
import alembic.command, alembic.config, alembic.runtime.migration, alembic.script, sqlite3
import fastapi.encoders, prefect.flow_engine, prefect.task_engine
from flows.migrate_resource import migrate_resource

while line := sys.stdin.readline():
    pid = os.fork()
    if pid == 0:
        log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        migrate_resource(**json.loads(line))
        sys.exit(0)
    print(pid, flush=True)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


class FlowForker:
    """Flow-run processes forked from one that imported `flows.migrate_resource` (FORKER)."""

    def __init__(self, prefect_api: str, log: Path) -> None:
        env = {**os.environ, "PREFECT_API_URL": prefect_api, "DO_NOT_TRACK": "1",
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}  # fmt: skip
        self.log = log
        self.proc = subprocess.Popen([sys.executable, "-c", FORKER, str(log)], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        self._buffer = b""
        self.running: int | None = None

    def start(self, **params: Any) -> int:
        """Start a run in a new fork; its pid."""
        assert self.proc.stdin is not None and self.running is None
        self.proc.stdin.write(json.dumps(params).encode() + b"\n")
        self.proc.stdin.flush()
        self.running = int(self._line(timeout=120))  # the first one waits for the import
        return self.running

    def ended(self, *, timeout: float) -> int:
        """The exit code of the run started last, once it has ended."""
        code = int(self._line(timeout=timeout))
        self.running = None
        return code

    def kill(self) -> None:
        """SIGKILL the run started last, as a crash does, and reap it."""
        assert self.running is not None
        os.kill(self.running, signal.SIGKILL)
        self.ended(timeout=30)

    def _line(self, *, timeout: float) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, left))
            chunk = os.read(self.proc.stdout.fileno(), 4096) if ready else b""
            if not chunk:
                log = self.log.read_text()[-3000:] if self.log.exists() else ""
                raise AssertionError(f"the flow forker {'exited' if ready else 'did not answer'}: {log}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def close(self) -> None:
        if self.running is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.running, signal.SIGKILL)
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # the forker's loop ends
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def wait_until_free(api: Any, request: str) -> None:
    """Until the request's writer Lease (a killed run's) has expired: no run takes it before."""
    deadline = time.monotonic() + 60
    while any(lease.name == lease_name(request) and is_live(lease, now=datetime.now(UTC))
              for lease in list_writer_leases(api, namespace="storage-migrator")):  # fmt: skip
        assert time.monotonic() < deadline, "the killed run's writer Lease never expired"
        time.sleep(0.5)


def test_killed_runs_resume_from_the_checkpoint(
    kubesim: Kubesim, namespace: str, core: Any, prefect_api: str, tmp_path: Path
) -> None:
    """seed 002 "Failure recovery": the continue token stored in the migration lets a
    new run "resume from where it left off"; DESIGN 4.5: a crash re-does at most one
    chunk and never skips an object. Issue 37: the next run takes the request once the
    killed run's writer Lease has expired (up to 15 s), and not before (test_write_budget.py)."""
    count, chunk, kills = 120, 10, 2
    make_configmaps(core, namespace, count)
    kubesim.admin.set_storage_version("configmaps", "v2")
    api = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    request = k8s.CustomObjectsApi(api).create_cluster_custom_object(
        "migration.k8s.io", "v1alpha1", "storageversionmigrations",
        {"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
         "metadata": {"generateName": "crash-"}, "spec": {"resource": {"version": "v1", "resource": "configmaps"}}},
    )  # fmt: skip
    name = request["metadata"]["name"]
    total_objects = sum(len(core.list_namespaced_config_map(ns.metadata.name).items)
                        for ns in core.list_namespace().items)  # fmt: skip
    patches_before = kubesim.admin.counters()["requestsByResource"].get("patch configmaps", 0)
    params = {"migration": name, "kubeconfig": kubesim.kubeconfig, "chunk_size": chunk,
              "write_rate_per_second": 60.0, "write_concurrency": 4}  # fmt: skip
    tokens_seen: list[str] = []
    forker = FlowForker(prefect_api, tmp_path / "flow-runs.log")
    try:
        for _ in range(kills):
            since = kubesim.etcd.revision()
            forker.start(**params)
            with contextlib.closing(checkpoints(kubesim, since=since, name=name, timeout=90)) as stored_tokens:
                for _, token in stored_tokens:  # kill after two more checkpoints
                    if token not in tokens_seen:
                        tokens_seen.append(token)
                        if len(tokens_seen) % 2 == 0:
                            break
            forker.kill()
            wait_until_free(api, name)
        forker.start(**params)
        assert forker.ended(timeout=180) == 0, forker.log.read_text()[-3000:]
    finally:
        forker.close()
    migration = read_migration(api, name)
    assert is_condition_true(migration.status.conditions, "Succeeded"), migration.status.conditions
    for key, (api_version, *_rest) in stored(kubesim, f"/registry/configmaps/{namespace}/").items():
        assert api_version == "v2", key
    patches = kubesim.admin.counters()["requestsByResource"].get("patch configmaps", 0) - patches_before
    assert patches <= total_objects + kills * chunk, (patches, total_objects)


@pytest.mark.parametrize("ledger", ["sqlite", "postgresql"])
def test_a_secret_body_never_reaches_prefect(
    kubesim: Kubesim, namespace: str, core: Any, tmp_path: Path, ledger: str, request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch, prefect_database: Any,
) -> None:  # fmt: skip
    """DESIGN 8: no object body is ever persisted by Prefect, logged, or put in a cache
    key — searched for with result persistence turned on; and "A test migrates Secrets
    holding a sentinel value and searches the Prefect database, result storage, logs and
    the ledger for it": the ledger's SQLite files, or the dump of its PostgreSQL database."""
    from storage_migrator.ledger.writer import writer_for

    if ledger == "sqlite":
        ledger_url = f"sqlite:///{tmp_path / 'ledger' / 'ledger.db'}"
        (tmp_path / "ledger").mkdir()
    else:
        server = request.getfixturevalue("postgres_server")
        database = server.create_database()
        ledger_url = server.url(database)
    monkeypatch.setenv("STORAGE_MIGRATOR_DATABASE_URL", ledger_url)
    from prefect.settings import (
        PREFECT_LOCAL_STORAGE_PATH,
        PREFECT_RESULTS_PERSIST_BY_DEFAULT,
        temporary_settings,
    )

    sentinel = "sentinel-7c1e2b9a-never-persist"
    core.create_namespaced_secret(
        namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="holder"), string_data={"password": sentinel})
    )
    kubesim.admin.set_encryption(["key2", "key1"])
    results = tmp_path / "results"
    with temporary_settings({PREFECT_RESULTS_PERSIST_BY_DEFAULT: True, PREFECT_LOCAL_STORAGE_PATH: results}):
        state = run_flow(kubesim, resource="secrets")
    assert state.is_completed(), state.message
    value = stored(kubesim, f"/registry/secrets/{namespace}/holder")
    assert [v[1] for v in value.values()] == ["key2"]
    needles = [sentinel.encode(), base64.b64encode(sentinel.encode())]
    # The Prefect server's database holds the run (so the search searched something) and not the value.
    prefect_rows = prefect_database.dump()
    assert str(state.state_details.flow_run_id).encode() in prefect_rows
    for needle in needles:
        assert needle not in prefect_rows, f"{needle!r} found in the Prefect server's database"
    searched = [p for p in results.rglob("*") if p.is_file()] if results.exists() else []
    if ledger == "sqlite":
        recorded = sqlite_ledger_bytes(ledger_url)
    else:
        assert writer_for(ledger_url).flush(30)
        recorded = server.dump(database)
    # The ledger holds the run (so the search below searched something) and not the value.
    assert state.result().migration.encode() in recorded
    for needle in needles:
        assert needle not in recorded, f"{needle!r} found in the {ledger} ledger"
    for path in searched:
        data = path.read_bytes()
        for needle in needles:
            assert needle not in data, f"{needle!r} found in {path}"
