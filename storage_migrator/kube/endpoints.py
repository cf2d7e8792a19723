"""Where the API servers are: the EndpointSlices of the `kubernetes` Service.

Design decision (DESIGN 4.4): kube-apiserver's endpoint reconciler keeps one
address per live API server in the slices labelled
``kubernetes.io/service-name=kubernetes`` in ``default``. Detection polls each
of them when the StorageVersion API is not served. A slice's address is the
server's advertise address and port; the scheme is the one we already use.
"""

from __future__ import annotations

from typing import Any, Final

from kubernetes.client import ApiClient

from storage_migrator.kube.errors import NotFound
from storage_migrator.kube.listing import iterate_items
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.transport import DEFAULT_TIMEOUT_SECONDS

__all__ = ["ENDPOINT_SLICES", "api_server_urls"]

ENDPOINT_SLICES: Final = ResourceRef(group="discovery.k8s.io", version="v1", resource="endpointslices")
SERVICE_LABEL: Final = "kubernetes.io/service-name=kubernetes"


def _urls(slice_: dict[str, Any], scheme: str) -> list[str]:
    ports = [p.get("port") for p in slice_.get("ports") or [] if isinstance(p, dict)]
    port = next((p for p in ports if isinstance(p, int)), None)
    if port is None:
        return []
    out = []
    for endpoint in slice_.get("endpoints") or []:
        if not isinstance(endpoint, dict) or (endpoint.get("conditions") or {}).get("ready") is False:
            continue
        for address in endpoint.get("addresses") or []:
            host = f"[{address}]" if ":" in str(address) else str(address)
            out.append(f"{scheme}://{host}:{port}")
    return out


def api_server_urls(api_client: ApiClient, *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> list[str]:
    """One URL per ready API server, sorted; [] when the slices cannot be listed."""
    scheme = str(api_client.configuration.host).split("://", 1)[0] or "https"
    try:
        slices = list(
            iterate_items(
                api_client, ENDPOINT_SLICES, namespace="default", label_selector=SERVICE_LABEL, timeout=timeout
            )
        )
    except NotFound:
        return []
    return sorted({url for s in slices for url in _urls(s, scheme)})
