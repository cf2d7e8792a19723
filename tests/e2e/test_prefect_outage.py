"""Issue 31: the Prefect server goes down in the middle of a migration.

"A Prefect server restarts on every upgrade, on every node drain, and whenever its database
fails over. The migrator must come through that as well as it comes through an API server
restart." Each test runs `migrate-resource` in a process of its own against a Prefect server
(`prefect server start`, SQLite, as the issue's operator ran it) that the test kills and
starts again on the same port and database. Judged by etcd (every ConfigMap in v2, nothing
written while the server was down, no 10 s window over the budget) and by the request.

The runs are made lean in time, not in what they go through: the Prefect client retries once
(PREFECT_CLIENT_MAX_RETRIES=1, 2 s) instead of five times (2 + 4 + 8 + 16 + 32 s), so the
outages below outlast its retries as the issue's 90 s outlasted the default's; the request's
lease is 20 s (lease_seconds; 600 by default), so a chunk stops after 5 s of silence (a
quarter of it) instead of 150; the two tests share one server, each on a budget of its own, in
this order: the first restarts the server it killed, the second leaves it down (a server start is
10-20 s of CPU, which the suite's other lane pays for).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from devstack import PrefectStack
from kubesim.codec import decode
from kubesim.etcd import prefix_end
from storage_migrator.conditions import get_condition, is_condition_true
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.migration.dispatch import plan_dispatch
from storage_migrator.migration.outage import PREFECT_UNREACHABLE, WAITING_FOR_PREFECT
from storage_migrator.migration.requests import list_migrations
from storage_migrator.models import CONDITION_RUNNING, CONDITION_SUCCEEDED, StorageVersionMigration
from storage_migrator.settings import Settings

REPO = Path(__file__).resolve().parents[2]
Kubesim = Any  # the conftest fixture type
#: Writes/s of the shared budget, and objects: more than a 10 s window of the budget holds.
RATE = 20.0
OBJECTS = 300
CHUNK = 30
#: Tenths of a second in the budget's window (issue 13: "never above 1.0 in any 10 s window").
WINDOW = 100
#: The request's lease of the runs here (seconds): their chunks stop after a quarter of it.
LEASE = "20"


@dataclass
class Scene:
    """The test's namespace of ConfigMaps, and the requests the cluster held before the test (the
    e2e tier's cluster is shared: its other tests leave requests of their own)."""

    namespace: str
    known: set[str]


@pytest.fixture
def configmaps(kubesim: Kubesim, migration_crds: None, namespace: str) -> Iterator[Scene]:
    """OBJECTS ConfigMaps stored in v1 in the test's namespace, their storage version then v2;
    the test's requests deleted afterwards (the e2e tier's dispatchers would run them)."""
    api = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    core = k8s.CoreV1Api(api)
    kubesim.admin.set_storage_version("configmaps", "v1")  # the tier's cluster is shared: stored in v1 here
    for i in range(OBJECTS):
        core.create_namespaced_config_map(
            namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"cm-{i:04d}"), data={"k": "x" * 100})
        )
    assert migrated(kubesim, namespace) == 0
    kubesim.admin.set_storage_version("configmaps", "v2")
    known = {m.metadata.name for m in list_migrations(cluster_api(kubesim))}
    try:
        yield Scene(namespace=namespace, known=known)
    finally:
        custom = k8s.CustomObjectsApi(api)
        for m in list_migrations(cluster_api(kubesim)):
            if m.metadata.name not in known:
                custom.delete_cluster_custom_object("migration.k8s.io", "v1alpha1", "storageversionmigrations",
                                                    m.metadata.name)  # fmt: skip
        api.close()


def cluster_api(kubesim: Kubesim) -> Any:
    return api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))


def versions(kubesim: Kubesim, namespace: str) -> dict[str, tuple[str, int]]:
    """ConfigMap key -> (the apiVersion etcd holds it in, its mod revision)."""
    raw = f"/registry/configmaps/{namespace}/".encode()
    return {kv.key.decode(): (decode(kv.value, read_keys=[]).api_version, kv.mod_revision)
            for kv in kubesim.etcd.range(raw, prefix_end(raw)).kvs}  # fmt: skip


def migrated(kubesim: Kubesim, namespace: str) -> int:
    return sum(1 for version, _ in versions(kubesim, namespace).values() if version == "v2")


def the_request(kubesim: Kubesim, scene: Scene) -> StorageVersionMigration | None:
    """The request this test's run created (None: none yet)."""
    mine = [m for m in list_migrations(cluster_api(kubesim)) if m.metadata.name not in scene.known]
    assert len(mine) <= 1, f"more than one request made by the test's run: {[m.metadata.name for m in mine]}"
    return mine[0] if mine else None


def running_reason(kubesim: Kubesim, scene: Scene) -> str | None:
    request = the_request(kubesim, scene)
    condition = get_condition(request.status.conditions, CONDITION_RUNNING) if request else None
    return None if condition is None else f"{condition.status}:{condition.reason}"


def start_run(stack: PrefectStack, kubesim: Kubesim, log: Path, *, budget: str,
              target: str = "resource='configmaps'", **env: str) -> subprocess.Popen[bytes]:  # fmt: skip
    """`migrate-resource` for the ConfigMaps (or `target`: migration='<name>') in a process of its
    own, on the stack's shared budget."""
    code = ("import sys\nfrom flows.migrate_resource import migrate_resource\n"
            f"state = migrate_resource({target}, kubeconfig={kubesim.kubeconfig!r}, chunk_size={CHUNK},"
            f" write_rate_per_second={RATE}, return_state=True)\n"
            "print('final state:', state.type.value, flush=True)\n"
            "sys.exit(0 if state.is_completed() else 3)\n")  # fmt: skip
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=out, stderr=out,
                                env={**stack.env, "PREFECT_CLIENT_MAX_RETRIES": "1", "STORAGE_MIGRATOR_LEASE_SECONDS": LEASE,
                                     "STORAGE_MIGRATOR_RATE_LIMIT_NAME": budget, **env})  # fmt: skip
    finally:
        os.close(out)


def writers_counted(stack: PrefectStack, budget: str) -> int:
    """The writers the budget's counter counts (`<budget>-writers`'s active slots), read from the server."""
    with urllib.request.urlopen(f"{stack.api_url}/v2/concurrency_limits/{budget}-writers", timeout=30) as resp:
        return int(json.loads(resp.read())["active_slots"])


@pytest.fixture(scope="module")
def module_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectStack]:
    """A Prefect server for the module (SQLite under its home)."""
    stack = PrefectStack(tmp_path_factory.mktemp("prefect"))
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def stack(module_stack: PrefectStack) -> PrefectStack:
    """The module's server, running when the test starts (a test that failed may have left it killed)."""
    if not module_stack.server_running:
        module_stack.start_server()
    return module_stack


def test_a_run_waits_out_a_server_outage_and_finishes_within_the_budget(
    kubesim: Kubesim, configmaps: Scene, stack: PrefectStack, tmp_path: Path, wait_for: Any
) -> None:
    """Issue 31: "The server is killed mid-migration for longer than the client's retries,
    then restarted. The run finishes with every object rewritten, and no window of 10 s
    exceeds the budget"; "While Prefect is unreachable, the run stops writing and keeps its
    checkpoint in the request"; "Once Prefect answers again, the run goes on where it stopped"."""
    scene, namespace = configmaps, configmaps.namespace
    log = tmp_path / "run.log"
    first_tenth = int(time.time() * 10)
    run = start_run(stack, kubesim, log, budget="outage-waited-out")
    try:
        wait_for(lambda: migrated(kubesim, namespace) >= 2 * CHUNK or run.poll() is not None,
                 what="two chunks of ConfigMaps rewritten")  # fmt: skip
        assert run.poll() is None, log.read_text()[-3000:]
        stack.kill_server()
        # The run has stopped its chunk and holds its request's lease: the server has been
        # silent for UNREACHABLE_GRACE_SECONDS, every write it had leave for has been made.
        wait_for(lambda: running_reason(kubesim, scene) == f"True:{WAITING_FOR_PREFECT}" or run.poll() is not None,
                 what="the run to hold its request while it waits", timeout=150)  # fmt: skip
        quiet_from = kubesim.etcd.revision()
        held = the_request(kubesim, scene)
        assert held is not None and held.spec.continue_token, "the checkpoint is kept in the request"
        assert run.poll() is None, f"the run ended during the outage: {log.read_text()[-3000:]}"
        stack.start_server()
        quiet_to = kubesim.etcd.revision()
        assert run.wait(timeout=300) == 0, log.read_text()[-4000:]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    stored = versions(kubesim, namespace)
    assert {version for version, _ in stored.values()} == {"v2"}, "every ConfigMap rewritten in v2"
    during = [key for key, (_, rev) in stored.items() if quiet_from < rev <= quiet_to]
    assert not during, f"written while the Prefect server was down: {during[:5]}"
    request = the_request(kubesim, scene)
    assert request is not None and is_condition_true(request.status.conditions, CONDITION_SUCCEEDED), request
    # "No ghost in the budget": the lease lost in the restart is not counted once the run is over.
    assert writers_counted(stack, "outage-waited-out") == 0, "a ghost writer is left in the budget"
    per = {t: n for t, n in kubesim.admin.timeline().get("patch configmaps", []) if t >= first_tenth}
    busiest = max(sum(per.get(t, 0) for t in range(s, s + WINDOW)) for s in range(min(per), max(per) + 1))
    assert busiest <= RATE * WINDOW / 10, f"{busiest} writes in a 10 s window, over the budget of {RATE * 10:.0f}"


def test_a_run_that_gives_up_leaves_its_request_to_the_next_dispatch_at_once(
    kubesim: Kubesim, configmaps: Scene, stack: PrefectStack, tmp_path: Path, wait_for: Any
) -> None:
    """Issue 31: "How long it waits before it gives up is a setting, 30 minutes by default.
        When it gives up, it ends with a state that the dispatcher resumes at once, not after a
        lease" (here prefect_outage_seconds is 8 s; the dispatcher's lease 600 s, the default). That the
    resumed run goes on from the checkpoint is test_migrate_flow.py's killed runs."""
    scene, namespace = configmaps, configmaps.namespace
    log = tmp_path / "run.log"
    run = start_run(stack, kubesim, log, budget="outage-given-up", STORAGE_MIGRATOR_PREFECT_OUTAGE_SECONDS="8")
    try:
        wait_for(lambda: migrated(kubesim, namespace) >= CHUNK or run.poll() is not None,
                 what="a chunk of ConfigMaps rewritten")  # fmt: skip
        assert run.poll() is None, log.read_text()[-3000:]
        stack.kill_server()
        wait_for(lambda: running_reason(kubesim, scene) == f"False:{PREFECT_UNREACHABLE}" or run.poll() is not None,
                 what="the run to give up", timeout=240)  # fmt: skip
        assert running_reason(kubesim, scene) == f"False:{PREFECT_UNREACHABLE}", log.read_text()[-3000:]
        # The run has given up: its writes are over. Its process would go on a minute trying to
        # send its last events to the server that is down: ended here instead.
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    request = the_request(kubesim, scene)
    assert request is not None and request.spec.continue_token, "the checkpoint is kept in the request"
    assert migrated(kubesim, namespace) < OBJECTS, "the run gave up before the end"
    plan = plan_dispatch([request], now=datetime.now(UTC), max_parallel=2, lease_seconds=600)
    assert plan.start == [request.metadata.name], f"the next dispatch does not resume it at once: {plan}"
