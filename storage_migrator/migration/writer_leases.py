"""The writer Leases on the wire: one `coordination.k8s.io/v1` Lease per request being run (issue 37).

Design decision: a Lease is the primitive Kubernetes itself uses for leader election and
for API server identity, so every cluster serves it, RBAC scopes it to one namespace (a
Role in the install's), and its `resourceVersion` makes a take-over a compare-and-swap.
Each Lease is named for its request (`storage-migrator-writer-<request>`), labelled so
that one LIST with a label selector sees every writer of the install, and says:

- `spec.holderIdentity`: the holding run's flow run id (a uuid for a run without one);
- `spec.renewTime` / `spec.leaseDurationSeconds`: until when it holds (write_budget.py);
- annotation `migration.k8s.io/request`: the request's name (a label value is too short);
- annotation `migration.k8s.io/writes-per-second`: its rate, present only while it writes.

The rule (who may take a request, the share) is `write_budget.py`'s; this module only
reads and writes.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, Final

from kubernetes.client import ApiClient

from storage_migrator.kube.errors import NotFound
from storage_migrator.kube.listing import iterate_items
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.transport import DEFAULT_TIMEOUT_SECONDS
from storage_migrator.kube.wire_time import micro_time, parse_time
from storage_migrator.kube.writing import create_object, delete_object, patch_object, replace_object
from storage_migrator.migration.write_budget import LEASE_SECONDS, WriterLease
from storage_migrator.models import GROUP

__all__ = [
    "LEASES",
    "RATE_ANNOTATION",
    "REQUEST_ANNOTATION",
    "WRITER_SELECTOR",
    "InstallNamespaceMissing",
    "create_lease",
    "delete_lease",
    "lease_body",
    "lease_name",
    "list_writer_leases",
    "parse_lease",
    "renew_lease",
    "replace_lease",
]

LEASES: Final = ResourceRef(group="coordination.k8s.io", version="v1", resource="leases")
#: The labels of every writer Lease; WRITER_SELECTOR selects them all in one LIST.
WRITER_LABELS: Final = {"app.kubernetes.io/name": "storage-migrator", "app.kubernetes.io/component": "writer"}
WRITER_SELECTOR: Final = ",".join(f"{k}={v}" for k, v in WRITER_LABELS.items())
REQUEST_ANNOTATION: Final = f"{GROUP}/request"
RATE_ANNOTATION: Final = f"{GROUP}/writes-per-second"
_PREFIX: Final = "storage-migrator-writer-"
#: A Lease's name is a DNS subdomain: at most 253 characters.
_MAX_NAME: Final = 253


class InstallNamespaceMissing(Exception):
    """The install's namespace does not exist: no run can hold a request there."""

    def __init__(self, namespace: str) -> None:
        super().__init__(
            f"the install's namespace {namespace!r} does not exist, so this run cannot hold its request's writer "
            f"Lease (coordination.k8s.io/v1) and writes nothing: create it (`kubectl create namespace {namespace}`, "
            "or `kubectl apply -f deployments/rbac/`, which also grants the Lease Role there), or set "
            "STORAGE_MIGRATOR_NAMESPACE to the namespace the migrator is installed in"
        )
        self.namespace = namespace

    def __reduce__(self) -> tuple[Any, ...]:
        return (InstallNamespaceMissing, (self.namespace,))


def lease_name(request: str) -> str:
    """`storage-migrator-writer-<request>`; a request name too long for that is cut and a hash of it added."""
    whole = f"{_PREFIX}{request}"
    if len(whole) <= _MAX_NAME:
        return whole
    digest = hashlib.sha256(request.encode()).hexdigest()[:10]
    return f"{whole[: _MAX_NAME - 11].rstrip('.-')}-{digest}"


def _rate(value: Any) -> float | None:
    try:
        rate = float(value)
    except (TypeError, ValueError):
        return None
    return rate if rate > 0 else None


def parse_lease(item: dict[str, Any]) -> WriterLease:
    meta, spec = item.get("metadata") or {}, item.get("spec") or {}
    annotations = meta.get("annotations") or {}
    duration = spec.get("leaseDurationSeconds")
    name = str(meta.get("name", ""))
    return WriterLease(
        name=name,
        resource_version=str(meta.get("resourceVersion", "")),
        request=str(annotations.get(REQUEST_ANNOTATION) or name.removeprefix(_PREFIX)),
        holder=spec.get("holderIdentity") or None,
        renewed=parse_time(spec.get("renewTime")),
        duration_seconds=float(duration) if isinstance(duration, int | float) and duration > 0 else None,
        writes_per_second=_rate(annotations.get(RATE_ANNOTATION)),
        transitions=int(spec.get("leaseTransitions") or 0),
    )


def lease_body(*, namespace: str, request: str, holder: str, acquired: datetime, renewed: datetime,
               transitions: int, writes_per_second: float | None, resource_version: str | None = None,
               ) -> dict[str, Any]:  # fmt: skip
    """The whole Lease a holder writes (a create, or a replace conditional on `resource_version`)."""
    annotations = {REQUEST_ANNOTATION: request}
    if writes_per_second:
        annotations[RATE_ANNOTATION] = f"{writes_per_second:g}"
    metadata: dict[str, Any] = {"name": lease_name(request), "namespace": namespace, "labels": dict(WRITER_LABELS),
                                "annotations": annotations}  # fmt: skip
    if resource_version:
        metadata["resourceVersion"] = resource_version
    spec = {"holderIdentity": holder, "leaseDurationSeconds": LEASE_SECONDS, "acquireTime": micro_time(acquired),
            "renewTime": micro_time(renewed), "leaseTransitions": transitions}  # fmt: skip
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}


def list_writer_leases(api: ApiClient, *, namespace: str,
                       timeout: float = DEFAULT_TIMEOUT_SECONDS) -> list[WriterLease]:  # fmt: skip
    """Every writer Lease of the install, live or not (one LIST; an absent namespace lists nothing)."""
    items = iterate_items(api, LEASES, namespace=namespace, label_selector=WRITER_SELECTOR, timeout=timeout)
    return [parse_lease(item) for item in items]


def create_lease(api: ApiClient, body: dict[str, Any], *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> WriterLease:
    """POST a new Lease; `AlreadyExists` when another run made it first, `InstallNamespaceMissing`."""
    namespace = str(body["metadata"]["namespace"])
    try:
        return parse_lease(create_object(api, LEASES, body, namespace=namespace, timeout=timeout))
    except NotFound as exc:  # leases are served by every cluster: a 404 here is the namespace
        raise InstallNamespaceMissing(namespace) from exc


def replace_lease(api: ApiClient, body: dict[str, Any], *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> WriterLease:
    """PUT the Lease, conditional on the resourceVersion in `body`: `Conflict` if someone wrote it since
    (a take-over; should the expired Lease be deleted meanwhile, kube-apiserver creates it, which
    is the same outcome: nobody else held it)."""
    return parse_lease(replace_object(api, LEASES, body, timeout=timeout))


def renew_lease(api: ApiClient, *, namespace: str, name: str, resource_version: str, renewed: datetime,
                writes_per_second: float | None, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> WriterLease:  # fmt: skip
    """A holder's renewal, saying whether it writes: a JSON merge patch conditional on the
    resourceVersion it last wrote. Never a PUT: Leases allow create-on-update (kube-apiserver's
    leaseStrategy.AllowCreateOnUpdate), so a PUT of a Lease another run deleted would make it
    again; a merge patch of a missing object answers 404 (the patcher's createNewObject), a
    changed one 409: either way the holder learns it lost the request."""
    rate = f"{writes_per_second:g}" if writes_per_second else None
    patch = {"metadata": {"annotations": {RATE_ANNOTATION: rate}}, "spec": {"renewTime": micro_time(renewed)}}
    return parse_lease(patch_object(api, LEASES, name=name, namespace=namespace, patch=patch,
                                    resource_version=resource_version, timeout=timeout))  # fmt: skip


def delete_lease(api: ApiClient, lease: WriterLease, *, namespace: str,
                 timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:  # fmt: skip
    """DELETE the Lease only if it is still the one read (`Conflict` if it changed, `NotFound` if gone)."""
    delete_object(api, LEASES, name=lease.name, namespace=namespace, resource_version=lease.resource_version or None,
                  timeout=timeout)  # fmt: skip
