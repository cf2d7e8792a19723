"""The cluster decides which Jobs the worker's ServiceAccount may create (issue 35, item 1).

Issue 35: "The kustomize install ships a `ValidatingAdmissionPolicy` and its binding ... It
refuses any Job or Pod in the install's namespace created by the worker's ServiceAccount
unless all of these hold: the image is the pinned one ...; the command is our runner; the
ServiceAccount is the flow runs' own; the env holds only what Prefect's engine needs; no
volume beyond the template's." And: "It is checked with `kubectl apply --dry-run=server` of a
forbidden Job against the install in any case."

A cluster of this module's own, with kubesim's authentication and RBAC (as kube-apiserver's
--token-auth-file and --authorization-mode=RBAC), kubesim evaluating the policy as
kube-apiserver does (sim/kubesim/admission_policies.py). The install is applied with
`kubectl apply -k deployments/`, with the image pinned by digest; the Jobs are sent with the
token of `system:serviceaccount:storage-migrator:prefect-worker`, bound to the worker's Role:
RBAC lets them through, the policy decides. Then the worker itself: the Job our kubernetes
worker builds, after the pool's template was rewritten through the Prefect API and the run
carries job variables, is created and is the install's; a stock prefect-kubernetes worker
that follows the rewritten template is refused by the cluster.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Kubectl, pinned_kubectl
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate

from kubesim.cluster import Cluster
from kubesim.etcd import prefix_end
from storage_migrator.operations.flow_run_jobs import ADMISSION_POLICY, RUN_ENVIRONMENT

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENTS = ROOT / "deployments"
NAMESPACE = "storage-migrator"
WORKER_USER = f"system:serviceaccount:{NAMESPACE}:prefect-worker"
IMAGE = "registry.example.com/storage-migrator@sha256:" + "a" * 64
DENIED = f"ValidatingAdmissionPolicy '{ADMISSION_POLICY}' with binding '{ADMISSION_POLICY}' denied request: "


@dataclass
class Install:
    cluster: Cluster
    admin: Kubectl
    worker: Kubectl  # kubectl with the worker's ServiceAccount token
    worker_kubeconfig: Path
    template: dict[str, Any]  # the job template the worker's ConfigMap holds, as rendered
    image: str  # the Jobs' image the same ConfigMap holds

    def jobs(self) -> dict[bytes, int]:
        etcd = self.cluster.etcd()
        try:
            prefix = f"/registry/jobs/{NAMESPACE}/".encode()
            return {bytes(kv.key): kv.mod_revision for kv in etcd.range(prefix, prefix_end(prefix)).kvs}
        finally:
            etcd.close()


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    home = tmp_path_factory.mktemp("admission")
    binary = pinned_kubectl()
    assert binary, "the pinned kubectl (uv sync installs it)"
    token = secrets.token_hex(16)
    tokens = home / "tokens.csv"
    tokens.write_text(f'{token},{WORKER_USER},uid-prefect-worker,"system:serviceaccounts,'
                      f'system:serviceaccounts:{NAMESPACE}"\n')  # fmt: skip
    with Cluster(token_auth_file=tokens, authorization_mode="RBAC") as cluster:
        admin_kubeconfig = cluster.write_kubeconfig(home / "admin.yaml")
        config = yaml.safe_load(admin_kubeconfig.read_text())
        config["users"] = [{"name": config["users"][0]["name"], "user": {"token": token}}]
        worker_kubeconfig = home / "worker.yaml"
        worker_kubeconfig.write_text(yaml.safe_dump(config))
        (home / "h1").mkdir()
        (home / "h2").mkdir()
        admin = Kubectl(kubeconfig=str(admin_kubeconfig), home=home / "h1", binary=binary)
        worker = Kubectl(kubeconfig=str(worker_kubeconfig), home=home / "h2", binary=binary)
        # The install, its image pinned by digest (`kustomize edit set image ...@sha256:...`), in a copy.
        overlay = home / "deployments"
        import shutil

        shutil.copytree(DEPLOYMENTS, overlay)
        kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
        kustomization["images"] = [{"name": "storage-migrator", "newName": IMAGE.split("@")[0],
                                    "digest": IMAGE.split("@")[1]}]  # fmt: skip
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        admin("create", "namespace", NAMESPACE)
        applied = admin("apply", "-k", str(overlay))
        assert "validatingadmissionpolicy.admissionregistration.k8s.io/storage-migrator-flow-run-jobs created" in (
            applied.stdout
        ), applied.stdout
        rendered = [d for d in yaml.safe_load_all(admin("kustomize", str(overlay)).stdout) if d]
        [pool] = [d for d in rendered if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(
            "storage-migrator-work-pool-")]  # fmt: skip
        yield Install(cluster=cluster, admin=admin, worker=worker, worker_kubeconfig=worker_kubeconfig,
                      template=json.loads(pool["data"]["kubernetes.json"]), image=pool["data"]["image"])  # fmt: skip


def installs_job(install: Install, name: str) -> dict[str, Any]:
    """A Job as the install's worker creates it: the template's manifest, its image, what Prefect's worker adds."""
    from prefect.utilities.templating import apply_values

    template = install.template
    defaults = {k: v.get("default") for k, v in template["variables"]["properties"].items()}
    job = copy.deepcopy(apply_values(template["job_configuration"]["job_manifest"], defaults))
    job["metadata"] = {"name": name, "namespace": NAMESPACE}
    [container] = job["spec"]["template"]["spec"]["containers"]
    container["image"] = install.image
    container["env"] = [
        {"name": "PREFECT__FLOW_RUN_ID", "value": str(uuid.uuid4())},
        {"name": "PREFECT_API_URL", "value": "http://prefect-server.prefect.svc.cluster.local:4200/api"},
        {"name": "PREFECT_API_AUTH_STRING", "valueFrom": {"secretKeyRef": {"name": "prefect-api-auth",
                                                                           "key": "auth-string"}}},
        {"name": "PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR", "value": "reschedule"},
    ]  # fmt: skip
    return dict(job)


def with_container(job: dict[str, Any], **changes: Any) -> dict[str, Any]:
    job = copy.deepcopy(job)
    job["spec"]["template"]["spec"]["containers"][0].update(changes)
    return job


def with_pod(job: dict[str, Any], **changes: Any) -> dict[str, Any]:
    job = copy.deepcopy(job)
    job["spec"]["template"]["spec"].update(changes)
    return job


def dry_run(kubectl: Kubectl, job: dict[str, Any]) -> Any:
    """`kubectl apply --dry-run=server -f -` of one object, as its creator would send it."""
    import subprocess

    return subprocess.run(kubectl.argv("apply", "--dry-run=server", "-f", "-"), input=json.dumps(job),
                          capture_output=True, text=True, timeout=60, env=kubectl.env)  # fmt: skip


def _shapes(job: dict[str, Any]) -> dict[str, tuple[dict[str, Any], str]]:
    """Each forbidden shape, and the policy's message for it."""
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    return {
        "command": (with_container(job, command=["sh", "-c", "cat /var/run/secrets/*/token"]),
                    "the command must be storage-migrator-run, with no arguments"),
        "arguments": (with_container(job, args=["--evil"]), "the command must be storage-migrator-run"),
        "image": (with_container(job, image="registry.example.com/storage-migrator:0.1.0"),
                  "the image must be the install's"),
        "service account": (with_pod(job, serviceAccountName="default"),
                            "the ServiceAccount must be storage-migrator, the flow runs' own"),
        "env": (with_container(job, env=[*env, {"name": "STORAGE_MIGRATOR_CLUSTER", "value": "b"}]),
                "the environment may hold only what the runner needs"),
        "env PYTHONPATH": (with_container(job, env=[*env, {"name": "PYTHONPATH", "value": "/tmp"}]),
                           "the environment may hold only what the runner needs"),
        "the auth string in clear": (with_container(job, env=[
            e if e["name"] != "PREFECT_API_AUTH_STRING" else {"name": e["name"], "value": "admin:x"} for e in env]),
            "the environment may hold only what the runner needs"),
        "another Secret": (with_container(job, env=[*env, {"name": "PREFECT_API_URL", "valueFrom": {
            "secretKeyRef": {"name": "storage-migrator-token", "key": "token"}}}]), "the environment may hold only"),
        "env source": (with_container(job, envFrom=[*job["spec"]["template"]["spec"]["containers"][0]["envFrom"],
                                                    {"secretRef": {"name": "prefect-api-auth"}}]),
                       "the environment's only source must be the ConfigMap storage-migrator-cluster"),
        "volume": (with_pod(job, volumes=[{"name": "tmp", "emptyDir": {}},
                                          {"name": "root", "hostPath": {"path": "/"}}]),
                   "no volume beyond the template's"),
        "mount": (with_container(job, volumeMounts=[{"name": "tmp", "mountPath": "/opt/prefect"}]),
                  "no volume beyond the template's"),
        "init container": (with_pod(job, initContainers=[{"name": "x", "image": job["spec"]["template"]["spec"][
            "containers"][0]["image"], "command": ["sh", "-c", "id"]}]), "one container, the runner"),
        "lifecycle hook": (with_container(job, lifecycle={"postStart": {"exec": {"command": ["sh", "-c", "id"]}}}),
                           "no lifecycle hook and no probe"),
    }  # fmt: skip


def test_the_installs_job_is_admitted_and_every_forbidden_shape_refused(install: Install) -> None:
    job = installs_job(install, "flow-run-ok")
    assert install.image == IMAGE, "the ConfigMap holds the pinned image (kustomize's replacement)"
    before = install.jobs()
    ok = dry_run(install.worker, job)
    assert ok.returncode == 0, ok.stderr
    assert "job.batch/flow-run-ok created (server dry run)" in ok.stdout
    for shape, (forbidden, message) in _shapes(job).items():
        forbidden["metadata"]["name"] = f"flow-run-{shape.replace(' ', '-').lower()}"
        refused = dry_run(install.worker, forbidden)
        assert refused.returncode != 0, (shape, refused.stdout)
        # kubectl prints a 422 by its causes ("The <kind> <name> is invalid: <field>: <message>"); the
        # policy's cause has no field: as the real server's answer prints (kubernetes/website's VAP page).
        assert f'The jobs "{forbidden["metadata"]["name"]}" is invalid: : {DENIED}{message}' in refused.stderr, (
            shape, refused.stderr)  # fmt: skip
    assert install.jobs() == before, "a dry run stores nothing"
    # The policy is the worker's account's: an operator (here the admin) may run any Job.
    other = _shapes(job)["command"][0]
    other["metadata"]["name"] = "operators-own"
    assert dry_run(install.admin, other).returncode == 0


def test_a_pod_from_the_workers_account_is_checked_too(install: Install) -> None:
    """The worker's Role creates no Pods; were it given them, the policy still refuses a Pod that is not the runner."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "too-much", "namespace": NAMESPACE},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get"]}]}  # fmt: skip
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "too-much", "namespace": NAMESPACE},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "too-much"},
               "subjects": [{"kind": "ServiceAccount", "name": "prefect-worker", "namespace": NAMESPACE}]}  # fmt: skip
    for item in (role, binding):
        assert dry_run(install.admin, item).returncode == 0
    import subprocess

    subprocess.run(install.admin.argv("apply", "-f", "-"), input=json.dumps({"apiVersion": "v1", "kind": "List",
                   "items": [role, binding]}), capture_output=True, text=True, check=True, env=install.admin.env)  # fmt: skip
    try:
        spec = installs_job(install, "x")["spec"]["template"]["spec"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "runner", "namespace": NAMESPACE}, "spec": spec}
        assert dry_run(install.worker, pod).returncode == 0
        shell = with_pod({"spec": {"template": {"spec": spec}}}, volumes=[{"name": "root", "hostPath": {"path": "/"}}])
        pod["spec"], pod["metadata"]["name"] = shell["spec"]["template"]["spec"], "escape"
        refused = dry_run(install.worker, pod)
        assert f'The pods "escape" is invalid: : {DENIED}no volume beyond the template\'s' in refused.stderr, (
            refused.stderr)  # fmt: skip
    finally:
        install.admin("delete", "rolebinding,role", "too-much", "-n", NAMESPACE)


def _status(exc: Any) -> dict[str, Any]:
    return dict(json.loads(exc.body))


def test_the_status_is_kube_apiservers(install: Install) -> None:
    """The answer's shape (dispatcher.go: admission.NewForbidden, then the validation's reason and code)."""
    job = with_container(installs_job(install, ""), command=["sh"])
    job["metadata"] = {"generateName": "flow-run-", "namespace": NAMESPACE}
    for unknown in ("completions", "parallelism"):  # prefect-kubernetes' template has them in the pod's spec:
        del job["spec"]["template"]["spec"][unknown]  # the official client refuses fields a PodSpec does not have
    api = k8s_config.new_client_from_config(config_file=str(install.worker_kubeconfig))
    try:
        with pytest.raises(k8s.ApiException) as refused:
            k8s.BatchV1Api(api).create_namespaced_job(NAMESPACE, job)
    finally:
        api.close()
    status = _status(refused.value)
    assert refused.value.status == 422 and status["reason"] == "Invalid" and status["code"] == 422
    name = status["details"]["name"]
    assert name.startswith("flow-run-") and len(name) == len("flow-run-") + 5, "the generated name, as on create"
    inner = f"{DENIED}the command must be storage-migrator-run, with no arguments"
    assert status["message"] == f'jobs.batch "{name}" is forbidden: {inner}'
    assert status["details"] == {"name": name, "group": "batch", "kind": "jobs", "causes": [{"message": inner}]}


@pytest.mark.usefixtures("prefect_api")
def test_the_workers_job_is_the_installs_whatever_the_prefect_api_says(
    install: Install, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Our kubernetes worker, after the pool's template was rewritten through the API and with job
    variables on the deployment and the run: the Job it creates in the cluster is the install's. A stock
    prefect-kubernetes worker that follows the rewritten template is refused by the cluster."""
    from kubernetes_asyncio import config as async_config
    from prefect.client.schemas.objects import FlowRun
    from prefect_kubernetes.worker import KubernetesWorker, KubernetesWorkerJobConfiguration

    from storage_migrator.cli.workers import InstallKubernetesWorker, install_template

    for name, value in yaml.safe_load((DEPLOYMENTS / "worker" / "config.yaml").read_text())["data"].items():
        if name.startswith("PREFECT_INTEGRATIONS_KUBERNETES_WORKER_"):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv(
        "PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES", NAMESPACE
    )  # a worker setting, not a Job's
    pool = f"storage-migrator-kubernetes-{uuid.uuid4().hex[:6]}"
    evil = copy.deepcopy(install.template)
    manifest = evil["job_configuration"]["job_manifest"]
    manifest["spec"]["template"]["spec"]["containers"][0].update(
        command=["sh", "-c", "cat /var/run/secrets/kubernetes.io/serviceaccount/token"], image="attacker/evil"
    )
    manifest["spec"]["template"]["spec"]["serviceAccountName"] = "storage-migrator"  # the powerful account

    async def scenario() -> tuple[dict[str, Any], str]:
        async with get_client() as client:
            await client.create_work_pool(WorkPoolCreate(name=pool, type="kubernetes", base_job_template=evil))
            flow_id = await client.create_flow_from_name("migrate-resource")
            deployment_id = await client.create_deployment(
                flow_id=flow_id, name=pool, entrypoint="flows/migrate_resource.py:migrate_resource",
                work_pool_name=pool, job_variables={"command": "sh -c id", "env": {"PYTHONPATH": "/tmp"}},
            )  # fmt: skip
            run: FlowRun = await client.create_flow_run_from_deployment(
                deployment_id, job_variables={"image": "attacker/evil", "service_account_name": "default"}
            )
            work_pool = await client.read_work_pool(pool)
            try:
                # As `storage-migrator worker --type kubernetes` reads them: the ConfigMap's template and image.
                (tmp_path / "kubernetes.json").write_text(json.dumps(install.template))
                template = install_template(tmp_path / "kubernetes.json", install.image)
                worker = InstallKubernetesWorker(work_pool_name=pool, template=template)
                config = await worker.job_configuration.resolve_for_flow_run(
                    run, client=client, work_pool=work_pool, worker_name="ours"
                )
                api = await async_config.new_client_from_config(config_file=str(install.worker_kubeconfig))
                async with api:
                    created = await KubernetesWorker(work_pool_name=pool)._create_job(config, api)
                    # The stock worker builds from the pool's (rewritten) template and the job variables.
                    stock = await KubernetesWorkerJobConfiguration.resolve_for_flow_run(
                        run, client=client, work_pool=work_pool, worker_name="stock"
                    )
                    try:
                        await KubernetesWorker(work_pool_name=pool)._create_job(stock, api)
                        refused = ""
                    except Exception as exc:  # noqa: BLE001 - the cluster's answer is the test
                        refused = str(getattr(exc, "body", exc))
                return api.sanitize_for_serialization(created), refused
            finally:
                await client.delete_deployment(deployment_id)
                await client.delete_work_pool(pool)

    job, refused = asyncio.run(scenario())
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"] == IMAGE and container["command"] == ["storage-migrator-run"]
    assert not container.get("args") and pod["serviceAccountName"] == "storage-migrator"
    assert {e["name"] for e in container["env"]} <= set(RUN_ENVIRONMENT), container["env"]
    assert [e["valueFrom"] for e in container["env"] if e["name"] == "PREFECT_API_AUTH_STRING"] in (
        [], [{"secretKeyRef": {"name": "prefect-api-auth", "key": "auth-string"}}])  # fmt: skip
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {}}]
    assert f"{DENIED}one container" not in refused and DENIED in refused, refused
    assert os.environ.get("PREFECT_API_AUTH_STRING", "") not in json.dumps(job), "the string is never in a Job"
