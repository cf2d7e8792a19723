"""`storage-migrator fleet add|list|remove` (issue 20 item 3: "Adding a cluster means one block plus one command";
issue 30: pull mode, the default, needs no block).

As an operator runs it: the project deployed with `prefect --no-prompt deploy --all`
(the templates, from this repository's prefect.yaml, onto the session's Prefect test
server), a KubernetesClusterConfig block, then the console script in a subprocess;
judged by what the Prefect server then holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import Kubesim
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterTags
from prefect.client.schemas.responses import DeploymentResponse
from prefect.exceptions import ObjectNotFound
from prefect.variables import Variable
from prefect.workers.process import ProcessWorker
from prefect_kubernetes.credentials import KubernetesClusterConfig

from storage_migrator.cli import main
from storage_migrator.fleet.deployments import FLEET_FLOWS
from storage_migrator.fleet.names import identity_variable

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
POOL = "storage-migrator-local"  # prefect.yaml's


def _env(api_url: str, home: Path) -> dict[str, str]:
    return {**os.environ, "PREFECT_API_URL": api_url, "PREFECT_HOME": str(home), "DO_NOT_TRACK": "1"}


def _run(api_url: str, home: Path, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name(command)
    return subprocess.run([str(exe), *args], cwd=ROOT, env=_env(api_url, home), capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def fleet(api_url: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script in a process of its own, as users run it."""
    return _run(api_url, home, "storage-migrator", "fleet", *args)


Fleet = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def fleet_here(prefect_api: str, capsys: pytest.CaptureFixture[str]) -> Fleet:
    """The console script's `main`, in this process (the session's server): the same code path as `fleet`,
    without the seconds a process takes to import Prefect on shared cores."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        code = main(["fleet", *args])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["storage-migrator", "fleet", *args], code, out, err)

    return run


@pytest.fixture(scope="module")
def templates(prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The project deployed as the operator guide says (the process pool, `prefect deploy --all`);
    every deployment of its flows, and the pool, deleted afterwards (their scheduled runs go with them).

    The pool is made through the client as `prefect work-pool create POOL --type process` makes it
    (the process worker's default job template): that command is the e2e tier's to run
    (devstack's `deploy`), and its process cost 5 s of CPU here (issue 29)."""
    home = tmp_path_factory.mktemp("prefect-home")
    with get_client(sync_client=True) as client:
        template = ProcessWorker.get_default_base_job_template()
        client.create_work_pool(WorkPoolCreate(name=POOL, type="process", base_job_template=template), overwrite=True)
    done = _run(prefect_api, home, "prefect", "--no-prompt", "deploy", "--all")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    yield home
    with get_client(sync_client=True) as client:
        for deployment in client.read_deployments(limit=200):
            if client.read_flow(deployment.flow_id).name in FLEET_FLOWS:
                client.delete_deployment(deployment.id)
        client.delete_work_pool(POOL)


@pytest.fixture
def block(kubesim_session: Kubesim) -> Iterator[str]:
    """A KubernetesClusterConfig block of a fresh name (the session's kubesim), and its identity Variable, removed after."""
    name = f"fleet-{uuid.uuid4().hex[:8]}"
    KubernetesClusterConfig.from_file(Path(kubesim_session.kubeconfig)).save(name)
    yield name
    _forget_cluster(name)


def _forget_cluster(name: str) -> None:
    """Everything a test made for cluster `name` on the server: its copies, block, identity, own pool."""
    with get_client(sync_client=True) as client:
        for deployment in _copies(client, name):
            client.delete_deployment(deployment.id)
        with contextlib.suppress(ObjectNotFound):
            client.delete_block_document(
                client.read_block_document_by_name(name, block_type_slug="kubernetes-cluster-config").id
            )
        with contextlib.suppress(ObjectNotFound):
            client.delete_variable_by_name(identity_variable(name))
        with contextlib.suppress(ObjectNotFound):
            client.delete_work_pool(f"storage-migrator-{name}")


def _copies(client: SyncPrefectClient, cluster: str) -> list[DeploymentResponse]:
    tagged = DeploymentFilter(tags=DeploymentFilterTags(all_=[f"cluster:{cluster}"]))
    return list(client.read_deployments(deployment_filter=tagged))


def _server(flow: str, name: str) -> DeploymentResponse:
    with get_client(sync_client=True) as client:
        return client.read_deployment_by_name(f"{flow}/{name}")


def test_fleet_add_copies_every_template_for_the_cluster_and_again_updates_them(
    prefect_api: str, templates: Path, block: str, fleet_here: Fleet
) -> None:
    done = fleet(prefect_api, templates, "add", block, "-o", "json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [(r["deployment"], r["action"]) for r in rows] == [(f"{f}/{block}", "created") for f in FLEET_FLOWS]

    copies: dict[str, DeploymentResponse] = {}
    for flow in FLEET_FLOWS:
        template, copy = _server(flow, flow), _server(flow, block)
        copies[flow] = copy
        assert copy.id != template.id and copy.flow_id == template.flow_id
        assert copy.parameters == {**template.parameters, "cluster": block}
        assert copy.tags == [*template.tags, f"cluster:{block}", "mode:push"], "a block, no --pool: push mode"
        assert (copy.work_pool_name, copy.work_queue_name) == (template.work_pool_name, template.work_queue_name)
        assert copy.work_pool_name == POOL
        same = ("entrypoint", "path", "pull_steps", "job_variables", "parameter_openapi_schema",
                "enforce_parameter_schema", "version")  # fmt: skip
        assert {k: getattr(copy, k) for k in same} == {k: getattr(template, k) for k in same}
        assert copy.description and block in copy.description and (template.description or "") in copy.description
        limit = template.global_concurrency_limit
        if limit is None:
            assert copy.global_concurrency_limit is None and copy.concurrency_options is None
        else:  # the detection poll, the dispatcher, the rotation: one at a time per cluster, each its own limit
            assert copy.global_concurrency_limit is not None and copy.global_concurrency_limit.id != limit.id
            assert copy.global_concurrency_limit.limit == limit.limit == 1
            assert copy.concurrency_options == template.concurrency_options
            assert copy.concurrency_options is not None
            assert copy.concurrency_options.collision_strategy.value == "CANCEL_NEW"
    assert {f for f in FLEET_FLOWS if _server(f, f).global_concurrency_limit} == {
        "detect-storage-changes", "run-migrations", "rotate-encryption-key"}  # fmt: skip

    # The detection poll: the cluster's own schedule, every 10 minutes (seed 000).
    (template_schedule,) = _server("detect-storage-changes", "detect-storage-changes").schedules
    (schedule,) = copies["detect-storage-changes"].schedules
    assert schedule.id != template_schedule.id and schedule.active
    assert getattr(schedule.schedule, "interval", None) == timedelta(seconds=600)
    assert all(not c.schedules for f, c in copies.items() if f != "detect-storage-changes")

    # `cluster` is a parameter of the flow: the server accepts a run of the copy (its schema is enforced).
    assert "cluster" in (copies["migrate-resource"].parameter_openapi_schema or {}).get("properties", {})
    lacking = {f for f, c in copies.items() if "cluster" not in (c.parameter_openapi_schema or {})["properties"]}
    assert {line.split()[1] for line in done.stderr.splitlines() if line.startswith("warning:")} == {
        f"{f}/{f}" for f in lacking}  # fmt: skip
    with get_client(sync_client=True) as client:
        run = client.create_flow_run_from_deployment(copies["migrate-resource"].id)
        assert run.parameters["cluster"] == block
        client.delete_flow_run(run.id)

    # Again (an upgrade), after the operator paused this cluster's poll and one of its deployments.
    with get_client(sync_client=True) as client:
        client.update_deployment_schedule(copies["detect-storage-changes"].id, schedule.id, active=False)
        client.pause_deployment(copies["initialize"].id)
    again = fleet_here("add", block, "-o", "json")
    assert again.returncode == 0, again.stderr
    assert {r["action"] for r in json.loads(again.stdout)} == {"updated"}
    with get_client(sync_client=True) as client:
        assert sorted(d.id for d in _copies(client, block)) == sorted(c.id for c in copies.values())
    (schedule,) = _server("detect-storage-changes", block).schedules
    assert not schedule.active, "a cluster's poll paused by the operator stays paused"
    assert _server("initialize", block).paused, "a cluster deployment paused by the operator stays paused"
    assert not _server("migrate-resource", block).paused
    assert _server("detect-storage-changes", "detect-storage-changes").schedules[0].active, "the template's runs on"
    with get_client(sync_client=True) as client:
        client.update_deployment_schedule(copies["detect-storage-changes"].id, schedule.id, active=True)

    # The table, for people: the poll's own schedule and its one-at-a-time limit.
    table = fleet_here("add", block)
    assert table.returncode == 0, table.stderr
    (row,) = [line.split() for line in table.stdout.splitlines() if line.startswith(f"detect-storage-changes/{block} ")]
    assert row[1:] == ["updated", "push", "-", POOL, "every", "600s", "1", "CANCEL_NEW"]  # "-": no engine given


def test_fleet_list_shows_the_cluster_and_remove_keeps_its_block_and_identity(
    templates: Path, block: str, fleet_here: Fleet
) -> None:
    # The templates' poll schedule paused: a new cluster's starts paused too. The default cluster's own
    # initialize paused as a deployment: that pause is the default cluster's, never a copy's.
    detection = _server("detect-storage-changes", "detect-storage-changes")
    with get_client(sync_client=True) as client:
        client.update_deployment_schedule(detection.id, detection.schedules[0].id, active=False)
        client.pause_deployment(_server("initialize", "initialize").id)
        try:
            assert fleet_here("add", block).returncode == 0
        finally:
            client.update_deployment_schedule(detection.id, detection.schedules[0].id, active=True)
            client.resume_deployment(_server("initialize", "initialize").id)
    assert not _server("detect-storage-changes", block).schedules[0].active
    assert not _server("initialize", block).paused
    Variable.set(identity_variable(block), {"uid": "uid-of-kube-system"}, overwrite=True)

    listed = fleet_here("list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    (row,) = [r for r in json.loads(listed.stdout) if r["cluster"] == block]
    assert row == {"cluster": block, "deployments": sorted(f"{f}/{block}" for f in FLEET_FLOWS), "mode": "push",
                   "engine": None, "work_pools": [POOL], "missing_deployments": [], "block": True,
                   "identity_uid": "uid-of-kube-system"}  # fmt: skip
    table = fleet_here("list")
    assert table.returncode == 0 and any(line.split()[0] == block and "uid-of-kube-system" in line
                                         for line in table.stdout.splitlines())  # fmt: skip

    removed = fleet_here("remove", block, "-o", "json")
    assert removed.returncode == 0, removed.stderr
    assert sorted(r["deployment"] for r in json.loads(removed.stdout)) == sorted(f"{f}/{block}" for f in FLEET_FLOWS)
    assert f"kubernetes-cluster-config/{block}" in removed.stderr and identity_variable(block) in removed.stderr
    with get_client(sync_client=True) as client:
        assert _copies(client, block) == []
        assert client.read_block_document_by_name(block, block_type_slug="kubernetes-cluster-config")
        assert client.read_variable_by_name(identity_variable(block)) is not None
        for flow in FLEET_FLOWS:  # the templates stay
            assert client.read_deployment_by_name(f"{flow}/{flow}")
    assert block not in [r["cluster"] for r in json.loads(fleet_here("list", "-o", "json").stdout)]
    again = fleet_here("remove", block)
    assert again.returncode == 1 and f"no deployments for cluster {block!r}" in again.stderr


def test_a_cluster_without_a_block_is_added_in_pull_mode_on_a_pool_of_its_own(
    templates: Path, fleet_here: Fleet, kubesim_session: Kubesim
) -> None:
    """Issue 30: "Pull mode, the default for a fleet. `storage-migrator fleet add NAME --pool POOL`
    gives cluster NAME its deployments on a work pool (or a queue) of its own"; "No block is
    needed, and the Prefect server holds no credential of that cluster"."""
    name = f"fleet-{uuid.uuid4().hex[:8]}"
    pool = f"storage-migrator-{name}"
    try:
        done = fleet_here("add", name, "-o", "json")
        assert done.returncode == 0, done.stderr
        assert {(r["mode"], r["work_pool"], r["work_queue"]) for r in json.loads(done.stdout)} == {
            ("pull", pool, "default")}, done.stdout  # fmt: skip
        assert f"work pool {pool!r} created" in done.stderr and f"STORAGE_MIGRATOR_CLUSTER={name}" in done.stderr
        with get_client(sync_client=True) as client:
            made, template = client.read_work_pool(pool), client.read_work_pool(POOL)
            assert (made.type, made.base_job_template) == (template.type, template.base_job_template)
            assert sorted(d.name for d in _copies(client, name)) == [name] * len(FLEET_FLOWS)
            blocks = client.read_block_documents(include_secrets=False)
            assert name not in {b.name for b in blocks}, "pull mode made no block"
        listed = [r for r in json.loads(fleet_here("list", "-o", "json").stdout) if r["cluster"] == name]
        assert [(r["mode"], r["work_pools"], r["block"]) for r in listed] == [("pull", [pool], False)]
        # A block of that name left on the server: credentials pull mode does not use, named to delete.
        KubernetesClusterConfig.from_file(Path(kubesim_session.kubeconfig)).save(name)
        again = fleet_here("add", name, "--pool", pool)
        assert again.returncode == 0 and f"work pool {pool!r} exists" in again.stderr
        assert f"prefect block delete kubernetes-cluster-config/{name}" in again.stderr, again.stderr
        # An upgrade's loop (`fleet add NAME`, no --pool) keeps a pull-mode cluster on its own pool and queue.
        with get_client(sync_client=True) as client:
            client.delete_block_document(
                client.read_block_document_by_name(name, block_type_slug="kubernetes-cluster-config").id)  # fmt: skip
        custom = fleet_here("add", name, "--pool", pool, "--queue", "eu", "-o", "json")
        assert custom.returncode == 0, custom.stderr
        upgraded = fleet_here("add", name, "-o", "json")
        assert {(r["mode"], r["work_pool"], r["work_queue"]) for r in json.loads(upgraded.stdout)} == {
            ("pull", pool, "eu")}, upgraded.stdout  # fmt: skip
        # Issue 36: the cluster's engine, on its deployments; in pull mode its install must run the same one.
        engine = fleet_here("add", name, "--engine", "in-tree", "-o", "json")
        assert {r["engine"] for r in json.loads(engine.stdout)} == {"in-tree"}, engine.stdout
        assert "STORAGE_MIGRATOR_ENGINE=in-tree in its ConfigMap storage-migrator-cluster" in engine.stderr
        assert _server("migrate-resource", name).parameters == {"cluster": name, "engine": "in-tree"}
        assert "engine" not in _server("detect-storage-changes", name).parameters
        fleet_here("add", name)  # an upgrade's loop keeps it
        listed = [r for r in json.loads(fleet_here("list", "-o", "json").stdout) if r["cluster"] == name]
        assert [r["engine"] for r in listed] == ["in-tree"]
    finally:
        _forget_cluster(name)
    # `default` is the environment's cluster: its deployments are the templates, never overwritten.
    refused = fleet_here("add", "default")
    assert refused.returncode == 2 and "templates themselves" in refused.stderr


def test_the_uid_given_at_fleet_add_is_what_every_run_is_checked_against(
    templates: Path, fleet_here: Fleet, kubesim_session: Kubesim
) -> None:
    """Issue 35, item 3: "Say what trust on first use leaves open, and what `fleet add` offers to close
    it (for example the uid given at `fleet add`, read by the operator from the cluster)". Without it,
    a cluster's first run records whatever cluster its credentials reach; with it, that run is judged."""
    from prefect.logging import disable_run_logger

    from storage_migrator.fleet.identity import IdentityChanged
    from storage_migrator.settings import Settings
    from tasks.cluster_identity import check_cluster_identity

    name = f"fleet-{uuid.uuid4().hex[:8]}"
    with client_api(kubesim_session) as api:
        real = str(api.read_namespace("kube-system").metadata.uid)
    other = str(uuid.uuid4())  # the uid of a cluster the name is not
    # The worker's credentials reach the session's cluster (pull mode: STORAGE_MIGRATOR_CLUSTER=NAME).
    settings = Settings(cluster=name, kubeconfig=kubesim_session.kubeconfig)
    try:
        assert fleet_here("add", name, "--uid", "not-a-uid").returncode == 2
        unpinned = fleet_here("add", name)
        assert unpinned.returncode == 0 and "trust on first use" in unpinned.stderr and "--uid" in unpinned.stderr
        with get_client(sync_client=True) as client:
            assert client.read_variable_by_name(identity_variable(name)) is None, "nothing recorded before a run"
        done = fleet_here("add", name, "--uid", other)
        assert done.returncode == 0, done.stderr
        assert f"kube-system uid {other} (recorded)" in done.stderr
        assert Variable.get(identity_variable(name)) == {"uid": other}
        # The name's first run reaches another cluster than the one pinned: it fails before any write.
        with disable_run_logger(), pytest.raises(IdentityChanged) as changed:
            check_cluster_identity.fn(settings)
        assert other in str(changed.value) and real in str(changed.value)
        # Another uid for a name already recorded is refused, and nothing is written.
        refused = fleet_here("add", name, "--uid", real)
        assert refused.returncode == 1
        assert f"recorded as kube-system uid {other}, and --uid says {real}: nothing was written" in refused.stderr
        assert f"prefect variable delete {identity_variable(name)}" in refused.stderr
        assert Variable.get(identity_variable(name)) == {"uid": other}
        # The operator re-pins it (the cluster was reinstalled): the runs reach the one recorded.
        with get_client(sync_client=True) as client:
            client.delete_variable_by_name(identity_variable(name))
        assert fleet_here("add", name, "--uid", real).returncode == 0
        with disable_run_logger():
            assert check_cluster_identity.fn(settings).uid == real
        again = fleet_here("add", name, "--uid", real)
        assert again.returncode == 0 and "(already recorded)" in again.stderr
    finally:
        _forget_cluster(name)


@contextlib.contextmanager
def client_api(kubesim: Kubesim) -> Iterator[Any]:
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    with k8s_config.new_client_from_config(config_file=kubesim.kubeconfig) as api:
        yield k8s.CoreV1Api(api)


def test_missing_templates_are_named_with_the_deploy_command(
    prefect_api: str, templates: Path, block: str, fleet_here: Fleet
) -> None:
    with get_client(sync_client=True) as client:
        client.delete_deployment(client.read_deployment_by_name("key-rotation-runbook/key-rotation-runbook").id)
    try:
        done = fleet_here("add", block)
        assert done.returncode == 1
        assert "key-rotation-runbook/key-rotation-runbook" in done.stderr and "deploy --all" in done.stderr
        assert "migrate-resource/migrate-resource" not in done.stderr
        with get_client(sync_client=True) as client:
            assert _copies(client, block) == [], "nothing is deployed for a cluster while a template is missing"
    finally:  # put the template back as the operator would
        redeployed = _run(prefect_api, templates, "prefect", "--no-prompt", "deploy", "--name", "key-rotation-runbook")
        assert redeployed.returncode == 0, redeployed.stderr[-2000:]
