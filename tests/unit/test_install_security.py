"""What the install runs as (issue 14): non-root pods, and each identity holding only its own role.

The worker (deployments/worker/) holds a namespaced Role to start Jobs; the Jobs
(the kubernetes pool's job template, deployments/work-pool/kubernetes.json) run as
the storage-migrator ServiceAccount, the one bound to the migrator's ClusterRole.
Rendered with kubectl kustomize, no cluster needed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import machine_kubectl, pinned_kubectl

from storage_migrator.operations.flow_run_jobs import FLOW_RUNS_ACCOUNT, RUNNER

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "storage-migrator"


@pytest.fixture(scope="module")
def install() -> dict[tuple[str, str], dict[str, Any]]:
    binary = pinned_kubectl() or machine_kubectl()
    if binary is None:
        pytest.fail("no kubectl: run the README's test command (uv sync installs the pinned one)")
    out = subprocess.run([binary, "kustomize", str(ROOT / "deployments")], capture_output=True, text=True, check=True)
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout) if d}


def bound_subjects(binding: dict[str, Any]) -> set[tuple[str, str]]:
    return {(s["namespace"], s["name"]) for s in binding["subjects"] if s["kind"] == "ServiceAccount"}


def test_the_worker_runs_as_non_root_with_its_own_namespaced_role(install: dict[tuple[str, str], Any]) -> None:
    deployment = install[("Deployment", "prefect-worker")]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    # Issue 35: our worker (which checks the Prefect API first, issue 30), building every Job from the
    # install's template and image, whatever the pool's template in Prefect or the job variables say.
    assert container["command"] == ["storage-migrator", "worker"]
    assert container["args"] == [
        "--pool", "$(PREFECT_WORK_POOL)", "--type", "kubernetes", "--with-healthcheck",
        "--base-job-template", "/etc/storage-migrator/work-pool/kubernetes.json",
    ]  # fmt: skip
    # The server's auth string from a Secret (issue 30), optional as the API key: a server without
    # one needs none. The Jobs get a secretKeyRef to the same Secret and key (config.yaml).
    env = {e["name"]: e for e in container["env"]}
    assert env["PREFECT_API_AUTH_STRING"]["valueFrom"] == {
        "secretKeyRef": {"name": "prefect-api-auth", "key": "auth-string", "optional": True}}  # fmt: skip
    settings = install[("ConfigMap", "prefect-worker")]["data"]
    assert (settings["PREFECT_INTEGRATIONS_KUBERNETES_WORKER_API_AUTH_STRING_SECRET_NAME"],
            settings["PREFECT_INTEGRATIONS_KUBERNETES_WORKER_API_AUTH_STRING_SECRET_KEY"]) == (
        "prefect-api-auth", "auth-string")  # fmt: skip
    assert not any("AUTH_STRING" in name for name in settings if not name.endswith(("_SECRET_NAME", "_SECRET_KEY")))
    # A pool the worker creates gets our job template (namespace, ServiceAccount), not the
    # default one, whichever comes first: the worker or `prefect work-pool create`.
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/storage-migrator/work-pool"]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    pool = install[("ConfigMap", volume["configMap"]["name"])]["data"]
    assert json.loads(pool["kubernetes.json"]) == json.loads(
        (ROOT / "deployments" / "work-pool" / "kubernetes.json").read_text()
    )
    assert container["image"].startswith("storage-migrator:")
    # The Jobs' image is the worker's own: kustomize's replacement writes it into the same ConfigMap,
    # which the worker reads (STORAGE_MIGRATOR_JOB_IMAGE), and into the admission policy.
    assert pool["image"] == container["image"]
    [image_ref] = [
        e["valueFrom"]["configMapKeyRef"] for e in container["env"] if e["name"] == "STORAGE_MIGRATOR_JOB_IMAGE"
    ]
    assert image_ref == {"name": volume["configMap"]["name"], "key": "image"}
    policy = install[("ValidatingAdmissionPolicy", "storage-migrator-flow-run-jobs")]
    [variable] = [v for v in policy["spec"]["variables"] if v["name"] == "image"]
    assert variable["expression"] == f"'{container['image']}'"
    assert not pod.get("volumes") or all("secret" not in v and "hostPath" not in v for v in pod["volumes"])

    account = pod["serviceAccountName"]
    assert (deployment["metadata"]["namespace"], account) == (NAMESPACE, "prefect-worker")
    binding = install[("RoleBinding", "prefect-worker")]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "prefect-worker"}
    assert bound_subjects(binding) == {(NAMESPACE, account)}
    # The worker is bound to nothing cluster-wide: the migrator's role is the Jobs' alone.
    cluster_bindings = [d for (kind, _), d in install.items() if kind == "ClusterRoleBinding"]
    assert all((NAMESPACE, account) not in bound_subjects(b) for b in cluster_bindings)
    rules = install[("Role", "prefect-worker")]["rules"]
    assert {r for rule in rules for r in rule["resources"]} == {"jobs", "pods", "pods/log", "events"}


def test_the_flow_run_jobs_run_as_non_root_with_the_migrators_service_account(
    install: dict[tuple[str, str], Any],
) -> None:
    template = json.loads((ROOT / "deployments" / "work-pool" / "kubernetes.json").read_text())
    assert template["job_configuration"]["namespace"] == NAMESPACE
    assert template["job_configuration"]["job_manifest"]["metadata"]["namespace"] == NAMESPACE
    account = FLOW_RUNS_ACCOUNT
    binding = install[("ClusterRoleBinding", "storage-migrator")]
    assert binding["roleRef"]["name"] == "storage-migrator" and binding["roleRef"]["kind"] == "ClusterRole"
    assert bound_subjects(binding) == {(NAMESPACE, account)}
    assert ("ServiceAccount", account) in install

    pod = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The image's user is the same numeric one, so runAsNonRoot can check it.
    assert f"USER {pod['securityContext']['runAsUser']}:" in (ROOT / "Dockerfile").read_text()


def test_the_worker_and_the_flow_run_jobs_have_cpu_and_memory_requests_and_limits(
    install: dict[tuple[str, str], Any],
) -> None:
    """Issue 22: "A CPU request and limit on the worker Deployment and the kubernetes
    pool's job template" (the flow is one Python process: about one core at most, and
    docs/operator-guide.md "Sizing" says what one CPU sustains)."""
    from prefect.utilities.templating import apply_values

    (worker,) = install[("Deployment", "prefect-worker")]["spec"]["template"]["spec"]["containers"]
    assert set(worker["resources"]["requests"]) == set(worker["resources"]["limits"]) == {"cpu", "memory"}

    template = json.loads((ROOT / "deployments" / "work-pool" / "kubernetes.json").read_text())
    defaults = {name: spec.get("default") for name, spec in template["variables"]["properties"].items()}
    job = apply_values(template["job_configuration"]["job_manifest"], defaults)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {
        "requests": {"cpu": "250m", "memory": "256Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }


def test_the_job_template_takes_no_image_command_env_volume_account_or_namespace_from_the_api() -> None:
    """Issue 35: "The pool's base job template for our pools exposes no variable for image, command,
    args, env, env sources, volumes, service account or namespace. Those come from the install."
    Nor the cluster's credentials (`cluster_config`: a kubeconfig may run a command), labels or annotations."""
    template = json.loads((ROOT / "deployments" / "work-pool" / "kubernetes.json").read_text())
    variables = set(template["variables"]["properties"])
    assert not variables & {"image", "command", "env", "namespace", "service_account_name", "cluster_config",
                            "labels", "annotations", "volumes"}, variables  # fmt: skip
    configuration = template["job_configuration"]
    assert not {"command", "env", "labels", "annotations", "cluster_config"} & set(configuration), configuration
    pod = configuration["job_manifest"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    fixed = {**{k: pod.get(k) for k in ("volumes", "serviceAccountName")},
             **{k: container.get(k) for k in ("image", "command", "args", "env", "envFrom", "volumeMounts")},
             "namespace": configuration["namespace"]}  # fmt: skip
    assert "{{" not in json.dumps(fixed), fixed
    assert container["command"] == [RUNNER] and container["args"] == []
    assert container["envFrom"] == [{"configMapRef": {"name": "storage-migrator-cluster", "optional": True}}]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {}}]
