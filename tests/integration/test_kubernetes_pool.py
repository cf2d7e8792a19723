"""The `kubernetes` work pool as docs/operator-guide.md deploys to it (issue 14, item 2).

Issue 14: "`prefect.yaml` with both pools: `process` for one machine (the
default) and `kubernetes` for a cluster, chosen at deploy time (... `--pool`),
with the job template's service account and image set." The guide's commands,
run against the session's Prefect test server: the pool from
deployments/work-pool/kubernetes.json, one `prefect deploy --name ... --pool ...
--job-variable image=...`, and the Job that prefect-kubernetes' worker would
create for a run of it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
POOL = "storage-migrator-kubernetes"
IMAGE = "registry.example.com/storage-migrator:0.1.0"


def prefect_cli(api_url: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("prefect")
    env = {**os.environ, "PREFECT_API_URL": api_url, "PREFECT_HOME": str(home), "DO_NOT_TRACK": "1"}
    return subprocess.run([str(exe), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


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
        assert container["image"] == IMAGE
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert job["spec"]["ttlSecondsAfterFinished"] == 86400
    finally:
        asyncio.run(_remove("migrate-resource/migrate-resource"))


def test_the_worker_creates_a_missing_pool_with_our_job_template(prefect_api: str, tmp_path: Path) -> None:
    """The worker as deployments/worker/deployment.yaml starts it, before anyone made the pool:
    the pool it creates runs Jobs in storage-migrator as the migrator's ServiceAccount (not in
    `default` with prefect-kubernetes' default template, where the worker's Role is no use)."""
    pool = "storage-migrator-kubernetes-fresh"
    template = ROOT / "deployments" / "work-pool" / "kubernetes.json"
    done = prefect_cli(prefect_api, tmp_path, "worker", "start", "--pool", pool, "--type", "kubernetes",
                       "--base-job-template", str(template), "--run-once")  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    async def created() -> Any:
        async with get_client() as client:
            found = await client.read_work_pool(pool)
            await client.delete_work_pool(pool)
            return found

    found = asyncio.run(created())
    assert found.type == "kubernetes"
    assert found.base_job_template == json.loads(template.read_text())
