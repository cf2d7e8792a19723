"""Reading the StorageVersion API (seed 001, as shipped: ``internal.apiserver.k8s.io/v1alpha1``).

Design decision: "not served" is an answer, not an error. Clusters without the
``StorageVersionAPI`` feature gate (the default on v1.36) answer 404 for the
whole API, and custom resources have no StorageVersion object; both come back
as ``None`` so the caller falls back to another source of agreement (DESIGN 4.4).
"""

from __future__ import annotations

from typing import Final

from kubernetes.client import ApiClient

from storage_migrator.agreement.storage_versions import StorageVersionObservation, storage_version_name
from storage_migrator.kube.errors import NotFound
from storage_migrator.kube.listing import iterate_items
from storage_migrator.kube.reading import read_object
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.transport import DEFAULT_TIMEOUT_SECONDS

__all__ = ["STORAGE_VERSIONS", "list_storage_versions", "read_storage_version"]

STORAGE_VERSIONS: Final = ResourceRef(group="internal.apiserver.k8s.io", version="v1alpha1", resource="storageversions")


def list_storage_versions(
    api_client: ApiClient, *, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> list[StorageVersionObservation] | None:
    """Every StorageVersion object; None when the API is not served."""
    try:
        return [
            StorageVersionObservation.from_object(item)
            for item in iterate_items(api_client, STORAGE_VERSIONS, limit=500, timeout=timeout)
        ]
    except NotFound:
        return None


def read_storage_version(
    api_client: ApiClient, *, group: str, resource: str, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> StorageVersionObservation | None:
    """The StorageVersion object of one resource; None when there is none (or no such API)."""
    try:
        obj = read_object(api_client, STORAGE_VERSIONS, name=storage_version_name(group, resource), timeout=timeout)
    except NotFound:
        return None
    return StorageVersionObservation.from_object(obj)
