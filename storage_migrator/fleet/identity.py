"""A cluster's identity: the UID of its kube-system namespace (issue 20).

Design decision: the identity must change when the cluster does, whatever the
kubeconfig says (a server URL is reused behind a load balancer, a context
renamed); every cluster has a ``kube-system`` namespace from its first start,
and its UID is as old as the cluster. It is read with a metadata-only LIST
narrowed by a field selector (kube-apiserver then authorizes it as a LIST of
that one name): the shipped role's `list` on every resource allows it, the
narrow role of `storage-migrator rbac` grants it, and no `get` is needed.
"""

from __future__ import annotations

from enum import StrEnum

from kubernetes.client import ApiClient
from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.fleet.names import identity_variable
from storage_migrator.kube.errors import NotFound
from storage_migrator.kube.listing import list_page
from storage_migrator.kube.resources import ResourceRef

__all__ = [
    "ClusterIdentity",
    "IdentityChanged",
    "IdentityVerdict",
    "WrongCluster",
    "judge_identity",
    "judge_worker",
    "read_cluster_uid",
]

_NAMESPACES = ResourceRef(version="v1", resource="namespaces")


class ClusterIdentity(BaseModel):
    """Which cluster a run talked to."""

    model_config = ConfigDict(frozen=True)

    cluster: str = Field(min_length=1, description="The block's name, or 'default'.")
    uid: str = Field(min_length=1, description="metadata.uid of the cluster's kube-system namespace.")


class IdentityVerdict(StrEnum):
    FIRST_SEEN = "first-seen"  # nothing recorded: record it
    SAME = "same"
    CHANGED = "changed"  # fail before any write


class IdentityChanged(Exception):
    """The cluster a name points at is not the one recorded under that name."""


class WrongCluster(Exception):
    """Pull mode: a flow run for one cluster reached the worker of another (issue 30)."""


def judge_worker(run_for: str, *, worker: str) -> str | None:
    """Pull mode (issue 30): a worker's credentials reach its own cluster only, so a run for
    another must stop before it reads or writes anything. None: the run is for the worker's
    cluster; else what to say (naming both)."""
    if run_for == worker:
        return None
    return (
        f"this flow run is for cluster {run_for!r}, and the worker that took it serves cluster {worker!r} "
        f"(STORAGE_MIGRATOR_CLUSTER={worker}): its credentials reach {worker!r} only. Nothing was read or "
        f"written. Run it on {run_for!r}'s own deployments (flow/{run_for}, on the work pool that "
        f"`storage-migrator fleet add {run_for} --pool POOL` gave it), and start {worker!r}'s worker on "
        f"{worker!r}'s pool only"
    )


def judge_identity(cluster: str, *, recorded: str | None, observed: str) -> tuple[IdentityVerdict, str]:
    """The verdict and what to say about it (the message names both identities when they differ)."""
    if recorded is None:
        return IdentityVerdict.FIRST_SEEN, f"cluster {cluster!r} is kube-system uid {observed}: recorded"
    if recorded == observed:
        return IdentityVerdict.SAME, f"cluster {cluster!r} is kube-system uid {observed}, as recorded"
    return IdentityVerdict.CHANGED, (
        f"cluster {cluster!r} was kube-system uid {recorded} and now answers as kube-system uid {observed}: "
        "its credentials point at another cluster (or it was reinstalled). Nothing was written. Point the "
        f"credentials back at the cluster it names (its block; in pull mode, the worker started with "
        f"STORAGE_MIGRATOR_CLUSTER={cluster}), or, if the cluster was reinstalled on purpose, delete the "
        f"recorded identity (prefect variable delete {identity_variable(cluster)}) and run again"
    )


def read_cluster_uid(api: ApiClient, *, timeout: float) -> str:
    """metadata.uid of kube-system; NotFound when the cluster has none (not a Kubernetes cluster we know)."""
    page = list_page(api, _NAMESPACES, limit=1, field_selector="metadata.name=kube-system", timeout=timeout)
    uids = [str(item["metadata"]["uid"]) for item in page.items if item.get("metadata", {}).get("uid")]
    if not uids:
        raise NotFound(code=404, reason="NotFound", message='namespaces "kube-system" not found',
                       what="the cluster's identity (the uid of namespace kube-system)")  # fmt: skip
    return uids[0]
