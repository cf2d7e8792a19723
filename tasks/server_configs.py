"""The task that hears every API server's encryption configuration (issue 19).

One read of the identity Leases, each server's ``/metrics`` through its own
endpoint, then samples of the cluster's address (storage_migrator.agreement.apiservers);
the result is hashes and server ids only. Retried like our other reads: an API
server restarting during a rolling configuration change answers 403 for a few
seconds (issue 9).
"""

from __future__ import annotations

from prefect import task

from storage_migrator.agreement.apiservers import observe_server_configs
from storage_migrator.agreement.server_configs import ServerConfigs
from storage_migrator.settings import Settings
from tasks.common import PRIVATE, REQUEST_RETRIES, api_client, connected

__all__ = ["observe_configs"]


@task(name="observe-server-configs", **REQUEST_RETRIES, **PRIVATE)
def observe_configs(settings: Settings) -> ServerConfigs:
    with connected(settings) as api:
        return observe_server_configs(api, settings, connect=lambda server: api_client(settings, server=server))
