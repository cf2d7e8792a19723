"""Hearing every API server: which source of agreement the cluster offers, and what each server says.

Design decision (DESIGN 4.4): the best source the cluster offers is used, and
every source is turned into seed 000's reporters (:mod:`storage_migrator.agreement.reporters`),
so detection applies one set of rules whatever the source:

1. the StorageVersion API, when served and populated (one reporter per apiServerID);
2. one discovery poll per API server, when there are several: the servers named
   in the settings (``api_servers``), else the EndpointSlices of the ``kubernetes``
   Service; a server that does not answer is "not heard" and its entry ages;
3. the one discovery document (no reporters: the planner's single reporter).

The same servers are heard for the encryption configuration each one runs
(issue 19, :func:`observe_server_configs`): the list of servers is their identity
Leases, each one's ``/metrics`` is read through its own endpoint, and the
cluster's address is then sampled until every live server has answered (each
answer names its server, so a load balancer in front of them does not matter).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from kubernetes.client import ApiClient
from pydantic import BaseModel, Field

from storage_migrator.agreement.identity_leases import list_identity_leases
from storage_migrator.agreement.reporters import ReporterHash, reporters_from_discoveries
from storage_migrator.agreement.server_configs import ConfigSample, ServerConfigs, missing_ids, server_configs
from storage_migrator.agreement.server_metrics import read_config_samples
from storage_migrator.agreement.storage_versions import AgreementSource, reporters_from_storage_versions
from storage_migrator.agreement.storageversion_api import list_storage_versions
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.discovery import DiscoveredResource, discover
from storage_migrator.kube.endpoints import api_server_urls
from storage_migrator.kube.errors import KubeError
from storage_migrator.settings import Settings

__all__ = ["SAMPLES_PER_SERVER", "Agreement", "observe_agreement", "observe_server_configs"]

#: Samples of the cluster's address per live server before one not yet heard is called unknown.
SAMPLES_PER_SERVER = 4


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


def _hear(api: ApiClient, via: str, samples: list[ConfigSample], unheard: dict[str, str], timeout: float) -> None:
    try:
        heard = read_config_samples(api, via=via, timeout=timeout)
    except KubeError as exc:  # a 403 names the permission: the server stays unknown, never trusted
        unheard[via] = str(exc)
        return
    if any(s.id_hash is None for s in heard):
        unheard[via] = "its /metrics has no apiserver_encryption_config_controller_last_config_info"
    samples.extend(heard)


def observe_server_configs(
    api: ApiClient, settings: Settings, *, connect: Callable[[str], ApiClient] | None = None
) -> ServerConfigs:
    """The encryption configuration hash of every live API server (issue 19). Listing the identity
    Leases may raise (a 403 names the permission): without the list of servers nothing is known."""
    connect = connect or (lambda server: api_client_from_settings(settings, server=server))
    timeout = settings.request_timeout_seconds
    leases = list_identity_leases(api, timeout=timeout)
    samples: list[ConfigSample] = []
    unheard: dict[str, str] = {}
    for server in settings.api_servers or api_server_urls(api, timeout=timeout):
        one = connect(server)
        try:
            _hear(one, server, samples, unheard, timeout)
        finally:
            one.close()  # type: ignore[no-untyped-call]
    cluster = str(api.configuration.host)
    live = sum(1 for lease in leases if lease.live(datetime.now(UTC)))
    for _ in range(SAMPLES_PER_SERVER * max(live, 1)):
        if not missing_ids(leases, samples, now=datetime.now(UTC)):
            break
        # A new connection per sample: a load balancer spreads connections, not the requests of one.
        one = connect(cluster)
        try:
            _hear(one, cluster, samples, unheard, timeout)
        finally:
            one.close()  # type: ignore[no-untyped-call]
    return server_configs(leases, samples, now=datetime.now(UTC), unheard=unheard)
