"""What is scoped by cluster, and its name (issue 20: "everything scoped by cluster").

The cluster of the environment keeps today's names, so a single-cluster install
upgrades without renaming its budget or its history; a named cluster gets its
own budget (two clusters migrating at once each get their whole budget) and
says its name in run tags and in the Variable recording its identity.
"""

from __future__ import annotations

import re

__all__ = [
    "DEFAULT_CLUSTER",
    "block_of",
    "budget_limit_name",
    "cluster_name",
    "cluster_tag",
    "deployment_name",
    "identity_variable",
    "scoped_key",
    "writers_limit_name",
]

#: The name of the cluster of the environment (no block named).
DEFAULT_CLUSTER = "default"
#: A block's name, as Prefect allows it: also valid in variable names and artifact keys.
_BLOCK_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


#: A budget's companion limit, which counts the writers sharing it (tasks/write_budget.py).
_WRITERS = "writers"


def _slug(cluster: str) -> str:
    """The name itself, never a mapping of it: two clusters must never share a budget or a record."""
    if not _BLOCK_NAME.match(cluster):
        raise ValueError(
            f"cluster {cluster!r} is not a KubernetesClusterConfig block name: lowercase letters, digits and "
            "dashes, as Prefect names blocks"
        )
    if cluster == _WRITERS or cluster.endswith(f"-{_WRITERS}"):
        # Its budget `<base>-x-writers` would be the writers' counter of cluster `x` (or of the default's).
        raise ValueError(
            f"cluster {cluster!r}: a cluster's name may not end in {_WRITERS!r}, which names another cluster's "
            "count of writers; give the KubernetesClusterConfig block another name"
        )
    return cluster


def block_of(cluster: str | None) -> str | None:
    """The block a `cluster` parameter names: None for the environment's cluster (left out, or `default`)."""
    return None if cluster in (None, "", DEFAULT_CLUSTER) else _slug(cluster)


def cluster_name(block: str | None) -> str:
    """What a cluster is called in tags, events, the ledger and the CLI: its block's name, or `default`."""
    return DEFAULT_CLUSTER if block is None else block


def scoped_key(key: str, cluster: str | None) -> str:
    """An artifact key of one cluster: `key` itself for the default cluster (a single-cluster install
    keeps its keys), `cluster-<name>-<key>` for a named one (none of ours starts with `cluster-`);
    Prefect keys: lowercase letters, digits and dashes, at most 100 characters."""
    block = block_of(cluster)
    whole = key if block is None else f"cluster-{block}-{key}"
    return re.sub(r"[^a-z0-9-]+", "-", whole.lower()).strip("-")[:100]


def budget_limit_name(base: str, cluster: str | None) -> str:
    """The global concurrency limit of a cluster's writes: `base` for the default cluster."""
    block = block_of(cluster)
    return base if block is None else f"{base}-{block}"


def writers_limit_name(budget: str) -> str:
    """The limit counting the writers of `budget` (`_slug` keeps it from being another cluster's budget)."""
    return f"{budget}-{_WRITERS}"


def cluster_tag(cluster: str | None) -> str:
    """The run tag that says which cluster a run was for."""
    return f"cluster:{cluster_name(block_of(cluster))}"


def identity_variable(cluster: str) -> str:
    """The Prefect Variable recording a cluster's identity (the uid of kube-system)."""
    return f"storage-migrator-cluster-{_slug(cluster)}"


def deployment_name(flow: str, cluster: str | None) -> str:
    """`flow/flow` for the default cluster (prefect.yaml's), `flow/<cluster>` for a named one."""
    block = block_of(cluster)
    return f"{flow}/{flow}" if block is None else f"{flow}/{block}"
