"""The console script `storage-migrator-run [FLOW_RUN_ID]` (issue 35).

It does what `python -m prefect.engine` does (Prefect 3.9's engine.py: the runner's control
channel, the engine's signal handling, the flow run's logger, `run_flow`), with one
difference: the flow is the install's, taken from `flow_runner.shipped`, and only once
`storage_migrator.fleet.run_admission.refusal` finds nothing wrong with what the API asks.
A refused run is marked Failed with that one line, and the process ends 0: the outcome is
recorded, and the worker does not report it Crashed on top. The flow run id is the
argument, else PREFECT__FLOW_RUN_ID (which every worker sets).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any
from uuid import UUID

from storage_migrator.fleet.run_admission import RunAsked, one_line, refusal

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.objects import FlowRun

__all__ = ["main"]

PROG = "storage-migrator-run"


def asked_of(client: SyncPrefectClient, flow_run: FlowRun) -> RunAsked:
    """What the API says the run is: its deployment's entrypoint, pull steps and storage, its parameters."""
    if flow_run.deployment_id is None:
        return RunAsked(deployment=None, parameters=dict(flow_run.parameters or {}))
    deployment = client.read_deployment(flow_run.deployment_id)
    flow = client.read_flow(deployment.flow_id)
    return RunAsked(
        deployment=f"{flow.name}/{deployment.name}", entrypoint=deployment.entrypoint,
        pull_steps=deployment.pull_steps, storage_block=deployment.storage_document_id is not None,
        parameters=dict(flow_run.parameters or {}),
    )  # fmt: skip


def _refuse(client: SyncPrefectClient, flow_run: FlowRun, message: str, logger: Any) -> int:
    """The run marked Failed with `message` (its one line in the UI), and said in its log."""
    from prefect.states import Failed
    from prefect.utilities.engine import propose_state_sync

    logger.error(message)
    try:
        state = propose_state_sync(client, Failed(message=message), flow_run_id=flow_run.id)
    except Exception as exc:  # noqa: BLE001 - the refusal stands; only its record failed
        print(f"{PROG}: {message} (and the flow run could not be marked Failed: {one_line(str(exc))})",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"{PROG}: {message}", file=sys.stderr)
    return 0 if state.is_final() else 1


def _run(flow_run_id: UUID) -> int:
    from prefect._internal.metrics import RunMetrics
    from prefect.client.orchestration import get_client
    from prefect.engine import _drive_run_flow_result
    from prefect.flow_engine import load_flow_run, run_flow
    from prefect.logging.loggers import flow_run_logger

    from flow_runner import shipped

    flow_run = load_flow_run(flow_run_id=flow_run_id)
    run_logger = flow_run_logger(flow_run=flow_run)
    with get_client(sync_client=True) as client:
        asked = asked_of(client, flow_run)
        try:
            install = shipped.install()
        except shipped.InstallUnreadable as exc:
            return _refuse(client, flow_run, one_line(f"refused by {PROG} (issue 35): {exc}"), run_logger)
        problem = refusal(asked, install, check_parameters=shipped.parameter_problem)
        if problem is not None:
            return _refuse(client, flow_run, problem, run_logger)
    assert asked.entrypoint is not None  # refusal() said so
    # The only "pull step" run: into the install's own directory, whatever the deployment recorded.
    os.chdir(install.directory)
    flow = shipped.load(asked.entrypoint)
    with RunMetrics(flow_run, flow):
        result: object = run_flow(flow, flow_run=flow_run, error_logger=run_logger)  # type: ignore[arg-type]
        _drive_run_flow_result(flow, result)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The console script: run the flow run (the argument, else PREFECT__FLOW_RUN_ID), or refuse it."""
    args = sys.argv[1:] if argv is None else argv
    raw = args[0] if args else os.environ.get("PREFECT__FLOW_RUN_ID", "")
    try:
        flow_run_id = UUID(raw)
    except ValueError:
        print(f"{PROG}: no flow run to run: give its id as the argument, or set PREFECT__FLOW_RUN_ID (a worker does)",
              file=sys.stderr)  # fmt: skip
        return 2
    from prefect._internal.control_listener import configure_from_env
    from prefect.engine import handle_engine_signals

    # As Prefect's engine: take the worker's control channel (cancellation) before any flow code loads.
    configure_from_env()
    with handle_engine_signals(flow_run_id):
        return _run(flow_run_id)
    return 1  # handle_engine_signals exits itself on an exception: not reached
