"""What the e2e tests ask of the tier's one stack (tests/e2e/conftest.py): its state on the
server, read through the Prefect client (a CLI process costs seconds of CPU)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from devstack import PrefectStack

#: The queue the stack's own worker reads: prefect.yaml's, where every deployment is.
STACK_QUEUE = "default"
DETECTION = "detect-storage-changes/detect-storage-changes"


def paused_detection(stack: PrefectStack) -> None:
    """The detection schedule paused (its auto-scheduled runs deleted with it)."""
    with stack.client() as client:
        client.pause_deployment(client.read_deployment_by_name(DETECTION).id)


def runs_under_way(stack: PrefectStack) -> list[str]:
    """Flow runs of the server that are due and not yet at an end (a schedule's later runs are not due)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType

    busy = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.CANCELLING]
    with stack.client() as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
            type=FlowRunFilterStateType(any_=busy))))  # fmt: skip
    now = datetime.now(UTC)
    return [r.name for r in runs if not (r.state_type == StateType.SCHEDULED and r.expected_start_time
                                         and r.expected_start_time > now)]  # fmt: skip


def flow_runs(stack: PrefectStack, *, limit: int = 200) -> list[Any]:
    """The server's latest flow runs, newest first."""
    from prefect.client.schemas.sorting import FlowRunSort

    with stack.client() as client:
        return list(client.read_flow_runs(limit=limit, sort=FlowRunSort.EXPECTED_START_TIME_DESC))
