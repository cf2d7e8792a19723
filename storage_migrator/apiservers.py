"""Hearing every API server: which source of agreement the cluster offers, and what each server says.

Design decision (DESIGN 4.4): the best source the cluster offers is used, and
every source is turned into seed 000's reporters (:mod:`storage_migrator.reporters`),
so detection applies one set of rules whatever the source:

1. the StorageVersion API, when served and populated (one reporter per apiServerID);
2. one discovery poll per API server, when there are several: the servers named
   in the settings (``api_servers``), else the EndpointSlices of the ``kubernetes``
   Service; a server that does not answer is "not heard" and its entry ages;
3. the one discovery document (no reporters: the planner's single reporter).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kubernetes.client import ApiClient
from pydantic import BaseModel, Field

from storage_migrator.agreement import AgreementSource, reporters_from_storage_versions
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.discovery import DiscoveredResource, discover
from storage_migrator.kube.endpoints import api_server_urls
from storage_migrator.kube.errors import KubeError
from storage_migrator.kube.storageversions import list_storage_versions
from storage_migrator.reporters import ReporterHash, reporters_from_discoveries
from storage_migrator.settings import Settings

__all__ = ["Agreement", "observe_agreement"]


class Agreement(BaseModel):
    """Who reports which hash, and from which source."""

    source: AgreementSource
    reporters: list[ReporterHash] = Field(default_factory=list)
    servers: list[str] = Field(default_factory=list, description="The reporters heard: apiServerIDs or URLs.")
    unheard: dict[str, str] = Field(default_factory=dict, description="Server URL -> why it was not heard.")


def observe_agreement(
    api: ApiClient,
    settings: Settings,
    discovered: Sequence[DiscoveredResource],
    *,
    connect: Callable[[str], ApiClient] | None = None,
) -> Agreement:
    """``connect(server)`` gives a client of one API server with ``api``'s credentials
    (default: from the settings' kubeconfig or in-cluster; tasks pass one that honours
    a KubernetesClusterConfig block)."""
    connect = connect or (lambda server: api_client_from_settings(settings, server=server))
    timeout = settings.request_timeout_seconds
    observed = list_storage_versions(api, timeout=timeout)
    if observed:
        reporters = reporters_from_storage_versions(observed, discovered)
        return Agreement(source="storage-version-api", reporters=reporters,
                         servers=sorted({r.reporter_id for r in reporters}))  # fmt: skip
    servers = settings.api_servers or api_server_urls(api, timeout=timeout)
    if len(servers) <= 1:
        return Agreement(source="discovery", servers=servers)
    per_server: dict[str, list[DiscoveredResource]] = {}
    unheard: dict[str, str] = {}
    for server in servers:
        one = connect(server)
        try:
            per_server[server] = discover(one, timeout=timeout).resources
        except KubeError as exc:
            unheard[server] = str(exc)
        finally:
            one.close()  # type: ignore[no-untyped-call]
    return Agreement(source="discovery-per-server", reporters=reporters_from_discoveries(per_server),
                     servers=sorted(per_server), unheard=unheard)  # fmt: skip
