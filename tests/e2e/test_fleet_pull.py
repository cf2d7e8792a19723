"""Pull mode: a fleet with no cluster credentials at the center (issue 30).

"Two kubesim clusters, each with its own worker. Each worker holds only its own cluster's
kubeconfig (standing in for the in-cluster ServiceAccount), and both are on one Prefect server
... Through them: a detection poll and a migration per cluster; a fleet rotation with a verdict
per cluster, judged by each etcd. After that, the Prefect database ... contains neither
cluster's token nor any client key. ... A flow run for cluster B, sent to A's pool, fails
before writing, and A's etcd is unchanged."

On the e2e tier's stack (PostgreSQL: issue 30 item 4, "a fleet on PostgreSQL"): its templates
and its worker (the `default` queue, the fleet rotation's parent, holding no credential of
either cluster); each cluster gets its deployments with `storage-migrator fleet add NAME
--pool POOL`, as an operator does, and a worker of its own on that pool: `storage-migrator
worker`, whose runs are `storage-migrator-run` (issue 35), as every worker of the stack's. Both clusters
authenticate with a token of their own (kubesim's token file), the secret a stolen Prefect
database must not hold.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_install import install_migration_crds
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from shared_stack import runs_under_way

from devstack import PrefectStack
from devstack.postgres import Postgres, postgres_bin
from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.etcd import prefix_end

# About 3.5 minutes on 2 cores beside the other lanes: a chain of nine flow-run processes, each
# started by a worker; with one core kept busy beside the suite it took more than pytest's 300 s.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SECRETS = ("s-0", "s-1", "s-2")
CONFIGMAPS = 5
#: What the clusters' workers detect: ConfigMaps only (a first poll of every resource is
#: test_first_install's), a migration of them per cluster.
WORKER_ENV = {"STORAGE_MIGRATOR_INCLUDE_RESOURCES": "configmaps"}


@dataclass
class Member:
    """One cluster of the fleet: its name, its API servers, its worker's pool."""

    name: str
    cluster: Cluster
    kubeconfig: Path
    pool: str

    def etcd(self, prefix: bytes) -> dict[bytes, int]:
        """key -> mod_revision under `prefix`, read from the cluster's etcd."""
        etcd = self.cluster.etcd()
        try:
            return {bytes(kv.key): kv.mod_revision for kv in etcd.range(prefix, prefix_end(prefix)).kvs}
        finally:
            etcd.close()

    def encrypted_with(self) -> dict[str, str]:
        """The key each Secret of `default` is stored under, read from etcd."""
        etcd = self.cluster.etcd()
        try:
            prefix = b"/registry/secrets/default/"
            values = {bytes(kv.key).decode().rsplit("/", 1)[1]: bytes(kv.value)
                      for kv in etcd.range(prefix, prefix_end(prefix)).kvs}  # fmt: skip
        finally:
            etcd.close()
        return {n: v.split(b":")[4].decode() if v.startswith(b"k8s:enc:") else "plaintext" for n, v in values.items()}

    def requests(self) -> list[dict[str, Any]]:
        with k8s_config.new_client_from_config(config_file=str(self.kubeconfig)) as api:
            found = k8s.CustomObjectsApi(api).list_cluster_custom_object("migration.k8s.io", "v1alpha1",
                                                                         "storageversionmigrations")  # fmt: skip
        return list(found["items"])

    def secrets_in_kubeconfig(self) -> list[str]:
        """What a thief of the kubeconfig could use: tokens and client keys."""
        users = yaml.safe_load(self.kubeconfig.read_text())["users"]
        found = [u["user"].get(k) for u in users for k in ("token", "client-key-data")]
        return [s for s in found if s]


def succeeded(request: dict[str, Any]) -> bool:
    conditions = request.get("status", {}).get("conditions") or []
    return any(c["type"] == "Succeeded" and c["status"] == "True" for c in conditions)


@pytest.fixture
def stack(deployed_stack: PrefectStack, wait_for: Any) -> PrefectStack:
    wait_for(lambda: not runs_under_way(deployed_stack), what="no flow run under way before the test")
    return deployed_stack


@pytest.fixture
def fleet(stack: PrefectStack, tmp_path: Path) -> Iterator[dict[str, Member]]:
    """Clusters pa-* and pb-*: ConfigMaps, and Secrets stored under key1 then key2 made the write
    key (seed 003's order); each added in pull mode on a pool of its own, and served by a worker
    that holds only that cluster's kubeconfig. Their deployments and workers go afterwards."""
    suffix = uuid.uuid4().hex[:6]
    tokens = tmp_path / "tokens.csv"
    tokens.write_text("")  # kubesim authenticates the kubeconfig's own token (a superuser) only
    members: dict[str, Member] = {}
    with Cluster(token_auth_file=tokens) as first, Cluster(token_auth_file=tokens) as second:
        try:
            # The two clusters join at once, as two operators would (each join is mostly a CLI's and a
            # worker's start: seconds of waiting on a loaded machine, twice in a row otherwise).
            with ThreadPoolExecutor(max_workers=2) as joining:
                joins = {name: joining.submit(_join, stack, name, cluster, tmp_path)
                         for name, cluster in ((f"pa-{suffix}", first), (f"pb-{suffix}", second))}  # fmt: skip
            members.update({name: join.result() for name, join in joins.items() if join.exception() is None})
            for join in joins.values():
                join.result()  # a join's error, once every cluster that joined is in `members` (torn down)
            yield members
        finally:
            for name in members:
                stack.kill_worker(f"worker-{name}")
            # Their deployments go, and with them their schedules and scheduled runs (both at once).
            removals = [subprocess.Popen(["storage-migrator", "fleet", "remove", name], env=stack.env,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                        for name in members]  # fmt: skip
            for removal in removals:
                _, err = removal.communicate(timeout=600)
                assert removal.returncode == 0, err


def _join(stack: PrefectStack, name: str, cluster: Cluster, tmp_path: Path) -> Member:
    kubeconfig = tmp_path / f"{name}.kubeconfig"
    cluster.write_kubeconfig(kubeconfig)
    admin = Admin.from_kubeconfig(kubeconfig)
    admin.set_encryption(["key1"], resources=["secrets"])
    with k8s_config.new_client_from_config(config_file=str(kubeconfig)) as api:
        install_migration_crds(api)
        core = k8s.CoreV1Api(api)
        for i in range(CONFIGMAPS):
            core.create_namespaced_config_map("default", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"cm-{i}")))
        for secret in SECRETS:
            core.create_namespaced_secret("default", k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=secret),
                                                                  string_data={"v": secret}))  # fmt: skip
    admin.set_encryption(["key2", "key1"], resources=["secrets"])
    pool = f"storage-migrator-{name}"
    added = subprocess.run(["storage-migrator", "fleet", "add", name, "--pool", pool, "-o", "json"], env=stack.env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert added.returncode == 0, added.stderr
    rows = json.loads(added.stdout)
    assert {(r["mode"], r["work_pool"]) for r in rows} == {("pull", pool)}, rows
    assert f"STORAGE_MIGRATOR_CLUSTER={name}" in added.stderr, added.stderr
    # The copy's own 10-minute poll (the template's deployment pause is the default cluster's, never
    # copied) paused: the test asks for each poll itself, and a scheduled one would race it (CANCEL_NEW).
    with stack.client() as client:
        poll = client.read_deployment_by_name(f"detect-storage-changes/{name}")
        for schedule in poll.schedules:
            client.update_deployment_schedule(poll.id, schedule.id, active=False)
    stack.start_worker(f"worker-{name}", pool=pool, limit=4, env={
        **WORKER_ENV, "STORAGE_MIGRATOR_CLUSTER": name, "STORAGE_MIGRATOR_KUBECONFIG": str(kubeconfig)})  # fmt: skip
    return Member(name=name, cluster=cluster, kubeconfig=kubeconfig, pool=pool)


def run_deployment(stack: PrefectStack, name: str, parameters: dict[str, Any] | None = None) -> str:
    """A flow run of deployment `name` (FLOW/DEPLOYMENT), as `prefect deployment run` makes it; its id."""
    with stack.client() as client:
        deployment = client.read_deployment_by_name(name)
        return str(client.create_flow_run_from_deployment(deployment.id, parameters=parameters or {}).id)


def final_state(stack: PrefectStack, run_id: str) -> Any:
    """The run's state once final, else None."""
    with stack.client() as client:
        state = client.read_flow_run(uuid.UUID(run_id)).state
    return state if state is not None and state.is_final() else None


def test_each_cluster_is_served_by_its_own_worker_and_the_server_holds_no_credential(
    stack: PrefectStack, stack_postgres: Postgres, fleet: dict[str, Member], wait_for: Any
) -> None:
    a, b = (fleet[n] for n in sorted(fleet))

    # "A flow run for cluster B, sent to A's pool, fails before writing, and A's etcd is unchanged."
    before = {k: v for k, v in a.etcd(b"/registry/").items() if not k.startswith(b"/registry/leases/")}
    stray = run_deployment(stack, f"migrate-resource/{a.name}", {"cluster": b.name, "resource": "configmaps"})
    state = wait_for(lambda: final_state(stack, stray), what="the run for B on A's worker to end")
    assert state.is_failed(), state
    assert f"for cluster {b.name!r}" in str(state.message) and f"serves cluster {a.name!r}" in str(state.message)
    # Issue 35: refused by the runner A's worker starts (storage-migrator worker), before any flow code loads.
    assert str(state.message).startswith("refused by storage-migrator-run (issue 35): "), state.message
    after = {k: v for k, v in a.etcd(b"/registry/").items() if not k.startswith(b"/registry/leases/")}
    assert after == before, "the run for B wrote to A"

    # "A detection poll and a migration per cluster": each poll requests its cluster's ConfigMaps'
    # migration and runs it, on that cluster's own deployments, pool and worker.
    polls = {m.name: run_deployment(stack, f"detect-storage-changes/{m.name}") for m in (a, b)}
    for member in (a, b):
        wait_for(lambda m=member: any(succeeded(r) for r in m.requests()),
                 what=f"{member.name}'s migration of its ConfigMaps", timeout=300)  # fmt: skip
        assert final_state(stack, polls[member.name]).is_completed()
        assert member.etcd(b"/registry/migration.k8s.io/storagestates/"), f"{member.name}'s StorageStates"
    wait_for(lambda: not runs_under_way(stack), what="every run of the polls to end")
    with stack.client() as client:
        for member in (a, b):  # the poll, its dispatcher and the migration: each on the cluster's own deployment
            own = {client.read_deployment_by_name(f"{flow}/{member.name}").id
                   for flow in ("detect-storage-changes", "run-migrations", "migrate-resource")}  # fmt: skip
            ran = {r.deployment_id for r in client.read_flow_runs(limit=200) if f"cluster:{member.name}" in r.tags}
            assert own <= ran, f"{member.name}: runs on {ran}, its deployments {own}"

    # "A fleet rotation with a verdict per cluster, judged by each etcd": the parent runs on the
    # templates' deployment (the stack's worker, no credential of either cluster); each cluster's
    # part on its own deployment and pool.
    parent = run_deployment(stack, "rotate-encryption-key/rotate-encryption-key", {
        "key": "key2", "resources": ["secrets"], "clusters": [a.name, b.name]})  # fmt: skip
    state = wait_for(lambda: final_state(stack, parent), what="the fleet rotation to end", timeout=300)
    assert state.is_completed(), state.message
    for member in (a, b):
        assert member.encrypted_with() == dict.fromkeys(SECRETS, "key2"), member.name
    with stack.client() as client:
        runs = client.read_flow_runs(limit=200)
        children = {m.name: [r for r in runs if r.deployment_id == client.read_deployment_by_name(
            f"rotate-encryption-key/{m.name}").id] for m in (a, b)}  # fmt: skip
        table = [t for t in client.read_latest_artifacts() if t.key == "rotate-encryption-key-key2-fleet"]
    assert all(len(found) == 1 and found[0].parent_task_run_id for found in children.values()), children
    assert table and "Completed on all 2 clusters" in str(table[0].description), table
    starts = sorted(found[0].start_time for found in children.values() if found[0].start_time)
    print(
        f"fleet rotation on PostgreSQL: the clusters' rotations started {(starts[-1] - starts[0]).total_seconds():.1f}"
        " s apart"
    )  # for docs/benchmarks.md (issue 30 item 4); not judged here

    # "The Prefect database ... contains neither cluster's token nor any client key."
    dump = pg_dump(stack_postgres)
    for member in (a, b):
        secrets = member.secrets_in_kubeconfig()
        assert secrets, f"{member.name}'s kubeconfig holds a token"
        assert not [s for s in secrets if s.encode() in dump], f"{member.name}'s credentials are in the database"
    assert b"client-key-data" not in dump and b"kind: Config" not in dump, "a kubeconfig is in the database"


def pg_dump(postgres: Postgres) -> bytes:
    """Every row of the stack's Prefect database, as SQL text."""
    return subprocess.run([str(postgres_bin() / "pg_dump"), "-h", "127.0.0.1", "-p", str(postgres.port), "-U",
                           "postgres", "--data-only", postgres.database], check=True, capture_output=True).stdout  # fmt: skip
