"""Reading the API servers' identity Leases: which servers exist, and which of them are live.

Design decision (issue 19): kube-apiserver (gate ``APIServerIdentity``, on by
default) keeps one ``coordination.k8s.io/v1`` Lease per server in
``kube-system``, labelled ``apiserver.kubernetes.io/identity=kube-apiserver`` and
named after its id. It is the one list of servers every client can read, and the
id is the one ``/metrics`` hashes into ``apiserver_id_hash``. Listing it needs
``list`` on leases in ``kube-system`` only (a Role, not a ClusterRole).
"""

from __future__ import annotations

from typing import Any, Final

from kubernetes.client import ApiClient

from storage_migrator.agreement.server_configs import IdentityLease
from storage_migrator.kube.listing import iterate_items
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.transport import DEFAULT_TIMEOUT_SECONDS
from storage_migrator.kube.wire_time import parse_time

__all__ = ["IDENTITY_SELECTOR", "LEASES", "LEASE_NAMESPACE", "list_identity_leases"]

LEASES: Final = ResourceRef(group="coordination.k8s.io", version="v1", resource="leases")
LEASE_NAMESPACE: Final = "kube-system"
#: IdentityLeaseComponentLabelKey=kube-apiserver (pkg/controlplane/apiserver/server.go).
IDENTITY_SELECTOR: Final = "apiserver.kubernetes.io/identity=kube-apiserver"


def _lease(item: dict[str, Any]) -> IdentityLease:
    meta, spec = item.get("metadata") or {}, item.get("spec") or {}
    duration = spec.get("leaseDurationSeconds")
    return IdentityLease(
        name=str(meta.get("name", "")),
        holder=str(spec.get("holderIdentity") or ""),
        renew_time=parse_time(spec.get("renewTime")),
        duration_seconds=duration if isinstance(duration, int) else None,
    )


def list_identity_leases(api_client: ApiClient, *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> list[IdentityLease]:
    """Every kube-apiserver identity Lease, live or not (``IdentityLease.live`` tells); errors propagate:
    a 403 names the permission, and the caller must not fall back to trusting the operator."""
    items = iterate_items(api_client, LEASES, namespace=LEASE_NAMESPACE, label_selector=IDENTITY_SELECTOR,
                          timeout=timeout)  # fmt: skip
    return [_lease(item) for item in items]
