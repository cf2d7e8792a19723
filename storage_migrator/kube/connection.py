"""Building a ``kubernetes.client.ApiClient`` from our settings.

Design decision (DESIGN 4.1): credentials come only from the official client's
loaders: a kubeconfig file and context, the pod's service account, or a
kubeconfig dict (what a Prefect ``KubernetesClusterConfig`` block holds). No
hand-written auth. Each call loads into a fresh ``Configuration`` (never the
process-wide default), so several clusters or API servers (HA polls, DESIGN
4.4) can be used side by side. The pool size is raised to the write
concurrency so that concurrent writes do not queue for a connection.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from kubernetes import config as kube_config
from kubernetes.client import ApiClient, Configuration

from storage_migrator.settings import Settings

__all__ = [
    "ConnectionConfigError",
    "api_client_from_config_dict",
    "api_client_from_settings",
    "connected",
    "running_in_cluster",
]

#: Connections kept besides the write workers (a LIST or a status write at once).
_SPARE_CONNECTIONS = 4


class ConnectionConfigError(Exception):
    """The cluster credentials could not be loaded; the message says from where and what to fix."""


def running_in_cluster() -> bool:
    """Whether the process runs in a pod (the service-account env is present)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def _fresh_configuration(settings: Settings, *, server: str | None = None) -> Configuration:
    configuration = _OneServer(server.rstrip("/")) if server else _Configuration()
    configuration.connection_pool_maxsize = max(
        configuration.connection_pool_maxsize or 0,
        settings.write_concurrency + _SPARE_CONNECTIONS,
    )
    return configuration


def api_client_from_settings(settings: Settings, *, server: str | None = None) -> ApiClient:
    """Connect as the settings say: in-cluster, or kubeconfig path and context.

    ``in_cluster=None`` means auto: in-cluster when running in a pod and no
    kubeconfig path is set; otherwise the kubeconfig (``KUBECONFIG`` or
    ``~/.kube/config`` when no path is given). ``server`` talks to one API server
    of an HA control plane with the same credentials (DESIGN 4.4).
    """
    configuration = _fresh_configuration(settings, server=server)
    use_in_cluster = settings.in_cluster
    if use_in_cluster is None:
        use_in_cluster = settings.kubeconfig is None and running_in_cluster()
    try:
        if use_in_cluster:
            kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            kube_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
                context=settings.context,
                client_configuration=configuration,
            )
    except kube_config.ConfigException as exc:
        source = (
            "the pod's service account"
            if use_in_cluster
            else f"kubeconfig {settings.kubeconfig or os.environ.get('KUBECONFIG') or '~/.kube/config'}"
            + (f" (context {settings.context!r})" if settings.context else "")
        )
        raise ConnectionConfigError(
            f"cannot load cluster credentials from {source}: {str(exc).rstrip('.')}. Point STORAGE_MIGRATOR_KUBECONFIG "
            "(or KUBECONFIG, or --kubeconfig) at a valid kubeconfig and STORAGE_MIGRATOR_CONTEXT at one of its "
            "contexts, or run in a pod with a service account."
        ) from exc
    return ApiClient(configuration=configuration)


@contextmanager
def closing_client(api: ApiClient) -> Iterator[ApiClient]:
    """``api`` for one unit of work (a task, a CLI command), closed afterwards."""
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]


def connected(settings: Settings) -> AbstractContextManager[ApiClient]:
    """A client from the settings' kubeconfig or in-cluster credentials, closed afterwards."""
    return closing_client(api_client_from_settings(settings))


class _Configuration(Configuration):  # type: ignore[misc]
    """The official configuration, minus a cost paid on every request (issue 22).

    The kubeconfig loader's refresh hook runs before every authenticated request
    and sets the host again, to the same value; the client's host setter then
    re-reads every environment variable to pick a proxy (`getproxies()`): about
    150 us per request, a sixth of the flow's CPU per object on a real cluster.
    Setting the host it already has changes nothing, so it is skipped; a new
    host goes through the official setter (proxy picked as before).
    """

    @property
    def host(self) -> str:
        return str(super().host)

    @host.setter
    def host(self, value: str) -> None:
        if self.server_index is None and getattr(self, "_base_path", None) == value:
            return
        Configuration.host.fset(self, value)  # type: ignore[attr-defined]


class _OneServer(_Configuration):
    """A configuration whose host stays the one API server chosen (DESIGN 4.4).

    The kubeconfig loader installs a hook that reloads the kubeconfig before every
    authenticated request (to refresh tokens), and the reload sets the host back to
    the kubeconfig's server: here the host cannot be changed after it is pinned.
    """

    def __init__(self, host: str) -> None:
        self._pinned: str | None = None
        super().__init__()
        self._pinned = host

    @property
    def host(self) -> str:
        return self._pinned or str(self.get_host_from_settings(self.server_index, variables=self.server_variables))

    @host.setter
    def host(self, value: str) -> None:
        if self._pinned is None:
            self._base_path = value
            self.server_index = None


def api_client_from_config_dict(
    config_dict: Mapping[str, Any],
    *,
    context: str | None = None,
    settings: Settings | None = None,
    server: str | None = None,
    source: str = "a kubeconfig dict",
) -> ApiClient:
    """Connect from a kubeconfig held as a dict (a Prefect KubernetesClusterConfig block).

    Same loader as ``new_client_from_config_dict``; the dict is never logged, and
    the error names ``source`` (the block), never its content. ``server`` as in
    :func:`api_client_from_settings`.
    """
    configuration = _fresh_configuration(settings or Settings(), server=server)
    try:
        kube_config.load_kube_config_from_dict(  # type: ignore[no-untyped-call]
            config_dict=dict(config_dict),
            context=context,
            client_configuration=configuration,
        )
    except kube_config.ConfigException as exc:
        where = source + (f" (context {context!r})" if context else "")
        raise ConnectionConfigError(
            f"cannot load cluster credentials from {where}: {str(exc).rstrip('.')}. Save a valid kubeconfig "
            "in it (KubernetesClusterConfig.from_file(...).save(NAME, overwrite=True)) with an existing context."
        ) from exc
    return ApiClient(configuration=configuration)
