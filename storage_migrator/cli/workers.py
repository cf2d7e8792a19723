"""The Prefect workers of `storage-migrator worker`: they start our runner only (issue 35).

Prefect's workers build each flow run's process or Job from the work pool's base job
template and the job variables, both of which whoever holds the Prefect API can rewrite
(`command`, `env`, `image`, `service_account_name`, `cluster_config`, the whole template),
and Prefect's process worker loads the flow from the API's pull steps in its own process to
run crash and cancellation hooks. These subclasses take from the API only which flow run to
start:

- `RunnerProcessWorker` (pool type `process`): each run is `python -m flow_runner` (the
  runner, flow_runner/main.py), with the worker's own environment (its
  STORAGE_MIGRATOR_CLUSTER and STORAGE_MIGRATOR_KUBECONFIG); no hook is run in the worker
  (ours define none: tests/unit/flow_runner).
- `InstallKubernetesWorker` (pool type `kubernetes`): each Job is the install's template
  (deployments/work-pool/kubernetes.json, from the worker's ConfigMap) with the install's
  image, its defaults only, and of the worker's Prefect settings only those the runner needs
  (`JOB_SETTINGS`). The admission policy (deployments/admission/) refuses any other Job
  shape in the cluster: the second line, for a worker that is not this one.

Both log, on the run, which job variables they did not apply. Prefect is imported here, not
in the CLI's other modules: `storage-migrator worker` alone loads this module.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

import anyio
import anyio.abc
from prefect.logging.loggers import flow_run_logger
from prefect.runner._flow_run_executor import FlowRunExecutorContext
from prefect.runner._starter_engine import EngineCommandStarter
from prefect.utilities.processutils import command_to_string
from prefect.workers.process import ProcessJobConfiguration, ProcessWorker, ProcessWorkerResult
from prefect_kubernetes.worker import KubernetesWorker, KubernetesWorkerJobConfiguration

from storage_migrator.operations.flow_run_jobs import IMAGE_PLACEHOLDER, RUN_ENVIRONMENT, RUNNER

if TYPE_CHECKING:
    from uuid import UUID

    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.objects import FlowRun, State, WorkPool
    from prefect.client.schemas.responses import DeploymentResponse
    from prefect.runner._process_manager import ProcessHandle

__all__ = [
    "JOB_SETTINGS",
    "InstallKubernetesWorker",
    "RunnerProcessWorker",
    "TemplateError",
    "install_template",
    "runner_argv",
]

#: The Prefect settings of the worker that a flow-run Job gets (issue 35): where the API is, and its
#: credentials (a secretKeyRef to the install's Secret, never the value: config.yaml). Prefect adds the
#: rest of operations/flow_run_jobs.py's RUN_ENVIRONMENT, which says why each.
JOB_SETTINGS: Final = ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING", "PREFECT_API_KEY")


class TemplateError(Exception):
    """The install's job template cannot be used; the message says what to fix."""


def runner_argv() -> list[str]:
    """The runner with this worker's own Python (its venv), wherever the worker was started from."""
    return [sys.executable, "-m", "flow_runner"]


def _container(template: dict[str, Any]) -> dict[str, Any]:
    try:
        containers = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"]
        return dict(containers[0])
    except (KeyError, IndexError, TypeError) as exc:
        raise TemplateError("the job template has no job_configuration.job_manifest.spec.template.spec."
                            "containers[0]: use deployments/work-pool/kubernetes.json") from exc  # fmt: skip


def install_template(path: Path, image: str | None) -> dict[str, Any]:
    """The install's job template (`path`) with the install's image (the ConfigMap's `image`, which kustomize
    sets from the worker's own image): what every Job of this worker is built from."""
    try:
        template: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TemplateError(f"cannot read the job template {path}: {exc}") from exc
    container = _container(template)
    if image:
        container["image"] = image
        template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0] = container
    elif str(container.get("image", IMAGE_PLACEHOLDER)) in (IMAGE_PLACEHOLDER, "") or "{{" in str(container["image"]):
        raise TemplateError(f"the job template {path} names no image: give --image (STORAGE_MIGRATOR_JOB_IMAGE, "
                            "the ConfigMap storage-migrator-work-pool's key image in the kustomize install)")  # fmt: skip
    if container.get("command") != [RUNNER]:
        raise TemplateError(f"the job template {path} does not start {RUNNER} (containers[0].command): "
                            "use deployments/work-pool/kubernetes.json")  # fmt: skip
    return template


def _ignored(flow_run: FlowRun, deployment: DeploymentResponse | None, how: str, *, same: dict[str, Any]) -> None:
    """Said on the run's log: which job variables were not applied (their names only: values may be secrets).
    `same`: values that ask for what the worker does anyway (prefect.yaml's `command`, the install's image)."""
    given = {**((deployment.job_variables or {}) if deployment else {}), **(flow_run.job_variables or {})}
    names = sorted(k for k, v in given.items() if k not in same or same[k] != v)
    if names:
        flow_run_logger(flow_run).warning(
            "storage-migrator worker applies no job variable (issue 35): %s not applied; %s", ", ".join(names), how
        )


class _NoHooks:
    """No crash or cancellation hook in the worker: Prefect's would load the flow through the API's pull
    steps here (load_flow_from_flow_run). Our flows define none (tests/unit/flow_runner)."""

    async def run_cancellation_hooks(self, flow_run: FlowRun, state: State[Any]) -> None:
        return None

    async def run_crashed_hooks(self, flow_run: FlowRun, state: State[Any]) -> None:
        return None


class RunnerJobConfiguration(ProcessJobConfiguration):
    """A run's process: the runner, in the worker's environment; nothing from the pool or the job variables."""

    @classmethod
    async def resolve_for_flow_run(
        cls, flow_run: FlowRun, *, client: PrefectClient, work_pool: WorkPool, worker_name: str,
        worker_id: UUID | None = None, deployment: DeploymentResponse | None = None,
    ) -> RunnerJobConfiguration:  # fmt: skip
        if deployment is None and flow_run.deployment_id:
            deployment = await client.read_deployment(flow_run.deployment_id)
        flow = await client.read_flow(flow_run.flow_id)
        _ignored(flow_run, deployment, "each run is storage-migrator-run, in this worker's own environment",
                 same={"command": RUNNER})  # fmt: skip
        configuration = cls(command=command_to_string(runner_argv()), stream_output=True)
        configuration.prepare_for_flow_run(flow_run=flow_run, deployment=deployment, flow=flow, work_pool=work_pool,
                                           worker_name=worker_name, worker_id=worker_id)  # fmt: skip
        return configuration


class RunnerProcessWorker(ProcessWorker):
    """`storage-migrator worker --pool POOL`: a process worker that starts only our runner."""

    job_configuration = RunnerJobConfiguration

    @classmethod
    def __dispatch_key__(cls) -> str:
        return "storage-migrator-process"  # Prefect's own `process` worker stays the pool type's

    async def run(
        self, flow_run: FlowRun, configuration: ProcessJobConfiguration,
        task_status: anyio.abc.TaskStatus[int] | None = None,
    ) -> ProcessWorkerResult:  # fmt: skip
        """Prefect 3.9's ProcessWorker.run for a configured command, without its hooks in the worker."""
        status = task_status if task_status is not None else anyio.TASK_STATUS_IGNORED
        execution = None
        with tempfile.TemporaryDirectory(suffix="prefect") as working_dir:
            async with FlowRunExecutorContext() as ctx:
                starter = EngineCommandStarter(command=configuration.command, cwd=Path(working_dir).resolve(),
                                               env=configuration.env, stream_output=configuration.stream_output,
                                               control_channel=ctx.control_channel)  # fmt: skip
                executor = ctx.create_executor(flow_run, starter, propose_submitting=False, hook_runner=_NoHooks())

                async def execute(*, task_status: anyio.abc.TaskStatus[ProcessHandle] = anyio.TASK_STATUS_IGNORED
                                  ) -> None:  # fmt: skip
                    nonlocal execution
                    execution = await executor.submit(task_status=task_status)

                async with anyio.create_task_group() as group:
                    handle = await group.start(execute)
                    if handle.pid is None:
                        raise RuntimeError("Flow run process has no PID")
                    status.started(handle.pid)
        if execution is None or execution.status_code is None:
            raise RuntimeError("Failed to start flow run process.")
        return ProcessWorkerResult(status_code=execution.status_code, identifier=str(execution.handle.pid))


class InstallJobConfiguration(KubernetesWorkerJobConfiguration):  # type: ignore[misc]
    """A Job of the install's template: of the worker's Prefect settings, only JOB_SETTINGS."""

    #: Set per worker (`InstallKubernetesWorker`): the install's template, image included.
    install_job_template: ClassVar[dict[str, Any]] = {}

    @classmethod
    def _base_environment(cls) -> dict[str, str]:
        return {k: v for k, v in super()._base_environment().items() if k in JOB_SETTINGS}

    @classmethod
    async def resolve_for_flow_run(
        cls, flow_run: FlowRun, *, client: PrefectClient, work_pool: WorkPool, worker_name: str,
        worker_id: UUID | None = None, deployment: DeploymentResponse | None = None,
    ) -> InstallJobConfiguration:  # fmt: skip
        if deployment is None and flow_run.deployment_id:
            deployment = await client.read_deployment(flow_run.deployment_id)
        flow = await client.read_flow(flow_run.flow_id)
        template = cls.install_template()
        _ignored(flow_run, deployment, "each Job is the install's template (deployments/work-pool/kubernetes.json)",
                 same={"command": RUNNER, "image": _container(template).get("image")})  # fmt: skip
        # The install's template and its own defaults: no value from the pool or the job variables.
        configuration: InstallJobConfiguration = await cls.from_template_and_values(template, {}, client=client)
        configuration.prepare_for_flow_run(flow_run=flow_run, deployment=deployment, flow=flow, work_pool=work_pool,
                                           worker_name=worker_name, worker_id=worker_id)  # fmt: skip
        # Whatever a later Prefect adds, the Job carries only what the admission policy lets through.
        container = configuration.job_manifest["spec"]["template"]["spec"]["containers"][0]
        container["env"] = [e for e in container.get("env") or [] if e.get("name") in RUN_ENVIRONMENT]
        return configuration

    @classmethod
    def install_template(cls) -> dict[str, Any]:
        copy: dict[str, Any] = json.loads(json.dumps(cls.install_job_template))  # Prefect changes what it is given
        return copy


class InstallKubernetesWorker(KubernetesWorker):  # type: ignore[misc]
    """`storage-migrator worker --type kubernetes`: every Job from the install's template (`template`)."""

    @classmethod
    def __dispatch_key__(cls) -> str:
        return "storage-migrator-kubernetes"

    def __init__(self, *args: Any, template: dict[str, Any], **kwargs: Any) -> None:
        # A pool this worker creates shows the install's template; an existing pool's is never used.
        super().__init__(*args, base_job_template=template, **kwargs)
        self.job_configuration = type("InstallJobConfigurationOf", (InstallJobConfiguration,),
                                      {"install_job_template": template})  # fmt: skip
