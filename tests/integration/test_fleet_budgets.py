"""Budgets are independent (issue 20): two clusters migrating at once on one Prefect server.

Issue 20: "Two kubesim clusters, each with its own etcd, on one Prefect server. Both
migrate at once with the shared budget on ... Judged by each kubesim's timeline: each
cluster gets 0.95-1.00 of its own budget, and no 10 s window goes over." Here at a modest
rate, each run in a flow process of its own released at the same moment (as two workers
run them), judged by what each kubesim saw (the time of every PATCH, `GET
/_kubesim/timeline`), by each etcd (every object re-encoded) and by the Prefect server (a
limit per cluster, each counting one writer). The figures at 100 writes/s are
bench/fleet_budget.py's (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import Kubesim
from crd_install import cluster_with_crds
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound
from prefect_kubernetes.credentials import KubernetesClusterConfig

from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.codec import decode
from kubesim.etcd import EtcdStore, prefix_end
from storage_migrator.fleet.names import budget_limit_name, writers_limit_name
from storage_migrator.migration.write_share import WINDOW_SECONDS

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api", "migration_crds")]

REPO = Path(__file__).resolve().parents[2]
#: Writes/s of each cluster's budget, and objects per cluster: about 20 s of writes each.
RATE = 25.0
OBJECTS = 500
#: Tenths of a second in the promise's window.
WINDOW = int(WINDOW_SECONDS * 10)

#: One flow run per cluster, each in a process of its own: forks of one process that imported
#: Prefect and the flows once (issue 29: 5 s of CPU a process, with those a run makes at its first
#: call: Prefect's engines and its encoder of parameters, the ledger's schema check, the cluster's
#: block), with the cluster's ledger. Each waits for the go file, so that nothing of a start keeps
#: the runs apart; the parent prints each run's exit code (a fork exits as `python -c` would: an
#: exception 1, atexit run). The parent starts no thread, so that a fork holds no lock another held.
CHILDREN = """
import json, os, sys, time
from pathlib import Path
import alembic.command, alembic.config, alembic.runtime.migration, alembic.script, sqlite3
import fastapi.encoders, prefect.flow_engine, prefect.task_engine, prefect_kubernetes.credentials
from flows.migrate_resource import migrate_resource
go, rate, runs = Path(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3])
pids = {}
for run in runs:
    pid = os.fork()
    if pid == 0:
        log = os.open(run["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.update(run["env"])
        Path(run["ready"]).touch()
        while not go.exists():
            time.sleep(0.01)
        state = migrate_resource(resource="configmaps", cluster=run["block"], write_rate_per_second=rate,
                                 return_state=True)
        sys.exit(0 if state.is_completed() else 1)
    pids[pid] = run["name"]
codes = {}
while pids:
    pid, status = os.wait()
    codes[pids.pop(pid)] = os.waitstatus_to_exitcode(status)
print(json.dumps(codes), flush=True)
"""


def make_configmaps(kubeconfig: str | Path, namespace: str, count: int) -> None:
    api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
    core = k8s.CoreV1Api(api)
    for i in range(count):
        core.create_namespaced_config_map(
            namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"cm-{i:04d}"), data={"k": "x" * 200})
        )
    api.close()


@pytest.fixture
def cluster_b(tmp_path: Path) -> Iterator[tuple[Cluster, Path]]:
    """A second cluster with its own etcd and our CRDs, its ConfigMaps to migrate in `default`."""
    kubeconfig = tmp_path / "cluster-b.kubeconfig"
    with cluster_with_crds(kubeconfig) as other:
        make_configmaps(kubeconfig, "default", OBJECTS)
        yield other, kubeconfig


def patches_per_tenth(admin: Admin, *, since: int) -> dict[int, int]:
    """The PATCHes of ConfigMaps this kubesim saw, per tenth of a second of its clock."""
    rows = admin.timeline().get("patch configmaps", [])
    return {tenth: n for tenth, n in rows if tenth >= since}


def most_in_a_window(per: dict[int, int], first: int, last: int) -> int:
    """The most writes in any WINDOW consecutive tenths starting in [first, last - WINDOW + 1]."""
    return max(
        sum(per.get(t, 0) for t in range(s, s + WINDOW)) for s in range(first, max(first, last - WINDOW + 1) + 1)
    )


def storage_versions(etcd: EtcdStore, prefix: str) -> dict[str, str]:
    """key -> the apiVersion etcd holds it in, for every value under `prefix`."""
    raw = prefix.encode()
    return {kv.key.decode(): decode(kv.value, read_keys=[]).api_version for kv in etcd.range(raw, prefix_end(raw)).kvs}


@contextmanager
def flow_processes(
    tmp_path: Path, env: dict[str, str], blocks: dict[str, str]
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A flow run per cluster (CHILDREN), waiting for the go file it yields; killed if still running at the end."""
    go = tmp_path / "go"
    runs = [{"name": c, "block": block, "ready": str(tmp_path / f"ready-{c}"), "log": str(tmp_path / f"flow-{c}.log"),
             "env": {"STORAGE_MIGRATOR_DATABASE_URL": f"sqlite:///{tmp_path / f'ledger-{c}.db'}"}}
            for c, block in blocks.items()]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", CHILDREN, str(go), str(RATE), json.dumps(runs)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        yield proc, go
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the runs with their parent
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


class WritersSampler:
    """Each cluster's writers counter on the Prefect server, read every half second during the runs (issue 29:
    was every quarter second, two reads of the test server each; a lease is held for the whole of a run, about
    20 s, so a half second still sees both held together many times, and any second one)."""

    def __init__(self, limits: list[str]) -> None:
        self.limits = limits
        self.samples: list[tuple[int, ...]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _active(self, client: Any, name: str) -> int:
        try:
            return int(client.read_global_concurrency_limit_by_name(name).active_slots)
        except ObjectNotFound:
            return 0

    def _run(self) -> None:
        with get_client(sync_client=True) as client:
            while not self._stop.wait(0.5):
                self.samples.append(tuple(self._active(client, name) for name in self.limits))

    def __enter__(self) -> WritersSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def test_two_clusters_migrating_at_once_each_keep_their_own_budget(
    kubesim: Kubesim, namespace: str, cluster_b: tuple[Cluster, Path], prefect_api: str, tmp_path: Path
) -> None:
    """Each cluster's writes stay within its own budget in every 10 s window, and each run
    writes at more than a half share while the other writes too, which a budget shared by
    the two clusters cannot allow.

    That is the one lower bound on a rate here, and it is well under the budget: with one
    budget for both, each run paces at its half share once both write, and write_share
    holds a writer's 10 s to share_pace(RATE, 2) x 10 + 1 writes, about 124 at 25 writes/s
    (124 measured, with the flow made to use one limit for both clusters: this test then
    fails here). It asks for 0.75 of the budget's 10 s (188) in one window of the overlap
    on each cluster: to fail it, a machine must stay under 19 writes/s per cluster for
    every 10 s of the run, where one kubesim takes about 540 (docs/benchmarks.md). A slower
    machine only lowers the writes, so the upper bounds hold whatever the load.
    """
    other, other_kubeconfig = cluster_b
    suffix = uuid.uuid4().hex[:8]
    blocks = {"a": f"fleet-a-{suffix}", "b": f"fleet-b-{suffix}"}
    limits = {c: budget_limit_name("storage-migrator-writes", block) for c, block in blocks.items()}
    env = {k: v for k, v in os.environ.items() if k not in ("STORAGE_MIGRATOR_KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env.update({"PREFECT_API_URL": prefect_api, "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "KUBECONFIG": str(tmp_path / "absent"), "STORAGE_MIGRATOR_SHARED_WRITE_BUDGET": "true"})  # fmt: skip
    with flow_processes(tmp_path, env, blocks) as (runs, go):  # they load while the clusters are made ready
        make_configmaps(kubesim.kubeconfig, namespace, OBJECTS)
        admins = {"a": kubesim.admin, "b": Admin(other.server.url)}
        for admin in admins.values():
            admin.set_storage_version("configmaps", "v2")  # every object has a write to make
        KubernetesClusterConfig.from_file(Path(kubesim.kubeconfig)).save(blocks["a"], overwrite=True)
        KubernetesClusterConfig.from_file(other_kubeconfig).save(blocks["b"], overwrite=True)
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready-{c}").exists() for c in blocks):
            assert time.monotonic() < deadline and runs.poll() is None, "flows not loaded"
            time.sleep(0.05)
        since = int(time.time() * 10)
        with WritersSampler([writers_limit_name(limits[c]) for c in blocks]) as sampler:
            go.touch()
            out, _ = runs.communicate(timeout=240)
            codes = json.loads(out)
            for c in blocks:
                assert codes[c] == 0, (tmp_path / f"flow-{c}.log").read_text()[-3000:]

    # Each etcd holds every object of the cluster's own run re-encoded.
    a = storage_versions(kubesim.etcd, f"/registry/configmaps/{namespace}/")
    etcd_b = other.etcd()
    b = storage_versions(etcd_b, "/registry/configmaps/")
    etcd_b.close()
    assert len(a) == OBJECTS and len(b) >= OBJECTS
    assert set(a.values()) == {"v2"} and set(b.values()) == {"v2"}, "every ConfigMap re-encoded, in each cluster"

    # Judged by each kubesim's timeline: the runs wrote at the same time, each within its own budget.
    per = {c: patches_per_tenth(admin, since=since) for c, admin in admins.items()}
    spans = {c: (min(p), max(p)) for c, p in per.items()}
    first, last = max(s[0] for s in spans.values()), min(s[1] for s in spans.values())
    assert last - first >= WINDOW, f"the runs wrote together for at least {WINDOW_SECONDS:.0f} s: {spans}"
    for c, p in per.items():
        assert sum(p.values()) >= (OBJECTS if c == "a" else len(b)), f"cluster {c}: a PATCH per object"
        ceiling = RATE * WINDOW_SECONDS
        most = most_in_a_window(p, *spans[c])
        assert most <= ceiling, f"cluster {c}: {most} writes in a 10 s window, over its budget's {ceiling:.0f}"
        together = most_in_a_window(p, first, last)
        assert together > 0.75 * ceiling, (
            f"cluster {c}: at most {together} writes in a 10 s window while both wrote: "
            f"the clusters shared a budget (its half share allows {RATE * 9.9 / 2:.0f})"
        )

    # Two limits on the one Prefect server, each at its cluster's rate, each counting one writer.
    with get_client(sync_client=True) as client:
        budgets = {c: client.read_global_concurrency_limit_by_name(name) for c, name in limits.items()}
    assert budgets["a"].id != budgets["b"].id
    assert {c: lim.slot_decay_per_second for c, lim in budgets.items()} == {"a": RATE, "b": RATE}
    assert max(s[0] for s in sampler.samples) == 1 and max(s[1] for s in sampler.samples) == 1, sampler.samples
    assert (1, 1) in sampler.samples, "both runs held their writer's lease at one moment"
