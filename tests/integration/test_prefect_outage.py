"""Issue 31: the Prefect server goes down in the middle of a migration.

"A Prefect server restarts on every upgrade, on every node drain, and whenever its database
fails over. The migrator must come through that as well as it comes through an API server
restart." Each test runs `migrate-resource` in processes of its own (one test through a
deployment and a process worker) against a Prefect server (`prefect server start`, SQLite, as
the issue's operator ran it) that the test kills and starts again on the same port and
database. Judged by etcd (every object in v2, nothing written while the server was down, no
10 s window over the budget), by the requests, and by the budget's writers' count.

The runs are made lean in time, not in what they go through: the runs' Prefect client retries
three times (PREFECT_CLIENT_MAX_RETRIES=3, 2 + 4 + 8 s) instead of five (2 + 4 + 8 + 16 + 32 s),
so the outages below outlast its retries as the issue's 90 s outlasted the default's (the worker
keeps the default: its report of a killed run must outlast the restart). Not fewer: a busy SQLite
server answers 503 in bursts (SQLITE_BUSY), and a run whose client retried once was seen to fail
creating its flow run (CI, stop 33). The runs' request lease is
20 s (lease_seconds; 600 by default, which the dispatchers keep), so a chunk stops after 5 s
of silence (a quarter of it) instead of 150; the tests share one server, each on a budget of
its own, in this order: the first two restart the server they killed, the last leaves it down
(a server start is 10-20 s of CPU). In a lane of their own (scripts/test.sh WAITING), beside
the others: they mostly wait (for a server to die, for an outage to be noticed), and in the e2e
lane their waits added up in series (issue 29's bar: that lane had reached 736 s), in the xdist
lane they held one of its two workers for 3-4 minutes (stop 33).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from crd_install import cluster_with_crds
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from devstack import POOL, PrefectStack, descendants
from kubesim.admin import Admin
from kubesim.codec import decode
from kubesim.etcd import prefix_end
from storage_migrator.conditions import get_condition, is_condition_true
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.migration.dispatch import plan_dispatch
from storage_migrator.migration.outage import PREFECT_UNREACHABLE, WAITING_FOR_PREFECT
from storage_migrator.migration.requests import list_migrations, read_migration
from storage_migrator.models import CONDITION_RUNNING, CONDITION_SUCCEEDED, StorageVersionMigration, owner_of
from storage_migrator.settings import Settings

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
Kubesim = Any  # the conftest fixture type
#: Writes/s of the shared budget, and objects: more than a 10 s window of the budget holds.
RATE = 20.0
OBJECTS = 300
#: The keys kubesim may have encrypted Secrets with (other tests' rotations add some).
READ_KEYS = ["key1", "key2", "key3"]
#: Secrets of the second run beside the ConfigMaps' (two workers' runs on one budget).
SECRETS = OBJECTS
CHUNK = 30
#: Tenths of a second in the budget's window (issue 13: "never above 1.0 in any 10 s window").
WINDOW = 100
#: The request's lease of the runs here (seconds): their chunks stop after a quarter of it.
LEASE = "20"
#: The runs' Prefect client retries (see the module's docstring).
CLIENT_RETRIES = "3"
#: How long the test waits for one answer of the server: a restarted SQLite server was seen to hold
#: a write lock for its whole busy timeout (Prefect sets 60 s), stalling every call behind it.
STALL_SECONDS = 90.0


@dataclass
class Scene:
    """The test's namespace of ConfigMaps, and the requests the cluster held before the test (the
    session's cluster is shared: its other tests leave requests of their own)."""

    namespace: str
    known: set[str]


@pytest.fixture
def configmaps(kubesim: Kubesim, migration_crds: None, namespace: str) -> Iterator[Scene]:
    """OBJECTS ConfigMaps stored in v1 in the test's namespace, their storage version then v2;
    the test's requests deleted afterwards (other tests' dispatchers would run them)."""
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


@dataclass
class PrivateCluster:
    """A cluster of the test's own (etcd and kubesim), as the helpers read `kubesim`: no other
    test's requests there for its dispatcher to run (a closing detection poll of an earlier
    test leaves the shared cluster's requests pending)."""

    etcd: Any
    admin: Admin
    kubeconfig: str


@pytest.fixture
def private_configmaps(tmp_path: Path) -> Iterator[tuple[PrivateCluster, Scene]]:
    """OBJECTS ConfigMaps in a cluster of the test's own, stored in v1, their storage version then v2."""
    kubeconfig = tmp_path / "private.kubeconfig"
    with cluster_with_crds(kubeconfig) as cluster:
        etcd = cluster.etcd()
        try:
            sim = PrivateCluster(etcd=etcd, admin=Admin.from_kubeconfig(kubeconfig), kubeconfig=str(kubeconfig))
            with k8s_config.new_client_from_config(config_file=str(kubeconfig)) as api:
                core = k8s.CoreV1Api(api)
                core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name="outage")))
                sim.admin.set_storage_version("configmaps", "v1")
                for i in range(OBJECTS):
                    core.create_namespaced_config_map("outage", k8s.V1ConfigMap(
                        metadata=k8s.V1ObjectMeta(name=f"cm-{i:04d}"), data={"k": "x" * 100}))  # fmt: skip
            sim.admin.set_storage_version("configmaps", "v2")
            yield sim, Scene(namespace="outage", known=set())
        finally:
            etcd.close()


def cluster_api(kubesim: Kubesim) -> Any:
    return api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))


def versions(kubesim: Kubesim, namespace: str, resource: str = "configmaps") -> dict[str, tuple[str, int]]:
    """Object key -> (the apiVersion etcd holds it in, its mod revision)."""
    raw = f"/registry/{resource}/{namespace}/".encode()
    return {kv.key.decode(): (decode(kv.value, read_keys=READ_KEYS).api_version, kv.mod_revision)
            for kv in kubesim.etcd.range(raw, prefix_end(raw)).kvs}  # fmt: skip


def migrated(kubesim: Kubesim, namespace: str) -> int:
    return sum(1 for version, _ in versions(kubesim, namespace).values() if version == "v2")


def the_request(kubesim: Kubesim, scene: Scene, resource: str = "configmaps") -> StorageVersionMigration | None:
    """The request of `resource` this test's run created (None: none yet)."""
    mine = [m for m in list_migrations(cluster_api(kubesim))
            if m.metadata.name not in scene.known and m.spec.resource.resource == resource]  # fmt: skip
    assert len(mine) <= 1, f"more than one request made by the test's run: {[m.metadata.name for m in mine]}"
    return mine[0] if mine else None


def running_reason(kubesim: Kubesim, scene: Scene, resource: str = "configmaps") -> str | None:
    request = the_request(kubesim, scene, resource)
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
                                env={**stack.env, "PREFECT_CLIENT_MAX_RETRIES": CLIENT_RETRIES, "STORAGE_MIGRATOR_LEASE_SECONDS": LEASE,
                                     "STORAGE_MIGRATOR_RATE_LIMIT_NAME": budget, **env})  # fmt: skip
    finally:
        os.close(out)


def api_call(stack: PrefectStack, path: str, body: dict[str, Any] | None = None) -> Any:
    """One call of the stack's Prefect API (GET, or POST with `body`), with its auth string."""
    return stack.api(path, body, timeout=STALL_SECONDS)


def writers_counted(stack: PrefectStack, budget: str) -> int:
    """The writers the budget's counter counts (`<budget>-writers`'s active slots), read from the server."""
    try:
        return int(api_call(stack, f"/v2/concurrency_limits/{budget}-writers")["active_slots"])
    except urllib.error.HTTPError as exc:
        if exc.code == 404:  # no run has joined the budget yet
            return 0
        raise


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


@pytest.fixture
def secrets(kubesim: Kubesim, configmaps: Scene) -> Iterator[int]:
    """SECRETS Secrets stored in v1 in the test's namespace, their storage version then v2 (the
    resource of a second run beside the ConfigMaps'), v1 again afterwards."""
    api = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    core = k8s.CoreV1Api(api)
    kubesim.admin.set_storage_version("secrets", "v1")
    try:
        for i in range(SECRETS):
            core.create_namespaced_secret(configmaps.namespace, k8s.V1Secret(
                metadata=k8s.V1ObjectMeta(name=f"s-{i:04d}"), string_data={"k": "x" * 100}))  # fmt: skip
        kubesim.admin.set_storage_version("secrets", "v2")
        yield SECRETS
    finally:
        kubesim.admin.set_storage_version("secrets", "v1")
        api.close()


def busiest_window(kubesim: Kubesim, since: int, resources: tuple[str, ...]) -> int:
    """The most PATCHes of `resources` kubesim saw in any 10 s window since the tenth `since`."""
    per: dict[int, int] = {}
    for resource in resources:
        for tenth, n in kubesim.admin.timeline().get(f"patch {resource}", []):
            if tenth >= since:
                per[tenth] = per.get(tenth, 0) + n
    return max(sum(per.get(t, 0) for t in range(s, s + WINDOW)) for s in range(min(per), max(per) + 1))


def test_two_runs_wait_out_a_server_outage_and_finish_within_the_budget(
    kubesim: Kubesim, configmaps: Scene, secrets: int, stack: PrefectStack, tmp_path: Path, wait_for: Any
) -> None:
    """Issue 31: "The server is killed mid-migration for longer than the client's retries,
    then restarted. The run finishes with every object rewritten, and no window of 10 s
    exceeds the budget"; "Two workers, the server down ...: no 10 s window above the budget once
    it is back"; "While Prefect is unreachable, the run stops writing and keeps its checkpoint
    in the request"; "Once Prefect answers again, the run goes on where it stopped".

    Two runs (two workers' flow runs: one process each) share one budget across the outage."""
    scene, namespace = configmaps, configmaps.namespace
    first_tenth = int(time.time() * 10)
    logs = {r: tmp_path / f"{r}.log" for r in ("configmaps", "secrets")}
    kubesim.admin.set_faults([{"verb": "patch", "resource": r, "latency": 2.0} for r in logs])
    runs = {r: start_run(stack, kubesim, logs[r], budget="outage-waited-out", target=f"resource={r!r}")
            for r in logs}  # fmt: skip

    def tails() -> str:
        return "\n".join(f"== {r}\n{log.read_text()[-2500:]}" for r, log in logs.items())

    def held() -> bool:
        reasons = {running_reason(kubesim, scene, r) for r in logs}
        return reasons == {f"True:{WAITING_FOR_PREFECT}"} or any(run.poll() is not None for run in runs.values())

    try:
        # Whichever process starts first must not finish before the other joins (under load a start
        # takes seconds: at a clean-clone suite's start, the Secrets' run began 14 s after the
        # ConfigMaps', all written by then): every write is slowed until both runs count in the budget.
        wait_for(lambda: writers_counted(stack, "outage-waited-out") == 2 or any(
            r.poll() is not None for r in runs.values()), what="both runs to join the budget")  # fmt: skip
        kubesim.admin.clear_faults()

        def checkpointed() -> bool:
            requests = [the_request(kubesim, scene, r) for r in logs]
            return all(r is not None and r.spec.continue_token for r in requests)

        wait_for(lambda: checkpointed() or any(r.poll() is not None for r in runs.values()),
                 what="a checkpoint of each run")  # fmt: skip
        assert all(run.poll() is None for run in runs.values()), tails()
        stack.kill_server()
        # Each run has stopped its chunk and holds its request's lease: the server has been
        # silent for a quarter of the lease, every write it had leave for has been made.
        wait_for(held, what="both runs to hold their requests while they wait", timeout=150)
        quiet_from = kubesim.etcd.revision()
        for resource in logs:
            request = the_request(kubesim, scene, resource)
            assert request is not None and request.spec.continue_token, f"{resource}: the checkpoint is kept"
        assert all(run.poll() is None for run in runs.values()), f"a run ended during the outage: {tails()}"
        back_tenth = int(time.time() * 10)
        stack.start_server()
        quiet_to = kubesim.etcd.revision()
        assert all(run.wait(timeout=300) == 0 for run in runs.values()), tails()
    finally:
        for run in runs.values():
            if run.poll() is None:
                run.kill()
                run.wait()
    stored = versions(kubesim, namespace)
    stored.update(versions(kubesim, namespace, "secrets"))
    assert {version for version, _ in stored.values()} == {"v2"}, "every ConfigMap and Secret rewritten in v2"
    during = [key for key, (_, rev) in stored.items() if quiet_from < rev <= quiet_to]
    assert not during, f"written while the Prefect server was down: {during[:5]}"
    for resource in logs:
        request = the_request(kubesim, scene, resource)
        assert request is not None and is_condition_true(request.status.conditions, CONDITION_SUCCEEDED), request
    # "No ghost in the budget": the leases lost in the restart are not counted once the runs are over.
    assert writers_counted(stack, "outage-waited-out") == 0, "a ghost writer is left in the budget"
    budget = RATE * WINDOW / 10
    busiest = busiest_window(kubesim, first_tenth, tuple(logs))
    assert busiest <= budget, f"{busiest} writes in a 10 s window, over the budget of {budget:.0f}"
    after = busiest_window(kubesim, back_tenth, tuple(logs))
    assert after <= budget, f"{after} writes in a 10 s window once the server was back, over {budget:.0f}"


def run_state(stack: PrefectStack, run_id: str) -> str | None:
    state = api_call(stack, f"/flow_runs/{run_id}")["state"]
    return None if state is None else str(state["type"])


def test_a_run_killed_with_the_server_is_resumed_by_the_next_dispatch_at_once(
    private_configmaps: tuple[PrivateCluster, Scene], stack: PrefectStack, tmp_path: Path, wait_for: Any
) -> None:
    """Issue 31: "A run killed with the server: the next `run-migrations` resumes it without
    waiting for the lease"; "The dispatcher does not wait a lease for a run that is known dead";
    "No ghost in the budget. The writers' count must be right after any server restart."

    As deployed: the run is the `migrate-resource` deployment's, started by a process worker,
    and its process is killed with the server, as when their node dies. The worker (alive
    elsewhere) reports it Crashed once the server is back; the request's lease (600 s, the
    default) is still live: only the run's ended state in Prefect lets the dispatcher resume it."""
    kubesim, scene = private_configmaps
    namespace, budget = scene.namespace, "outage-killed"
    stack.run("work-pool", "create", POOL, "--type", "process", "--overwrite")
    stack.run("--no-prompt", "deploy", "--name", "migrate-resource")
    stack.start_worker("outage-worker", limit=2, env={
        "STORAGE_MIGRATOR_KUBECONFIG": kubesim.kubeconfig, "STORAGE_MIGRATOR_RATE_LIMIT_NAME": budget,
        "STORAGE_MIGRATOR_LEASE_SECONDS": LEASE})  # fmt: skip
    deployment = api_call(stack, "/deployments/name/migrate-resource/migrate-resource")
    run_id = api_call(stack, f"/deployments/{deployment['id']}/create_flow_run", {"parameters": {
        "resource": "configmaps", "chunk_size": CHUNK, "write_rate_per_second": RATE}})["id"]  # fmt: skip
    wait_for(lambda: migrated(kubesim, namespace) >= 2 * CHUNK or run_state(stack, run_id) not in ("SCHEDULED", "PENDING", "RUNNING"),
             what="two chunks of ConfigMaps rewritten by the deployed run")  # fmt: skip
    assert run_state(stack, run_id) == "RUNNING", stack.worker_log("outage-worker")[-3000:]
    runs = descendants(stack.worker_pid("outage-worker"))
    assert runs, "the flow run's process under the worker"
    for pid in runs:  # the run's node dies, and the server with it
        os.kill(pid, signal.SIGKILL)
    stack.kill_server()
    stack.start_server()
    wait_for(lambda: run_state(stack, run_id) == "CRASHED", what="the worker to report the killed run Crashed")
    request = the_request(kubesim, scene)
    assert request is not None and request.spec.continue_token and migrated(kubesim, namespace) < OBJECTS
    lease_alone = plan_dispatch([request], now=datetime.now(UTC), max_parallel=2, lease_seconds=600)
    assert lease_alone.start == [], "the request's lease is live: by it alone, the dispatch would wait"
    assert writers_counted(stack, budget) == 1, "the killed run's writer slot outlives the restart (a ghost)"

    code = ("from flows.run_migrations import run_migrations\n"
            f"s = run_migrations(kubeconfig={kubesim.kubeconfig!r}, chunk_size={CHUNK}, write_rate_per_second={RATE})\n"
            "print('outcomes:', s.outcomes, 'waiting:', s.waiting, flush=True)\n")  # fmt: skip
    log = tmp_path / "dispatch.log"
    with log.open("wb") as out:
        dispatch = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=out, stderr=out,
                                    env={**stack.env, "STORAGE_MIGRATOR_RATE_LIMIT_NAME": budget})  # fmt: skip
        # "Two restarts in a row, then a new migration: it gets its whole budget" (this server's
        # second restart): the resumed run is the only writer counted while it writes.
        counted = []
        while dispatch.poll() is None:
            counted.append(writers_counted(stack, budget))
            time.sleep(0.5)
    assert dispatch.returncode == 0, log.read_text()[-4000:]
    assert max(counted) == 1, f"writers counted while the resumed run wrote: {sorted(set(counted))}"
    assert {version for version, _ in versions(kubesim, namespace).values()} == {"v2"}, log.read_text()[-3000:]
    # (Its detection poll after the migration may have made requests of its own: read ours by name.)
    request = read_migration(cluster_api(kubesim), request.metadata.name or "")
    assert is_condition_true(request.status.conditions, CONDITION_SUCCEEDED), f"{request}\n{log.read_text()[-3000:]}"
    assert owner_of(request) not in (None, run_id), "the resumed run claimed the request"
    assert writers_counted(stack, budget) == 0, "the ghost writer is left in the budget"


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
