"""Which cluster a flow run is for, said once at its start (issue 20).

Every flow takes `cluster`, the name of a KubernetesClusterConfig block (left
out: the environment's cluster, `default`). `entered_cluster` is the first thing
each run does: it checks the cluster is the one recorded under that name
(before anything is written), tags the run `cluster:<name>`, and makes every
event the run emits carry the cluster (flows/events.py). `run_for_cluster`
starts a child flow run on the cluster's own deployment (`flow/<cluster>`,
created by `storage-migrator fleet add`), so that each cluster has its own
dispatcher slot and detection schedule; a cluster without its own deployments
runs on the default ones, with its name as a parameter.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.runtime import flow_run

from flows.events import CLUSTER
from storage_migrator.fleet.identity import ClusterIdentity
from storage_migrator.fleet.names import block_of, cluster_name, cluster_tag, deployment_name
from storage_migrator.settings import Settings
from tasks.cluster_identity import check_cluster_identity

__all__ = ["cluster_settings", "entered_cluster", "run_for_cluster"]


def cluster_settings(cluster: str | None, **overrides: Any) -> Settings:
    """The settings of a run for `cluster` (its block), with the flow's other overrides.

    A named cluster's block is its credentials, whatever the worker's environment says: one
    worker serves the fleet, its own STORAGE_MIGRATOR_KUBECONFIG (or pod) being its default cluster."""
    block = block_of(cluster)
    if block is None:
        return Settings.with_overrides(**overrides)
    given = [k for k in ("kubeconfig", "context") if overrides.get(k) is not None]
    if given:
        raise ValueError(f"cluster {block!r} names its credentials (its KubernetesClusterConfig block): leave out "
                         f"{' and '.join(given)}, or leave out cluster")  # fmt: skip
    # Validated without the block (the environment's credentials may be set), then the block replaces them.
    return Settings.with_overrides(**overrides).model_copy(
        update={"cluster_config_block": block, "kubeconfig": None, "in_cluster": None, "context": None}
    )


def _tag_run(tag: str) -> None:
    run_id = flow_run.id
    if run_id is None:
        return
    try:
        with get_client(sync_client=True) as client:
            current = client.read_flow_run(run_id)
            if tag not in (current.tags or []):
                client.update_flow_run(run_id, tags=sorted({*(current.tags or []), tag}))
    except Exception as exc:  # noqa: BLE001 - a tag is not worth failing a run
        get_run_logger().warning("could not tag the flow run %s: %s", tag, exc)


@contextmanager
def entered_cluster(settings: Settings) -> Iterator[ClusterIdentity | None]:
    """Around a flow's body: the cluster checked (IdentityChanged fails the run here, before any
    write), the run tagged, and the run's events labelled with the cluster."""
    name = cluster_name(settings.cluster_config_block)
    token = CLUSTER.set(name)
    try:
        identity = check_cluster_identity(settings)
        _tag_run(cluster_tag(name))
        yield identity
    finally:
        CLUSTER.reset(token)


def run_for_cluster(flow: str, cluster: str | None, parameters: dict[str, Any], *, timeout: float | None,
                    as_subflow: bool) -> FlowRun:  # fmt: skip
    """A run of `flow` for `cluster`: on `flow/<cluster>` if it is deployed, else on `flow/flow`."""
    block = block_of(cluster)
    wanted = {**parameters, **({"cluster": block} if block is not None else {})}
    name = deployment_name(flow, block)
    try:
        return cast(FlowRun, run_deployment(name, parameters=wanted, timeout=timeout, as_subflow=as_subflow))
    except ObjectNotFound:
        if block is None:
            raise
    get_run_logger().warning(
        "no deployment %s: running %s with cluster=%s instead, which shares its concurrency limit with the "
        "default cluster's; `storage-migrator fleet add %s` gives the cluster its own", name,
        deployment_name(flow, None), block, block,
    )  # fmt: skip
    return cast(FlowRun, run_deployment(deployment_name(flow, None), parameters=wanted, timeout=timeout,
                                        as_subflow=as_subflow))  # fmt: skip
