"""Which cluster a flow run is for, said once at its start (issue 20).

Every flow takes `cluster`, a cluster's name (left out: the environment's
cluster, `default`): in push mode the name of its KubernetesClusterConfig block;
in pull mode (issue 30) the cluster a worker of its own serves, with its own
credentials (STORAGE_MIGRATOR_CLUSTER). `entered_cluster` is the first thing
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
from storage_migrator.fleet.identity import ClusterIdentity, WrongCluster, judge_worker
from storage_migrator.fleet.names import block_of, cluster_name, cluster_tag, deployment_name
from storage_migrator.migration.engines import engine_parameter_refusal
from storage_migrator.settings import Settings
from tasks.cluster_identity import check_cluster_identity

__all__ = ["cluster_settings", "entered_cluster", "run_for_cluster"]


def cluster_settings(cluster: str | None, **overrides: Any) -> Settings:
    """The settings of a run for `cluster`, with the flow's other overrides.

    Pull mode (issue 30): a worker whose environment names its own cluster
    (STORAGE_MIGRATOR_CLUSTER) runs with its own credentials, for that cluster only: a run
    for another fails here, before anything is read or written (`WrongCluster`, naming
    both). Push mode: a named cluster's block is its credentials, whatever the worker's
    environment says (its own STORAGE_MIGRATOR_KUBECONFIG, or pod, being its default cluster).
    `engine` (issue 36): in pull mode the install's (its ConfigMap), which a run may repeat but not
    change; in push mode the run's parameter (the cluster's deployment's) chooses."""
    asked = overrides.pop("engine", None)  # issue 36: in pull mode the install's, never the API's
    base = Settings.with_overrides(**overrides)
    wanted = block_of(cluster)
    given = [k for k in ("kubeconfig", "context") if overrides.get(k) is not None]
    if base.cluster is not None and base.cluster_config_block is None:  # not a block's name: its own cluster
        problem = judge_worker(cluster_name(wanted), worker=base.cluster)
        if problem is not None:
            raise WrongCluster(problem)
        if given:
            raise ValueError(f"this worker reaches cluster {base.cluster!r} with its own credentials (pull mode): "
                             f"leave out {' and '.join(given)}")  # fmt: skip
        refused = engine_parameter_refusal(asked, install=base.engine, pull_mode=base.cluster)
        if refused is not None:
            raise ValueError(refused)
        return base
    if asked is not None:
        base = base.model_copy(update={"engine": Settings.with_overrides(**overrides, engine=asked).engine})
    if wanted is None:
        return base
    if given:
        raise ValueError(f"cluster {wanted!r} names its credentials (its KubernetesClusterConfig block): leave out "
                         f"{' and '.join(given)}, or leave out cluster")  # fmt: skip
    # Validated without the block (the environment's credentials may be set), then the block replaces them.
    return base.model_copy(update={"cluster_config_block": wanted, "cluster": wanted, "kubeconfig": None,
                                   "in_cluster": None, "context": None})  # fmt: skip


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
    name = cluster_name(settings.cluster)
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
