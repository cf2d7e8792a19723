"""The settings of the connection: where the cluster is, how to talk to it (DESIGN 4.1 and 5)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


class ConnectionSettings(BaseModel):
    """Where the cluster is and how to talk to it."""

    kubeconfig: Path | None = Field(
        default=None,
        description=(
            "Path of the kubeconfig file. Default: none, which means KUBECONFIG or "
            "~/.kube/config, or the in-cluster service account when running in a pod."
        ),
    )
    context: str | None = Field(
        default=None,
        description="kubeconfig context to use. Default: the file's current-context.",
    )
    in_cluster: bool | None = Field(
        default=None,
        description=(
            "Use the pod's service account (true) or a kubeconfig (false). Default: "
            "auto, i.e. in-cluster when KUBERNETES_SERVICE_HOST is set and no "
            "kubeconfig path is given."
        ),
    )
    cluster_config_block: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Name of a Prefect KubernetesClusterConfig block (prefect-kubernetes) whose "
            "kubeconfig and context the flows use instead of kubeconfig or in_cluster. "
            "Default: none. The block holds its credentials in clear in the Prefect "
            "database: prefer the pod's service account (DESIGN 4.1, PREFECT.md)."
        ),
    )
    cluster: str | None = Field(
        default=None,
        min_length=1,
        pattern=r"^[a-z0-9][a-z0-9-]*$",
        description=(
            "Pull mode (issue 30): the name of the one cluster this worker's own credentials "
            "(its in-cluster ServiceAccount, or kubeconfig) reach, as `storage-migrator fleet add "
            "NAME` named it. A flow run for another cluster fails before any write, naming both. "
            "Default: none (push mode: a named cluster is reached through its "
            "KubernetesClusterConfig block). In a run, the cluster it is for (none: the "
            "environment's, `default`)."
        ),
    )
    request_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Timeout of one API request, in seconds. Default 60: a LIST page of 500 "
            "large objects takes seconds; a hung connection must not hang a run."
        ),
    )
