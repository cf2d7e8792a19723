"""What every task of ours shares: how it connects, and that nothing it sees is kept.

Design decision (DESIGN 8, PREFECT.md "Secrets and results"): a task that may
see object bodies must never persist or cache its inputs or result, so every
task is declared with `NO_CACHE` and `persist_result=False`, whatever the
Prefect defaults are on the machine that runs it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from kubernetes.client import ApiClient
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from storage_migrator.kube.connection import (
    ConnectionConfigError,
    api_client_from_config_dict,
    api_client_from_settings,
    closing_client,
)
from storage_migrator.kube.errors import KubeError, is_retriable, is_settling_answer
from storage_migrator.settings import Settings

#: Keyword arguments of every @task: no cache key (inputs are never hashed), no persisted result.
PRIVATE: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}


def transient_or_settling(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a task whose request met a transient answer or a restarting API server.

    An API server restarts during every upgrade, which is when migrations run; for
    a few seconds after it starts it answers 403 to what it allows a moment later
    (issue 9). Each retried task is idempotent (a read, a status write of the same
    values). Anything else, a verdict about the migration included, is final.
    """
    try:
        state.result()
    except KubeError as exc:
        return is_retriable(exc) or is_settling_answer(exc)
    except Exception:  # noqa: BLE001 - not a request failure: not ours to retry
        return False
    return False


#: Keyword arguments of the tasks that read or write our own objects around a migration:
#: 5 retries 1, 2, 4, 8 and 16 s apart (with jitter) outlast an API server restart.
REQUEST_RETRIES: dict[str, Any] = {
    "retries": 5,
    "retry_delay_seconds": exponential_backoff(backoff_factor=1),
    "retry_jitter_factor": 0.5,
    "retry_condition_fn": transient_or_settling,
}


def api_client(settings: Settings, *, server: str | None = None) -> ApiClient:
    """A client with the credentials the settings name: a KubernetesClusterConfig block, else kubeconfig or in-cluster.

    DESIGN 4.1: a Prefect block is one source of credentials. Loading it is Prefect
    (so here, not in storage_migrator/); its kubeconfig dict goes to the official
    client's loader and is never logged or returned. ``server`` pins one API server
    (HA polls, DESIGN 4.4) with the same credentials.
    """
    name = settings.cluster_config_block
    if not name:
        return api_client_from_settings(settings, server=server)
    # Imported here: prefect-kubernetes pulls in kubernetes_asyncio, which most runs never need.
    from prefect_kubernetes.credentials import KubernetesClusterConfig

    try:
        block = KubernetesClusterConfig.load(name)
    except ValueError as exc:  # Prefect: "Unable to find block document named ..."
        raise ConnectionConfigError(
            f"no KubernetesClusterConfig block named {name!r} in this Prefect workspace: create it "
            f"(KubernetesClusterConfig.from_file(PATH).save({name!r})) or unset STORAGE_MIGRATOR_CLUSTER_CONFIG_BLOCK. "
            f"If {name!r} is in pull mode, this run reached a worker that is not its own: run it on {name!r}'s "
            f"deployments (flow/{name}), which its own worker serves"
        ) from exc
    return api_client_from_config_dict(
        block.config,
        context=block.context_name,
        settings=settings,
        server=server,
        source=f"KubernetesClusterConfig block {name!r}",
    )


def connected(settings: Settings) -> AbstractContextManager[ApiClient]:
    """A client with the credentials the settings name (a block too), closed afterwards."""
    return closing_client(api_client(settings))
