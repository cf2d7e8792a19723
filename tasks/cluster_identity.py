"""The task that says which cluster a run talks to, before it writes anything (issue 20).

The identity (the uid of kube-system, storage_migrator.fleet.identity) of a
named cluster (a KubernetesClusterConfig block) is recorded the first time the
name is used, in the Prefect Variable `storage-migrator-cluster-<name>`, and
compared at the start of every later run: a block whose kubeconfig now points
at another cluster fails the run there.
"""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.variables import Variable

from storage_migrator.fleet.identity import (
    ClusterIdentity,
    IdentityChanged,
    IdentityVerdict,
    judge_identity,
    read_cluster_uid,
)
from storage_migrator.fleet.names import DEFAULT_CLUSTER, identity_variable
from storage_migrator.kube.errors import KubeError
from storage_migrator.settings import Settings
from tasks.common import PRIVATE, REQUEST_RETRIES, connected

__all__ = ["check_cluster_identity"]


@task(name="check-cluster-identity", **REQUEST_RETRIES, **PRIVATE)
def check_cluster_identity(settings: Settings) -> ClusterIdentity | None:
    """Raises IdentityChanged (not retried) when a named cluster is not the one recorded under its name.

    The environment's cluster (no block named) is read and logged, never judged: each worker's
    kubeconfig or pod may be another cluster's, as before there were names (one Prefect server
    for several in-cluster installs); a role that cannot list namespaces only loses the log line."""
    cluster = settings.cluster
    try:
        with connected(settings) as api:
            observed = read_cluster_uid(api, timeout=settings.request_timeout_seconds)
    except KubeError as exc:
        if cluster is not None:
            raise  # a named cluster must prove it is the one recorded
        get_run_logger().warning("the environment's cluster: its identity could not be read (%s)", exc)
        return None
    if cluster is None:
        get_run_logger().info("the environment's cluster is kube-system uid %s", observed)
        return ClusterIdentity(cluster=DEFAULT_CLUSTER, uid=observed)
    variable = identity_variable(cluster)
    saved = Variable.get(variable)
    recorded = str(saved["uid"]) if isinstance(saved, dict) and "uid" in saved else None
    verdict, message = judge_identity(cluster, recorded=recorded, observed=observed)
    if verdict is IdentityVerdict.CHANGED:
        raise IdentityChanged(message)
    if verdict is IdentityVerdict.FIRST_SEEN:
        Variable.set(variable, {"uid": observed}, overwrite=False)
    get_run_logger().info(message)
    return ClusterIdentity(cluster=cluster, uid=observed)
