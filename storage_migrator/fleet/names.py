"""What is scoped by cluster, and its name (issue 20: "everything scoped by cluster").

The cluster of the environment keeps today's names, so a single-cluster install
upgrades without renaming its history; a named cluster says its name in run tags
and in the Variable recording its identity. The write budget needs no name: it is
counted by Leases in each cluster (issue 37), so two clusters never share one.
"""

from __future__ import annotations

import re

__all__ = [
    "DEFAULT_CLUSTER",
    "block_of",
    "cluster_name",
    "cluster_tag",
    "deployment_name",
    "identity_variable",
    "scoped_key",
]

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
