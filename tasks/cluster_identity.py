"""The task that says which cluster a run talks to, before it writes anything (issue 20).

The identity (the uid of kube-system, storage_migrator.fleet.identity) is
recorded the first time a cluster name is used, in the Prefect Variable
`storage-migrator-cluster-<name>`, and compared at the start of every later run:
a block whose kubeconfig now points at another cluster fails the run there.
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
from storage_migrator.settings import Settings
from tasks.common import PRIVATE, REQUEST_RETRIES, connected

__all__ = ["check_cluster_identity"]


@task(name="check-cluster-identity", **REQUEST_RETRIES, **PRIVATE)
def check_cluster_identity(settings: Settings) -> ClusterIdentity:
    """Raises IdentityChanged (not retried) when the cluster is not the one recorded under its name."""
    cluster = settings.cluster_config_block or DEFAULT_CLUSTER
    with connected(settings) as api:
        observed = read_cluster_uid(api, timeout=settings.request_timeout_seconds)
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
