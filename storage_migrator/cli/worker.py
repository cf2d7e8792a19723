"""``storage-migrator worker --pool POOL``: a Prefect worker that starts only our runner (issue 35).

"Prefect orders, shows and records; the cluster decides": whoever holds the Prefect API may
ask for a run of our deployments, never for what that run executes. `prefect worker start`
builds each run from the pool's template and the job variables, which the API can rewrite;
this worker takes only the flow run from the API and starts `storage-migrator-run` (the
runner, which runs only the install's flows) as the install says (cli/workers.py). It checks
the Prefect API first, as `check-prefect` does, so a missing auth string is one line.
"""

from __future__ import annotations

import asyncio
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from storage_migrator.cli import check_prefect

__all__ = ["command"]


class WorkerType(StrEnum):
    process = "process"
    kubernetes = "kubernetes"


Pool = Annotated[str, typer.Option("--pool", "-p", help="the work pool to serve (created if it does not exist)")]
Type = Annotated[WorkerType, typer.Option("--type", help="process: runs on this machine; kubernetes: Jobs in the cluster the worker's pod is in")]  # fmt: skip
Name = Annotated[str | None, typer.Option("--name", "-n", help="the worker's name in Prefect")]
Limit = Annotated[int | None, typer.Option(help="flow runs at once (default: no limit)")]
Queues = Annotated[list[str] | None, typer.Option("--work-queue", "-q", help="only this queue of the pool (repeat for more; default: every queue)")]  # fmt: skip
RunOnce = Annotated[bool, typer.Option("--run-once", help="poll once, run what is due, then stop")]
Healthcheck = Annotated[bool, typer.Option("--with-healthcheck", help="serve /health (PREFECT_WORKER_WEBSERVER_HOST/PORT)")]  # fmt: skip
Template = Annotated[Path | None, typer.Option("--base-job-template", metavar="FILE", help="kubernetes: the install's job template (deployments/work-pool/kubernetes.json)")]  # fmt: skip
Image = Annotated[str | None, typer.Option(envvar="STORAGE_MIGRATOR_JOB_IMAGE", help="kubernetes: the Jobs' image (the kustomize install sets it from the worker's own)")]  # fmt: skip


def command(
    pool: Pool,
    worker_type: Type = WorkerType.process,
    name: Name = None,
    limit: Limit = None,
    work_queue: Queues = None,
    run_once: RunOnce = False,
    with_healthcheck: Healthcheck = False,
    base_job_template: Template = None,
    image: Image = None,
) -> None:
    """Serve POOL with a Prefect worker that starts only storage-migrator-run, whatever the pool's template or the job variables say.

    process: each flow run is storage-migrator-run in this worker's environment (STORAGE_MIGRATOR_CLUSTER, STORAGE_MIGRATOR_KUBECONFIG: pull mode off-cluster). kubernetes: each flow run is a Job built from --base-job-template with --image, in the worker's pod's cluster. The runner runs a flow only if the deployment is one of this install's (docs/operator-guide.md, "What the Prefect API can and cannot make a cluster run"). Checks the Prefect API first. Exit codes: 0 stopped; 1 the Prefect API refused or the job template is unusable; 2 a usage error.
    """
    if worker_type is WorkerType.kubernetes and base_job_template is None:
        raise typer.BadParameter("a kubernetes worker builds its Jobs from the install's template: give "
                                 "--base-job-template FILE", param_hint="--base-job-template")  # fmt: skip
    check_prefect.command()
    from prefect.utilities.processutils import setup_signal_handlers_worker

    from storage_migrator.cli import workers

    queues = work_queue or None
    worker: workers.RunnerProcessWorker | workers.InstallKubernetesWorker
    if worker_type is WorkerType.kubernetes:
        assert base_job_template is not None
        try:
            template = workers.install_template(base_job_template, image)
        except workers.TemplateError as exc:
            print(f"storage-migrator: {exc}", file=sys.stderr)
            raise typer.Exit(1) from exc
        worker = workers.InstallKubernetesWorker(template=template, work_pool_name=pool, work_queues=queues,
                                                 name=name, limit=limit)  # fmt: skip
    else:
        worker = workers.RunnerProcessWorker(work_pool_name=pool, work_queues=queues, name=name, limit=limit)
    setup_signal_handlers_worker(os.getpid(), f"the {worker_type.value} worker", print)
    try:
        asyncio.run(worker.start(run_once=run_once, with_healthcheck=with_healthcheck, printer=print))
    except KeyboardInterrupt:  # the first SIGTERM or SIGINT (Prefect's handler): stop polling, as `prefect worker`
        print(f"Worker {worker.name!r} stopped!", flush=True)
