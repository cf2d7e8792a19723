"""The image we ship, built and run (issue 38): `scripts/image.sh build` (cached), then

- the image is what the Job expects: user 10001 (numeric), the Job's read-only root with a
  writable /tmp, every prefect.yaml entrypoint imports there, and nothing of the dev stack is in
  it (no kubesim, devstack, tests, bench, nor a package of the dev group);
- the worker's container, started with deployments/worker/'s command and environment, reaches
  the stack's Prefect server with the server's auth string (from the Secret, as the Deployment
  reads it), answers its liveness probe, and serves its kubernetes pool: it renders a run of a
  deployment into a Job and submits it to the Kubernetes API (a stand-in: tests/e2e/node_stand_in.py);
- that Job's container, started as a kubelet would start the Job's pod (its command, whatever
  deployments/work-pool/kubernetes.json renders; its environment, PREFECT__FLOW_RUN_ID and the auth
  string's secretKeyRef included; user 10001 on a read-only root with /tmp a fresh tmpfs, no
  capabilities, its limits), with kubesim's kubeconfig mounted read-only and on the host's network,
  runs the migration: judged by etcd, every object rewritten.

Why a Job rendered by the kubernetes worker rather than a run on a process pool: the Deployment
starts `prefect worker start --type kubernetes`, and what it renders is the Job this image must
run; a process pool would need another command than the one we ship, and would not give us the
Job's own command to start (part 35 changes it: this test follows the template).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import image_build
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from node_stand_in import POD_USER, JobsAPI, PodRun
from shared_stack import runs_under_way

from devstack import PrefectStack, free_port
from kubesim.codec import decode
from kubesim.etcd import prefix_end
from storage_migrator.conditions import is_condition_true
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.migration.requests import list_migrations
from storage_migrator.settings import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("migration_crds"), pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "deployments" / "worker"
TEMPLATE = REPO / "deployments" / "work-pool" / "kubernetes.json"
#: Where the Job's container finds kubesim's kubeconfig (a job variable of the deployment, as
#: docs/operator-guide.md sets STORAGE_MIGRATOR_* settings): on a real node, in-cluster credentials.
KUBECONFIG_IN_POD = "/etc/storage-migrator/kubeconfig"
#: The Job's container: its flow run's objects (tens: the smallest data that shows every one rewritten).
OBJECTS = 24
#: The first build on a fresh machine (apt-get, mmdebstrap, the dependencies): minutes; later, seconds.
BUILD_TIMEOUT = 840


@pytest.fixture(scope="module")
def image() -> str:
    return image_build.current().image(timeout=BUILD_TIMEOUT)


@pytest.fixture
def stack(deployed_stack: PrefectStack, wait_for: Any) -> PrefectStack:
    """The e2e tier's stack, once no run is under way (tests/e2e/test_deployments.py says why)."""
    wait_for(lambda: not runs_under_way(deployed_stack), what="no flow run under way before the test")
    return deployed_stack


def in_image(
    image: str, *args: str, options: tuple[str, ...] = (), timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(image_build.run_argv(*options, image, *args), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=image_build.ENV)  # fmt: skip


#: What the Job's pod allows (deployments/work-pool/kubernetes.json): the image's own user, a
#: read-only root, /tmp the only writable place.
AS_THE_JOB = ("--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp:rw,mode=1777", "--cap-drop=all",
              "--security-opt", "no-new-privileges")  # fmt: skip

#: Run inside the image: what it holds, as JSON.
INSPECT = r"""
import importlib.metadata, importlib.util, json, os, pathlib, sys, yaml
from prefect.flows import load_flow_from_entrypoint

def writable(d):
    try:
        (pathlib.Path(d) / ".probe").write_text("x")
        return True
    except OSError:
        return False

entrypoints = {}
for deployment in yaml.safe_load(open("prefect.yaml"))["deployments"]:
    entrypoints[deployment["entrypoint"]] = load_flow_from_entrypoint(deployment["entrypoint"]).name
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "cwd": os.getcwd(), "python": list(sys.version_info[:2]),
    "writable": {d: writable(d) for d in ("/", "/opt/prefect", "/opt/prefect/.venv", "/var/tmp", "/tmp")},
    "entrypoints": entrypoints,
    "distributions": sorted({d.metadata["Name"].lower().replace("_", "-") for d in importlib.metadata.distributions()}),
    "modules": {m: importlib.util.find_spec(m) is not None for m in ("kubesim", "devstack", "celpy", "pytest", "hypothesis",
                                                                     "playwright", "mypy", "importlinter", "tests", "bench")},
    "top": sorted(os.listdir("/opt/prefect")),
    "sim": sorted(os.listdir("/opt/prefect/sim")),
    "runner_directory": str(__import__("flow_runner.shipped", fromlist=["INSTALL_DIRECTORY"]).INSTALL_DIRECTORY),
    "tools": {t: any(os.path.exists(os.path.join(p, t)) for p in os.environ["PATH"].split(":"))
              for t in ("uv", "pip", "kubectl", "etcd", "ruff")},
}))
"""


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_the_image_is_what_the_job_runs_and_holds_no_dev_stack(image: str) -> None:
    config = json.loads(image_build.engine("image", "inspect", image).stdout)[0]["Config"]
    # Numeric, so that the pod's runAsNonRoot can verify it (deployments/work-pool/kubernetes.json).
    assert config["User"] == "10001:10001"
    assert config["WorkingDir"] == "/opt/prefect"  # what `prefect deploy --job-variable image=...` records

    done = in_image(image, "python", "-c", INSPECT, options=AS_THE_JOB)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert (seen["uid"], seen["gid"], seen["cwd"], seen["python"]) == (POD_USER, POD_USER, "/opt/prefect", [3, 11])
    assert seen["writable"] == {"/": False, "/opt/prefect": False, "/opt/prefect/.venv": False, "/var/tmp": False,
                                "/tmp": True}  # fmt: skip
    prefect_yaml = yaml.safe_load((REPO / "prefect.yaml").read_text())
    flows = {d["entrypoint"]: d["entrypoint"].rsplit(":", 1)[1].replace("_", "-") for d in prefect_yaml["deployments"]}
    assert seen["entrypoints"] == flows

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    dev = _names(pyproject["dependency-groups"]["dev"]) | {"storage-migrator-sim"}
    assert not dev & set(seen["distributions"]), "the dev group is in the image"
    assert _names(pyproject["project"]["dependencies"]) <= set(seen["distributions"])
    assert not any(seen["modules"].values()), seen["modules"]
    assert not {"tests", "bench", "docs", "deployments", "scripts"} & set(seen["top"]), seen["top"]
    assert seen["sim"] == ["pyproject.toml"]  # what uv reads to trust the lock: no kubesim, no devstack
    assert seen["tools"] == {"uv": False, "pip": False, "kubectl": False, "etcd": False, "ruff": False}
    # Issue 35: the Jobs' command, our runner, is there; it accepts one pull step, into the install's
    # directory, which is the image's WORKDIR (what `prefect deploy --job-variable image=...` records).
    assert seen["runner_directory"] == "/opt/prefect"
    runner = in_image(image, "storage-migrator-run", options=AS_THE_JOB)
    assert runner.returncode == 2 and "PREFECT__FLOW_RUN_ID" in runner.stderr, runner.stdout + runner.stderr


# ---- the worker's container and the Job's ----


def _deployment_pod() -> dict[str, Any]:
    return dict(yaml.safe_load((WORKER / "deployment.yaml").read_text())["spec"]["template"]["spec"])


def _worker_config() -> dict[str, str]:
    return dict(yaml.safe_load((WORKER / "config.yaml").read_text())["data"])


def _secret_refs(pod: dict[str, Any]) -> dict[str, tuple[str, str]]:
    (container,) = pod["containers"]
    return {e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for e in container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}  # fmt: skip


class Container:
    """A container of the image started in the background (its output in a file), removed at the end."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.name = f"storage-migrator-test-{uuid.uuid4().hex[:8]}"
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen([*argv[:3], "--name", self.name, *argv[3:]], stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=image_build.ENV)  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            image_build.engine("stop", "--time", "20", self.name, check=False, timeout=60)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        image_build.engine("rm", "--force", self.name, check=False, timeout=60)  # if `--rm` could not


@pytest.fixture
def pool_and_deployment(stack: PrefectStack, image: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The pool from deployments/work-pool/kubernetes.json, and migrate-resource deployed to it as
    prefect.yaml deploys it (`--job-variable image=...`: our worker applies no job variable, but with
    an image `prefect deploy` records the image's WORKDIR as the one pull step), under a name of this
    test's (the stack's own migrate-resource stays on its process pool for the other tests)."""
    pool = _worker_config()["PREFECT_WORK_POOL"]
    name = f"in-image-{uuid.uuid4().hex[:6]}"
    stack.run("work-pool", "create", pool, "--type", "kubernetes", "--base-job-template", str(TEMPLATE), "--overwrite")
    stack.run("--no-prompt", "deploy", "flows/migrate_resource.py:migrate_resource", "--name", name,
              "--pool", pool, "--job-variable", f"image={image}")  # fmt: skip
    try:
        yield pool, f"migrate-resource/{name}"
    finally:
        with stack.client() as client:
            client.delete_deployment(client.read_deployment_by_name(f"migrate-resource/{name}").id)
            client.delete_work_pool(pool)


def test_the_worker_submits_a_job_whose_container_migrates_from_the_image(
    stack: PrefectStack, image: str, pool_and_deployment: tuple[str, str], kubesim: Any, namespace: str,
    tmp_path: Path, wait_for: Any,
) -> None:  # fmt: skip
    _, deployment_name = pool_and_deployment
    api = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    core = k8s.CoreV1Api(api)
    for i in range(OBJECTS):
        core.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"in-image-{i}")))
    api.close()
    kubesim.admin.set_storage_version("configmaps", "v2")
    ours = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    before = {m.metadata.name for m in list_migrations(ours)}
    with stack.client() as client:
        deployment = client.read_deployment_by_name(deployment_name)
        assert deployment.pull_steps == [
            {"prefect.deployments.steps.set_working_directory": {"directory": "/opt/prefect"}}
        ]
        run = client.create_flow_run_from_deployment(deployment.id, parameters={"resource": "configmaps"})
    assert stack.auth_string

    # The worker's container, as deployments/worker/ starts it.
    worker_pod = _deployment_pod()
    refs = _secret_refs(worker_pod)
    health = free_port()  # its pod's own port 8080, on the host's network here
    with JobsAPI(tmp_path) as jobs_api:
        workdir = tmp_path / "worker"
        workdir.mkdir()
        worker = PodRun(
            worker_pod, workdir,
            secrets={refs["PREFECT_API_AUTH_STRING"]: stack.auth_string},
            config_maps={
                # config.yaml as the operator edits it: the Prefect server's address.
                "prefect-worker": {**_worker_config(), "PREFECT_API_URL": stack.api_url},
                # kustomization.yaml's replacement writes the install's image here (issue 35).
                "storage-migrator-work-pool": {"kubernetes.json": TEMPLATE.read_text(), "image": image},
            },
            service_account=(jobs_api.service_account(tmp_path / "worker-sa", "storage-migrator"), "127.0.0.1",
                             jobs_api.port),
            env={"PREFECT_WORKER_WEBSERVER_PORT": str(health)},
        )  # fmt: skip
        options, worker_image, args = worker.options()
        assert worker_image == "storage-migrator"  # kustomize's `images:` names the built one
        container = Container(image_build.run_argv(*options, image, *args), tmp_path / "worker.log")
        try:
            job = jobs_api.wait_for_job(timeout=240)
            assert job is not None, f"no Job from the worker; it said:\n{container.output()[-4000:]}"
            wait_for(lambda: _health(health) == 200, what="the worker's liveness probe (the Deployment's)")
        finally:
            container.stop()
        said = container.output()
        # `storage-migrator check-prefect` with the string from the Secret, then the worker.
        assert f"the Prefect API at {stack.api_url} answers and accepts this process's credentials" in said, said
        assert "Kubernetes job" in said and "created in namespace 'storage-migrator'" in said, said
        assert not jobs_api.unanswered, jobs_api.unanswered

    # The Job as prefect-kubernetes' worker sent it: for this run, with this image, the auth string
    # from the Secret the worker itself reads (config.yaml), never in the Job.
    assert job["metadata"]["namespace"] == "storage-migrator"
    pod = job["spec"]["template"]["spec"]
    (job_container,) = pod["containers"]
    assert job_container["image"] == image
    env = {e["name"]: e for e in job_container["env"]}
    assert env["PREFECT__FLOW_RUN_ID"]["value"] == str(run.id)
    assert env["PREFECT_API_AUTH_STRING"] == {"name": "PREFECT_API_AUTH_STRING", "valueFrom": {"secretKeyRef": {
        "name": refs["PREFECT_API_AUTH_STRING"][0], "key": refs["PREFECT_API_AUTH_STRING"][1]}}}  # fmt: skip
    assert stack.auth_string not in json.dumps(job)
    # Its command, the install's template's (issue 35: our runner, whatever a job variable says): the
    # test runs the Job's own, below.
    template_container = _template_container(json.loads(TEMPLATE.read_text()))
    assert (job_container["command"], job_container.get("args", [])) == (
        template_container["command"], template_container.get("args", []))  # fmt: skip

    # The Job's pod, as a kubelet starts it.
    kubeconfig = tmp_path / "kubeconfig"
    shutil.copy(kubesim.kubeconfig, kubeconfig)
    os.chown(kubeconfig, POD_USER, POD_USER)
    kubeconfig.chmod(0o400)
    workdir = tmp_path / "job"
    workdir.mkdir()
    # The cluster's own settings, from the install's ConfigMap (issue 35: never from the API): here the
    # kubeconfig mounted where a pod would find in-cluster credentials.
    cluster = {"storage-migrator-cluster": {"STORAGE_MIGRATOR_KUBECONFIG": KUBECONFIG_IN_POD}}
    options, job_image, args = PodRun(pod, workdir, secrets={refs["PREFECT_API_AUTH_STRING"]: stack.auth_string},
                                      config_maps=cluster, mounts={KUBECONFIG_IN_POD: kubeconfig}).options()  # fmt: skip
    for flag in ("--read-only", "--cap-drop=all", "no-new-privileges"):
        assert flag in options
    user = options.index("--user")
    assert options[user : user + 2] == ["--user", "10001:10001"]
    assert any(o.startswith("/tmp:") for o in options), options
    done = subprocess.run(image_build.run_argv(*options, job_image, *args), capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL, env=image_build.ENV)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]

    # Judged by etcd: every object of the namespace rewritten in the new storage version.
    prefix = f"/registry/configmaps/{namespace}/".encode()
    versions = [decode(kv.value, read_keys=[]).api_version for kv in kubesim.etcd.range(prefix, prefix_end(prefix)).kvs]
    assert versions == ["v2"] * OBJECTS
    fresh = [m for m in list_migrations(ours) if m.metadata.name not in before]
    assert [is_condition_true(m.status.conditions, "Succeeded") for m in fresh] == [True]
    with stack.client() as client:
        state = client.read_flow_run(run.id).state
    assert state is not None and state.is_completed(), state


def _template_container(template: dict[str, Any]) -> dict[str, Any]:
    """The flow-run container the install's template fixes (deployments/work-pool/kubernetes.json)."""
    (container,) = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"]
    assert isinstance(container["command"], list), container
    return dict(container)


def _health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
            return int(resp.status)
    except OSError:
        return 0
