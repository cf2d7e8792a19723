"""The `kubernetes` work pool as docs/operator-guide.md deploys to it (issue 14, item 2).

Issue 14: "`prefect.yaml` with both pools: `process` for one machine (the
default) and `kubernetes` for a cluster, chosen at deploy time (... `--pool`),
with the job template's service account and image set." The guide's commands,
run against the session's Prefect test server: the pool from
deployments/work-pool/kubernetes.json, one `prefect deploy --name ... --pool ...
--job-variable image=...`, and the Job that prefect-kubernetes' worker would
create for a run of it. Issue 30: the worker as deployments/worker/ starts it (its check of
the Prefect API first), with and without the server's auth string, and the Job reading the
string from the Secret, never carrying it. Issue 35: that worker is ours, and its Jobs are
the install's (tests/integration/test_flow_run_jobs_admitted.py shows the cluster admits them).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.objects import FlowRun
from prefect.settings import PREFECT_API_AUTH_STRING
from prefect_kubernetes.worker import KubernetesWorker, KubernetesWorkerJobConfiguration

from storage_migrator.cli.workers import InstallKubernetesWorker, install_template
from storage_migrator.operations.flow_run_jobs import RUN_ENVIRONMENT

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
POOL = "storage-migrator-kubernetes"
IMAGE = "registry.example.com/storage-migrator:0.1.0"
WORKER = ROOT / "deployments" / "worker"
TEMPLATE = ROOT / "deployments" / "work-pool" / "kubernetes.json"


def prefect_cli(api_url: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("prefect")
    env = {**os.environ, "PREFECT_API_URL": api_url, "PREFECT_HOME": str(home), "DO_NOT_TRACK": "1"}
    return subprocess.run([str(exe), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


def worker_config() -> dict[str, str]:
    """deployments/worker/config.yaml's settings, the worker's environment."""
    return dict(yaml.safe_load((WORKER / "config.yaml").read_text())["data"])


def worker_container() -> dict[str, Any]:
    [container] = yaml.safe_load((WORKER / "deployment.yaml").read_text())["spec"]["template"]["spec"]["containers"]
    return dict(container)


def deployed_worker(api_url: str, home: Path, pool: str, *extra: str, auth: bool) -> subprocess.CompletedProcess[str]:
    """The worker's container command as deployments/worker/deployment.yaml gives it (`$(VAR)` from
    config.yaml, as the kubelet expands it; the pool's template from the repository instead of its
    ConfigMap mount), against `api_url`, with the session's auth string or without it."""
    container = worker_container()
    values = {**worker_config(), "PREFECT_WORK_POOL": pool}
    argv = [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a) for a in container["command"] + container["args"]]
    argv = [str(WORKER.parent / "work-pool" / "kubernetes.json") if a.startswith("/etc/storage-migrator/") else a
            for a in argv]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if auth or k != "PREFECT_API_AUTH_STRING"}
    env.update(PREFECT_API_URL=api_url, PREFECT_HOME=str(home), DO_NOT_TRACK="1",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]))  # fmt: skip
    # The Jobs' image, which the kubelet reads from the ConfigMap (kustomize's replacement writes it there).
    env["STORAGE_MIGRATOR_JOB_IMAGE"] = IMAGE
    return subprocess.run([*argv, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


async def _job_manifest(deployment_name: str) -> tuple[Any, dict[str, Any]]:
    async with get_client() as client:
        deployment = await client.read_deployment_by_name(deployment_name)
        pool = await client.read_work_pool(POOL)
        config = await KubernetesWorkerJobConfiguration.from_template_and_values(
            pool.base_job_template, deployment.job_variables
        )
        return deployment, config.job_manifest


async def _create_pool() -> None:
    template = json.loads((ROOT / "deployments" / "work-pool" / "kubernetes.json").read_text())
    async with get_client() as client:
        await client.create_work_pool(WorkPoolCreate(name=POOL, type="kubernetes", base_job_template=template))


async def _remove(deployment_name: str) -> None:
    async with get_client() as client:
        deployment = await client.read_deployment_by_name(deployment_name)
        await client.delete_deployment(deployment.id)
        await client.delete_work_pool(POOL)


def test_a_deployment_to_the_kubernetes_pool_runs_as_the_migrators_service_account(
    prefect_api: str, tmp_path: Path
) -> None:
    asyncio.run(_create_pool())
    done = prefect_cli(prefect_api, tmp_path, "--no-prompt", "deploy", "--name", "migrate-resource",
                       "--pool", POOL, "--job-variable", f"image={IMAGE}")  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    try:
        deployment, job = asyncio.run(_job_manifest("migrate-resource/migrate-resource"))
        assert deployment.work_pool_name == POOL
        # An image among the job variables: prefect deploy records the image's WORKDIR (Dockerfile).
        assert deployment.pull_steps == [
            {"prefect.deployments.steps.set_working_directory": {"directory": "/opt/prefect"}}
        ]
        assert "WORKDIR /opt/prefect" in (ROOT / "Dockerfile").read_text()
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert job["metadata"]["namespace"] == "storage-migrator"
        assert pod["serviceAccountName"] == "storage-migrator"  # bound to the migrator's ClusterRole
        # Issue 35: the image is the install's (its ConfigMap's, set by kustomize), never a job variable's:
        # even Prefect's own templating of this template leaves the placeholder the install replaces.
        assert deployment.job_variables == {"image": IMAGE} and container["image"] == "storage-migrator"
        assert container["command"] == ["storage-migrator-run"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert job["spec"]["ttlSecondsAfterFinished"] == 86400
    finally:
        asyncio.run(_remove("migrate-resource/migrate-resource"))


def test_the_worker_creates_a_missing_pool_with_our_job_template(prefect_api: str, tmp_path: Path) -> None:
    """The worker as deployments/worker/deployment.yaml starts it (its command: the check of the
    Prefect API, then `prefect worker start`), before anyone made the pool: the pool it creates
    runs Jobs in storage-migrator as the migrator's ServiceAccount (not in `default` with
    prefect-kubernetes' default template, where the worker's Role is no use)."""
    pool = "storage-migrator-kubernetes-fresh"
    template = ROOT / "deployments" / "work-pool" / "kubernetes.json"
    done = deployed_worker(prefect_api, tmp_path, pool, "--run-once", auth=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"the Prefect API at {prefect_api} answers and accepts this process's credentials" in done.stdout

    async def created() -> Any:
        async with get_client() as client:
            found = await client.read_work_pool(pool)
            await client.delete_work_pool(pool)
            return found

    found = asyncio.run(created())
    assert found.type == "kubernetes"
    # The install's template, with the install's image: what the worker builds every Job from.
    shipped = json.loads(template.read_text())
    shipped["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0]["image"] = IMAGE
    assert found.base_job_template == shipped


def test_the_deployed_worker_without_the_string_says_which_setting_and_never_starts(
    prefect_api: str, tmp_path: Path
) -> None:
    """Issue 30: "Without the auth string, the CLI and a worker get a clear error that names the
    setting, not a stack trace." Prefect's own `prefect worker start` (3.9) ends in a stack trace
    whose last line is the 401; the deployed command checks first and stops there."""
    pool = f"storage-migrator-kubernetes-{uuid.uuid4().hex[:8]}"
    done = deployed_worker(prefect_api, tmp_path, pool, auth=False)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr == (f"storage-migrator: the Prefect API at {prefect_api} asks for credentials (401 Unauthorized): "
                           "set PREFECT_API_AUTH_STRING to the server's PREFECT_SERVER_API_AUTH_STRING "
                           "(user:password)\n")  # fmt: skip
    assert done.stdout == ""  # the worker never started

    async def pool_exists() -> bool:
        async with get_client() as client:
            return any(p.name == pool for p in await client.read_work_pools())

    assert not asyncio.run(pool_exists())


@pytest.fixture
def kubernetes_api() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An address that takes Jobs as the Kubernetes API does (201, the Job back) and keeps them:
    kubesim serves no batch/v1 Jobs, and what matters is what the worker sends."""
    created: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            job = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            job["metadata"].update(name=f"{job['metadata']['generateName']}x", uid=str(uuid.uuid4()))
            created.append(job)
            body = json.dumps(job).encode()
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", created
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.usefixtures("prefect_api")
def test_a_flow_run_job_reads_the_auth_string_from_the_secret_never_carries_it(
    kubernetes_api: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Job prefect-kubernetes' worker creates for a flow run, with config.yaml's settings and
    the string deployment.yaml gives the worker from the Secret: the Job's PREFECT_API_AUTH_STRING
    is a secretKeyRef to that same Secret and key, and the string is nowhere in the Job."""
    from kubernetes_asyncio.client import ApiClient, Configuration

    url, created = kubernetes_api
    for name, value in worker_config().items():
        if name.startswith("PREFECT_INTEGRATIONS_KUBERNETES_WORKER_"):
            monkeypatch.setenv(name, value)
    [worker_ref] = [e["valueFrom"]["secretKeyRef"] for e in worker_container()["env"]
                    if e["name"] == "PREFECT_API_AUTH_STRING"]  # fmt: skip
    auth_string = PREFECT_API_AUTH_STRING.value()  # the session's: the worker's, as read from the Secret
    assert auth_string

    async def create() -> None:
        # As `storage-migrator worker --type kubernetes` builds a Job (cli/workers.py), whose image is the install's.
        worker = InstallKubernetesWorker(work_pool_name=POOL, template=install_template(TEMPLATE, IMAGE))
        config = await worker.job_configuration.from_template_and_values(worker.job_configuration.install_template(),
                                                                         {})  # fmt: skip
        config.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="auth-check"))
        async with ApiClient(Configuration(host=url)) as client:
            await KubernetesWorker(work_pool_name=POOL)._create_job(config, client)

    asyncio.run(create())
    [job] = created
    [container] = job["spec"]["template"]["spec"]["containers"]
    [entry] = [e for e in container["env"] if e["name"] == "PREFECT_API_AUTH_STRING"]
    assert entry == {"name": "PREFECT_API_AUTH_STRING", "valueFrom": {"secretKeyRef": {
        "name": worker_ref["name"], "key": worker_ref["key"]}}}  # fmt: skip
    assert auth_string not in json.dumps(job), [e for e in container["env"] if auth_string in json.dumps(e)]
    assert container["image"] == IMAGE and "PREFECT_API_URL" in {e["name"] for e in container["env"]}
    # Issue 35: of the worker's settings, only what the runner needs (the admission policy refuses any other).
    assert {e["name"] for e in container["env"]} <= set(RUN_ENVIRONMENT), container["env"]
    # Issue 30, pull mode: the Job says which cluster it is for from a ConfigMap in its own cluster
    # (deployments/worker/cluster.yaml), never from the Prefect server.
    assert container["envFrom"] == [{"configMapRef": {"name": "storage-migrator-cluster", "optional": True}}]
