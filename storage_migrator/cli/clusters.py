"""Which clusters a command is about (``--cluster NAME``, ``--all-clusters``), and how it reaches them.

Issue 20: a cluster is a KubernetesClusterConfig block's name, or ``default``,
the environment's (``--kubeconfig``, ``--context``, the settings). Without
either option a command is about the default cluster only, as before there
were names. The Prefect workspace is read here and nowhere else below the
flows (pyproject's import-linter contract): the block a named cluster is
reached through, and the clusters recorded by their first run (the Variables
``storage-migrator-cluster-<name>``, tasks/cluster_identity.py); a refusal of the
Prefect API is said as cli/prefect_api.py says it (issue 30). Prefect is imported
inside the functions: it is slow to import, and most commands never need it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Annotated, Any, TypeVar

import typer
from kubernetes.client import ApiClient
from pydantic import BaseModel, ConfigDict

from storage_migrator.cli.options import GlobalOptions, kube_api, settings_of
from storage_migrator.cli.prefect_api import prefect_client, prefect_failure
from storage_migrator.fleet.names import DEFAULT_CLUSTER, identity_variable
from storage_migrator.kube.connection import ConnectionConfigError, api_client_from_config_dict, closing_client
from storage_migrator.settings import Settings

__all__ = [
    "AllClustersOption",
    "ClusterOption",
    "ClusterScope",
    "block_client",
    "connect",
    "each_recorded_cluster",
    "recorded_clusters",
    "scope_of",
]

ClusterOption = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        metavar="NAME",
        help="this cluster only: a KubernetesClusterConfig block's name, or 'default' (the environment's)",
    ),
]
AllClustersOption = Annotated[bool, typer.Option("--all-clusters", help="every cluster, with a CLUSTER column")]

#: The prefix of the Variables recording a cluster's identity (storage_migrator.fleet.names.identity_variable).
_IDENTITY_PREFIX = identity_variable(DEFAULT_CLUSTER).removesuffix(DEFAULT_CLUSTER)
_PAGE = 200


class ClusterScope(BaseModel):
    """One cluster (``cluster``), or every cluster (``cluster`` None)."""

    model_config = ConfigDict(frozen=True)

    cluster: str | None = DEFAULT_CLUSTER

    @property
    def all(self) -> bool:
        return self.cluster is None


def scope_of(ctx: typer.Context, cluster: str | None, all_clusters: bool) -> ClusterScope:
    """The scope the options ask for; a usage error (exit 2) for both, or for a name no block can have."""
    if cluster is not None and all_clusters:
        raise typer.BadParameter("give --cluster NAME or --all-clusters, not both", param_hint="--cluster")
    if all_clusters:
        return ClusterScope(cluster=None)
    if cluster is None or cluster == DEFAULT_CLUSTER:
        return ClusterScope()
    try:
        identity_variable(cluster)  # validates the name as fleet/names.py does for every use of it
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--cluster") from exc
    given = ctx.find_object(GlobalOptions) or GlobalOptions()
    if given.kubeconfig is not None or given.context is not None:
        raise typer.BadParameter(f"cluster {cluster!r} is reached through its block: --kubeconfig and --context "
                                 "are the default cluster's; leave them out", param_hint="--cluster")  # fmt: skip
    return ClusterScope(cluster=cluster)


def block_client(name: str, settings: Settings) -> ApiClient:
    """A client with the credentials of the KubernetesClusterConfig block `name` (never logged)."""
    # Imported here: Prefect and prefect-kubernetes take seconds to import.
    from prefect_kubernetes.credentials import KubernetesClusterConfig

    try:
        block = KubernetesClusterConfig.load(name)
    except ValueError as exc:  # Prefect: "Unable to find block document named ..."
        raise ConnectionConfigError(
            f"cluster {name!r}: no KubernetesClusterConfig block named {name!r} in this Prefect workspace "
            f"(PREFECT_API_URL). In pull mode there is none, by design (the server holds no credential of "
            f"the cluster): read it with its own kubeconfig (--kubeconfig PATH, without --cluster). In push "
            f"mode, create it with KubernetesClusterConfig.from_file(PATH).save({name!r})"
        ) from exc
    except Exception as exc:  # the Prefect API itself: unreachable, refused
        why = prefect_failure(exc) or f"the Prefect API failed ({type(exc).__name__}: {exc})"
        raise ConnectionConfigError(f"cluster {name!r}: its KubernetesClusterConfig block could not be read: "
                                    f"{why}") from exc  # fmt: skip
    return api_client_from_config_dict(block.config, context=block.context_name, settings=settings,
                                       source=f"KubernetesClusterConfig block {name!r}")  # fmt: skip


def connect(ctx: typer.Context, cluster: str) -> AbstractContextManager[ApiClient]:
    """A client for `cluster`, closed afterwards: the environment's credentials for `default`, else its block."""
    settings = settings_of(ctx)
    if cluster == DEFAULT_CLUSTER:
        return kube_api(settings)
    return closing_client(block_client(cluster, settings))


def recorded_clusters() -> list[str]:
    """``default`` and every cluster whose identity a run recorded in the Prefect workspace, sorted after it.

    Raises ConnectionConfigError when the Prefect API cannot be read (the default cluster is still known).
    """
    names: set[str] = set()
    try:
        with prefect_client() as client:
            offset = 0
            while True:
                body: dict[str, Any] = {"variables": {"name": {"like_": f"{_IDENTITY_PREFIX}%"}},
                                        "limit": _PAGE, "offset": offset}  # fmt: skip
                page = client.request("POST", "/variables/filter", json=body).json()
                names.update(_cluster_of(str(v.get("name", ""))) for v in page)
                if len(page) < _PAGE:
                    break
                offset += _PAGE
    except Exception as exc:
        why = prefect_failure(exc) or f"{type(exc).__name__}: {exc}; is PREFECT_API_URL set?"
        raise ConnectionConfigError(f"the clusters recorded in the Prefect workspace could not be read: "
                                    f"{why}") from exc  # fmt: skip
    names.discard("")
    names.discard(DEFAULT_CLUSTER)
    return [DEFAULT_CLUSTER, *sorted(names)]


T = TypeVar("T")


def each_recorded_cluster(read: Callable[[str], list[T]]) -> tuple[list[tuple[str, T]], list[str]]:
    """`read(cluster)` for every recorded cluster: (cluster, item) pairs, and why each cluster that could
    not be read was not. One cluster's failure never hides the others' (issue 20, `--all-clusters`)."""
    failed: list[str] = []
    try:
        names = recorded_clusters()
    except ConnectionConfigError as exc:
        names, failed = [DEFAULT_CLUSTER], [str(exc)]
    found: list[tuple[str, T]] = []
    for name in names:
        try:
            found += [(name, item) for item in read(name)]
        except Exception as exc:  # noqa: BLE001 - reported, and the other clusters are still read
            failed.append(f"cluster {name!r} could not be read: {exc}")
    return found, failed


def _cluster_of(variable: str) -> str:
    """The cluster a Variable records, or "" for a Variable that only looks like one."""
    name = variable.removeprefix(_IDENTITY_PREFIX)
    try:
        return name if name != variable and identity_variable(name) == variable else ""
    except ValueError:
        return ""
