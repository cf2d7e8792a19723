"""What a flow-run Job of the install is, and the admission policy that refuses any other (issue 35).

Design decision: "Prefect orders, shows and records; the cluster decides." The kustomize
install's worker (`storage-migrator worker --type kubernetes`) builds every Job from the
install's template (deployments/work-pool/kubernetes.json), never from the pool's template in
Prefect or the job variables. Because whoever holds the Prefect API can still start a worker
of their own making, or rewrite what a stock worker reads, the cluster checks every Job and Pod
the worker's ServiceAccount creates: a `ValidatingAdmissionPolicy` and its binding
(admissionregistration.k8s.io/v1, GA since Kubernetes 1.30), built here and shipped as
deployments/admission/flow-run-jobs.yaml (tests/unit/operations keeps the two equal).

It refuses, in this order (the first refusal is the one said):
- more than the one container, or any init or ephemeral container;
- an image other than the install's (the kustomize install writes its own image, by digest
  when it names one, into the policy's `image` variable);
- a command other than `storage-migrator-run`, or any argument;
- a lifecycle hook or a probe (each runs a command in the container);
- a ServiceAccount other than the flow runs' own (`storage-migrator`);
- an environment variable the runner does not need (`RUN_ENVIRONMENT` says why each), the
  auth string or API key as a value instead of a reference to the install's Secrets, or any
  other `valueFrom`;
- an environment source other than the ConfigMap `storage-migrator-cluster`;
- a volume beyond the template's (`tmp`, an emptyDir; a Pod's own ServiceAccount token
  volume `kube-api-access-*`, which the ServiceAccount admission plugin adds to Pods), or a
  mount of anything else.
Values are not checked (PREFECT_API_URL could name another server: the runner there still
runs only our flows, for this cluster); the namespace is not matched: the worker's account
is checked wherever it creates a Job (its Role exists in the install's namespace only).
"""

from __future__ import annotations

from typing import Any, Final

__all__ = [
    "ADMISSION_POLICY",
    "FLOW_RUNS_ACCOUNT",
    "IMAGE_PLACEHOLDER",
    "NAMESPACE",
    "REFUSALS",
    "RUNNER",
    "RUN_ENVIRONMENT",
    "SECRET_REFERENCES",
    "WORKER_ACCOUNT",
    "admission_policy",
]

NAMESPACE: Final = "storage-migrator"
#: The runner's console script (flow_runner/main.py): the command of every flow-run Job.
RUNNER: Final = "storage-migrator-run"
#: The flow runs' ServiceAccount (deployments/rbac/), bound to the migrator's ClusterRole.
FLOW_RUNS_ACCOUNT: Final = "storage-migrator"
#: The worker's ServiceAccount (deployments/worker/rbac.yaml): the one whose Jobs are checked.
WORKER_ACCOUNT: Final = "prefect-worker"
#: The image as deployments/ name it before kustomize's `images:` and `replacements:` set it.
IMAGE_PLACEHOLDER: Final = "storage-migrator"
ADMISSION_POLICY: Final = "storage-migrator-flow-run-jobs"
#: Every variable a flow-run Job's container may have, and why the runner needs it: what
#: prefect-kubernetes 0.8's worker puts there (BaseJobConfiguration.prepare_for_flow_run, its
#: eviction handling), of the worker's settings only those of cli/workers.py's JOB_SETTINGS.
RUN_ENVIRONMENT: Final[dict[str, str]] = {
    "PREFECT__FLOW_RUN_ID": "which flow run to run",
    "PREFECT_API_URL": "where the runner reads the flow run and records its states",
    "PREFECT_API_AUTH_STRING": "the Prefect server's credentials, a secretKeyRef to the Secret prefect-api-auth",
    "PREFECT_API_KEY": "Prefect Cloud's credentials, a secretKeyRef to the Secret prefect-api-key",
    "PREFECT__WORKER_ID": "attribution: the headers of the run's API calls",
    "PREFECT__WORKER_NAME": "attribution",
    "PREFECT__FLOW_ID": "attribution",
    "PREFECT__FLOW_NAME": "attribution",
    "PREFECT__DEPLOYMENT_ID": "attribution",
    "PREFECT__DEPLOYMENT_NAME": "attribution",
    "PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR": "prefect-kubernetes: an evicted pod's run is rescheduled",
}  # fmt: skip
#: The credentials a Job may read, and only by reference (deployments/worker/config.yaml).
SECRET_REFERENCES: Final[dict[str, dict[str, str]]] = {
    "PREFECT_API_AUTH_STRING": {"name": "prefect-api-auth", "key": "auth-string"},
    "PREFECT_API_KEY": {"name": "prefect-api-key", "key": "api-key"},
}
_ENV_FROM: Final = [{"configMapRef": {"name": "storage-migrator-cluster", "optional": True}}]
_VOLUME: Final = {"name": "tmp", "emptyDir": {}}


def _cel(value: Any) -> str:
    """A JSON value as a CEL literal (strings in single quotes: the images and names we use hold none)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, list):
        return "[" + ", ".join(_cel(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_cel(k)}: {_cel(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no CEL literal for {value!r}")


def _each_container(condition: str) -> str:
    return f"variables.pod.containers.all(c, {condition})"


def _validations() -> list[dict[str, str]]:
    allowed = _cel(list(RUN_ENVIRONMENT))
    by_reference = " || ".join(f"(e.name == {_cel(n)} && e.valueFrom == {_cel({'secretKeyRef': ref})})"
                               for n, ref in SECRET_REFERENCES.items())  # fmt: skip
    secret_names = _cel(list(SECRET_REFERENCES))
    token_volume = "(request.resource.resource == 'pods' && v.name.startsWith('kube-api-access-') && has(v.projected))"
    return [
        {"expression": "size(variables.pod.containers) == 1"
                       " && (!has(variables.pod.initContainers) || size(variables.pod.initContainers) == 0)"
                       " && (!has(variables.pod.ephemeralContainers) || size(variables.pod.ephemeralContainers) == 0)",
         "message": "one container, the runner: no other, no init or ephemeral container"},
        {"expression": _each_container("c.image == variables.image"),
         "message": "the image must be the install's (deployments/kustomization.yaml images:)"},
        {"expression": _each_container(f"has(c.command) && c.command == [{_cel(RUNNER)}]"
                                       " && (!has(c.args) || size(c.args) == 0)"),
         "message": f"the command must be {RUNNER}, with no arguments"},
        {"expression": _each_container("!has(c.lifecycle) && !has(c.livenessProbe) && !has(c.readinessProbe)"
                                       " && !has(c.startupProbe)"),
         "message": "no lifecycle hook and no probe: each runs a command in the container"},
        {"expression": f"has(variables.pod.serviceAccountName) && variables.pod.serviceAccountName == "
                       f"{_cel(FLOW_RUNS_ACCOUNT)} && (!has(variables.pod.serviceAccount) || "
                       f"variables.pod.serviceAccount == {_cel(FLOW_RUNS_ACCOUNT)})",
         "message": f"the ServiceAccount must be {FLOW_RUNS_ACCOUNT}, the flow runs' own"},
        {"expression": _each_container(f"!has(c.env) || c.env.all(e, e.name in {allowed}"
                                       f" && (e.name in {secret_names} ? has(e.valueFrom) && ({by_reference})"
                                       " : !has(e.valueFrom)))"),
         "message": "the environment may hold only what the runner needs (" + ", ".join(RUN_ENVIRONMENT)
                    + "), the auth string and the API key as references to the Secrets prefect-api-auth and "
                    "prefect-api-key"},
        {"expression": _each_container(f"has(c.envFrom) && c.envFrom == {_cel(_ENV_FROM)}"),
         "message": "the environment's only source must be the ConfigMap storage-migrator-cluster"},
        {"expression": f"(!has(variables.pod.volumes) || variables.pod.volumes.all(v, v == {_cel(_VOLUME)}"
                       f" || {token_volume})) && " + _each_container(
                           "!has(c.volumeMounts) || c.volumeMounts.all(m, (m.name == 'tmp' && m.mountPath == '/tmp')"
                           " || (request.resource.resource == 'pods' && m.name.startsWith('kube-api-access-')))"),
         "message": "no volume beyond the template's: an emptyDir mounted on /tmp"},
    ]  # fmt: skip


#: What the policy refuses, one line each, in its order (`storage-migrator rbac --admission-policy`'s table).
REFUSALS: Final[tuple[str, ...]] = tuple(v["message"] for v in _validations())


def admission_policy(image: str = IMAGE_PLACEHOLDER) -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and its binding for flow-run Jobs of `image`."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": ADMISSION_POLICY},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [
                {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                 "resources": ["jobs"]},
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"]},
            ]},
            "matchConditions": [{
                "name": "created-by-the-prefect-worker",
                "expression": f"request.userInfo.username == "
                              f"{_cel(f'system:serviceaccount:{NAMESPACE}:{WORKER_ACCOUNT}')}",
            }],
            # `image` first: kustomize's replacement writes the install's image between its quotes.
            "variables": [
                {"name": "image", "expression": _cel(image)},
                {"name": "pod", "expression": "request.resource.resource == 'jobs' ? object.spec.template.spec"
                                              " : object.spec"},
            ],
            "validations": _validations(),
        },
    }  # fmt: skip
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": ADMISSION_POLICY},
        "spec": {"policyName": ADMISSION_POLICY, "validationActions": ["Deny"]},
    }
    return [policy, binding]
