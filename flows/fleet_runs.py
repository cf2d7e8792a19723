"""One flow for several clusters, side by side (issue 20, item 4: fleet-wide operations).

Each cluster gets a subflow run of its own, at most `limit` at once, judged by
its own final state: a cluster that fails, or cannot even be reached, never
blocks or decides another's verdict.

Design decision: subflows in this process, not runs of each cluster's
deployment. A deployment with a concurrency limit of one (rotate-encryption-key's)
would cancel the default cluster's child while its parent holds the slot; and
the work is not here anyway: each child starts its cluster's migrations as runs
of that cluster's migrate-resource deployment (a subflow of a deployed run is
itself "deployed", Prefect's deployment context being inherited).
"""

from __future__ import annotations

import contextvars
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from prefect import Flow, get_run_logger
from prefect.client.schemas.objects import State

from storage_migrator.fleet.names import cluster_name
from storage_migrator.fleet.verdicts import ClusterOutcome

__all__ = ["run_per_cluster"]


def _one(flow: Flow[..., Any], cluster: str, parameters: dict[str, Any]) -> ClusterOutcome:
    """One cluster's run, to its end; any error is that cluster's verdict, never the others'."""
    try:
        state = cast(State[Any], flow(cluster=cluster, return_state=True, **parameters))
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
