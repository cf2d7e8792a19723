"""What is scoped by cluster, and its name (issue 20: "everything scoped by cluster").

The cluster of the environment keeps today's names, so a single-cluster install
upgrades without renaming its budget or its history; a named cluster gets its
own budget (two clusters migrating at once each get their whole budget) and
says its name in run tags and in the Variable recording its identity.
"""

from __future__ import annotations

import re

__all__ = ["DEFAULT_CLUSTER", "budget_limit_name", "cluster_tag", "deployment_name", "identity_variable"]

#: The name of the cluster of the environment (no block named).
DEFAULT_CLUSTER = "default"
#: A block's name, as Prefect allows it: also valid in variable names and artifact keys.
_BLOCK_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def _slug(cluster: str) -> str:
    """The name itself, never a mapping of it: two clusters must never share a budget or a record."""
    if not _BLOCK_NAME.match(cluster):
        raise ValueError(
            f"cluster {cluster!r} is not a KubernetesClusterConfig block name: lowercase letters, digits and "
            "dashes, as Prefect names blocks"
        )
    return cluster


def budget_limit_name(base: str, cluster: str | None) -> str:
    """The global concurrency limit of a cluster's writes: `base` for the default cluster."""
    return base if cluster in (None, DEFAULT_CLUSTER) else f"{base}-{_slug(cluster)}"


def cluster_tag(cluster: str | None) -> str:
    """The run tag that says which cluster a run was for."""
    return f"cluster:{cluster or DEFAULT_CLUSTER}"


def identity_variable(cluster: str) -> str:
    """The Prefect Variable recording a cluster's identity (the uid of kube-system)."""
    return f"storage-migrator-cluster-{_slug(cluster)}"


def deployment_name(flow: str, cluster: str | None) -> str:
    """`flow/flow` for the default cluster (prefect.yaml's), `flow/<cluster>` for a named one."""
    return f"{flow}/{flow}" if cluster in (None, DEFAULT_CLUSTER) else f"{flow}/{_slug(cluster)}"
