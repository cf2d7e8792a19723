"""One writer per request (issue 37, "A request has one writer"), through `migrate-resource` runs.

"A run takes over a request only when its holder is gone: that holder's Lease has expired ...
Otherwise the new run says who holds the request, and until when, and ends without writing. A
manual run of a request that is Running is refused that way"; "A taken-over run writes no
object after it learns of the takeover." Judged by etcd (what was written, and when) and by
kubesim's record of the PATCHes it received, on the session's cluster and Prefect server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import Kubesim, wait_until
from kubernetes import client as k8s

from flows.migrate_resource import migrate_resource
from kubesim.etcd import prefix_end
from storage_migrator.conditions import is_condition_true
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.migration.request_lease import RequestLease
from storage_migrator.migration.requests import MigrationRecord, create_migration, read_migration
from storage_migrator.migration.write_budget import is_live
from storage_migrator.migration.writer_leases import lease_name, list_writer_leases
from storage_migrator.models import CONDITION_SUCCEEDED, new_storage_version_migration, owner_of
from storage_migrator.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("migration_crds", "prefect_api")]

REPO = Path(__file__).resolve().parents[2]
NS = "storage-migrator"


def configmaps(kubesim: Kubesim, namespace: str, count: int) -> None:
    """`count` ConfigMaps stored in v1, the storage version then v2: every one has a write to make."""
    api = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    core = k8s.CoreV1Api(api)
    kubesim.admin.set_storage_version("configmaps", "v1")
    for i in range(count):
        core.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"cm-{i:04d}"),
                                                                     data={"k": "x" * 100}))  # fmt: skip
    kubesim.admin.set_storage_version("configmaps", "v2")
    api.close()


def revisions(kubesim: Kubesim, prefix: str) -> dict[str, int]:
    raw = prefix.encode()
    return {kv.key.decode(): kv.mod_revision for kv in kubesim.etcd.range(raw, prefix_end(raw)).kvs}


def new_request(api: Any) -> str:
    request = create_migration(api, new_storage_version_migration(group="", version="v1", resource="configmaps"))
    return request.metadata.name or ""


def test_a_manual_run_of_a_running_request_is_refused_with_the_holder_named_and_nothing_written(
    kubesim: Kubesim, namespace: str
) -> None:
    """`prefect deployment run 'migrate-resource/migrate-resource' -p migration=X` of a request that
    a live run holds (here: its Lease and its Running condition, as that run left them)."""
    configmaps(kubesim, namespace, 10)
    api = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    name = new_request(api)
    settings = Settings(kubeconfig=kubesim.kubeconfig)
    holder = RequestLease.take(lambda: api_client_from_settings(settings), namespace=NS, request=name,
                               holder="0b1c2d3e-the-live-run/1a2b3c4d")  # fmt: skip
    try:
        record = MigrationRecord(api, read_migration(api, name), owner="0b1c2d3e-the-live-run")
        record.claim()
        record.start(now=datetime.now(UTC), target_hash=None, message="migrating by the live run")
        before = {**revisions(kubesim, f"/registry/configmaps/{namespace}/"),
                  **revisions(kubesim, "/registry/migration.k8s.io/storageversionmigrations/")}  # fmt: skip
        state = migrate_resource(migration=name, kubeconfig=kubesim.kubeconfig, return_state=True)
        assert state.is_cancelled(), state
        assert "flow run 0b1c2d3e-the-live-run" in (state.message or ""), state.message
        assert "holds it until" in (state.message or "") and "writes nothing" in (state.message or "")
        after = {**revisions(kubesim, f"/registry/configmaps/{namespace}/"),
                 **revisions(kubesim, "/registry/migration.k8s.io/storageversionmigrations/")}  # fmt: skip
        assert after == before, "nothing written: no object, not the request"
        lease = next(lease for lease in list_writer_leases(api, namespace=NS) if lease.name == lease_name(name))
        assert lease.holder == "0b1c2d3e-the-live-run/1a2b3c4d", "the holder keeps its request"
    finally:
        holder.release()
        api.close()


def test_without_the_install_namespace_a_run_fails_naming_the_fix_and_writes_nothing(
    kubesim: Kubesim, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    configmaps(kubesim, namespace, 3)
    monkeypatch.setenv("STORAGE_MIGRATOR_NAMESPACE", "no-such-install")
    api = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    name = new_request(api)
    before = revisions(kubesim, f"/registry/configmaps/{namespace}/")
    state = migrate_resource(migration=name, kubeconfig=kubesim.kubeconfig, return_state=True)
    assert state.is_failed(), state
    assert "kubectl create namespace no-such-install" in (state.message or ""), state.message
    assert revisions(kubesim, f"/registry/configmaps/{namespace}/") == before
    assert not read_migration(api, name).status.conditions, "the request was not touched"
    api.close()


#: The run taken over: its writes in flight at most (one per writing thread) may arrive after it is
#: let go again, each a conditional patch of an object the new run has rewritten since (a 409).
CONCURRENCY = 4


def test_a_run_taken_over_while_alive_writes_no_object_once_it_runs_again(
    kubesim: Kubesim, namespace: str, prefect_api: str, tmp_path: Path
) -> None:
    """A run stopped (SIGSTOP: a paused container, a machine cut off) longer than its Lease: another
    run takes the request over and finishes it. Let go again, the old run learns of it at its next
    renewal or LIST, writes no object (etcd holds nothing of it), does not overwrite the verdict,
    and ends Cancelled (TakenOver)."""
    configmaps(kubesim, namespace, 160)
    api = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    name = new_request(api)
    log = tmp_path / "old-run.log"
    code = ("from flows.migrate_resource import migrate_resource\n"
            f"state = migrate_resource(migration={name!r}, kubeconfig={kubesim.kubeconfig!r}, chunk_size=20,"
            f" write_rate_per_second=30.0, write_concurrency={CONCURRENCY}, return_state=True)\n"
            "print('final state:', state.type.value, state.message, flush=True)\n")  # fmt: skip
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "DO_NOT_TRACK": "1",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}  # fmt: skip
    with log.open("wb") as out:
        old = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=out, stderr=out)
    try:
        wait_until(lambda: read_migration(api, name).spec.continue_token or old.poll() is not None,
                   what="the old run's first checkpoint")  # fmt: skip
        assert old.poll() is None, log.read_text()[-3000:]
        old.send_signal(signal.SIGSTOP)
        wait_until(lambda: not any(lease.name == lease_name(name) and is_live(lease, now=datetime.now(UTC))
                                   for lease in list_writer_leases(api, namespace=NS)),
                   what="the stopped run's Lease to expire", timeout=60)  # fmt: skip
        state = migrate_resource(migration=name, kubeconfig=kubesim.kubeconfig, chunk_size=50,
                                 write_rate_per_second=500.0, return_state=True)  # fmt: skip
        assert state.is_completed(), state
        taken = read_migration(api, name)
        assert is_condition_true(taken.status.conditions, CONDITION_SUCCEEDED)
        new_owner = owner_of(taken)
        since_rev, since_tenth = kubesim.etcd.revision(), int(time.time() * 10) + 1
        old.send_signal(signal.SIGCONT)
        assert old.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if old.poll() is None:
            old.send_signal(signal.SIGCONT)
            old.kill()
            old.wait()
    output = log.read_text()
    assert "final state: CANCELLED" in output and "was taken over" in output, output[-3000:]
    written = [k for k, rev in revisions(kubesim, f"/registry/configmaps/{namespace}/").items() if rev > since_rev]
    assert not written, f"objects written by the taken-over run once it ran again: {written[:5]}"
    late = sum(n for tenth, n in kubesim.admin.timeline().get("patch configmaps", []) if tenth >= since_tenth)
    assert late <= CONCURRENCY, f"{late} PATCHes reached the API server from the taken-over run"
    now = read_migration(api, name)
    assert is_condition_true(now.status.conditions, CONDITION_SUCCEEDED) and owner_of(now) == new_owner, now.status
    api.close()
