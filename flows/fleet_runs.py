"""One flow for several clusters, side by side (issue 20, item 4: fleet-wide operations).

Each cluster gets a flow run of its own, at most `limit` at once, judged by its own
final state: a cluster that fails, or cannot even be reached, never blocks or
decides another's verdict.

Issue 30: a named cluster's part is a run of that cluster's own deployment
(`flow/<cluster>`, `storage-migrator fleet add`), so that it runs where the cluster's
credentials are: in pull mode on the cluster's own pool, by its own worker, since
no single process can reach two clusters. Those deployments' concurrency limits are
their own, so the parent (on the templates' deployment) never holds a child's slot.
The environment's cluster, and a named cluster with no deployments of its own (push
mode through its block), run as subflows in this process, as before: a child on the
templates' deployment would wait for the slot its own parent holds.
"""

from __future__ import annotations

import contextvars
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from prefect import Flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun, State
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound

from storage_migrator.fleet.names import block_of, cluster_name, deployment_name
from storage_migrator.fleet.verdicts import ClusterOutcome

__all__ = ["run_per_cluster"]


def _own_deployment(flow: Flow[..., Any], cluster: str) -> str | None:
    """`flow/<cluster>` when the cluster has it; None for the environment's cluster, or none deployed."""
    block = block_of(cluster)
    if block is None:
        return None
    name = deployment_name(flow.name, block)
    try:
        with get_client(sync_client=True) as client:
            client.read_deployment_by_name(name)
    except ObjectNotFound:
        return None
    return name


def _run(flow: Flow[..., Any], cluster: str, parameters: dict[str, Any]) -> State[Any]:
    deployment = _own_deployment(flow, cluster)
    if deployment is None:
        return cast(State[Any], flow(cluster=cluster, return_state=True, **parameters))
    run = cast(FlowRun, run_deployment(deployment, parameters={**parameters, "cluster": cluster}, timeout=None,
                                       as_subflow=True))  # fmt: skip
    if run.state is None:
        raise RuntimeError(f"{deployment}: flow run {run.id} has no state")
    return run.state


def _one(flow: Flow[..., Any], cluster: str, parameters: dict[str, Any]) -> ClusterOutcome:
    """One cluster's run, to its end; any error is that cluster's verdict, never the others'."""
    try:
        state = _run(flow, cluster, parameters)
    except Exception as exc:  # noqa: BLE001 - one cluster's failure is its own verdict
        get_run_logger().error("cluster %s: %s: %s", cluster, type(exc).__name__, exc)
        return ClusterOutcome(cluster=cluster, state="Failed", message=f"{type(exc).__name__}: {exc}")
    run = state.state_details.flow_run_id
    return ClusterOutcome(cluster=cluster, state=str(state.name), message=state.message or "",
                          flow_run=str(run) if run else None)  # fmt: skip


def run_per_cluster(flow: Flow[..., Any], clusters: list[str], parameters: dict[str, Any], *,
                    limit: int) -> list[ClusterOutcome]:  # fmt: skip
    """`flow(cluster=c, **parameters)` for each cluster (once each), `limit` at once; the outcomes in order."""
    names = list(dict.fromkeys(cluster_name(c or None) for c in clusters))
    with ThreadPoolExecutor(max_workers=max(1, min(limit, len(names))), thread_name_prefix="cluster") as pool:
        futures = [pool.submit(contextvars.copy_context().run, _one, flow, c, parameters) for c in names]
        return [f.result() for f in futures]
