"""GET of one object, as raw JSON.

Design decision (DESIGN 4.1): the object is returned as the server sent it,
either as a dict (for our own CRs and for checks) or as the undecoded bytes (for
the PUT fallback, which must write the object back exactly as read).
"""

from __future__ import annotations

import json
from typing import Any, cast

from kubernetes.client import ApiClient

from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.transport import (
    ACCEPT_JSON,
    ACCEPT_PARTIAL_METADATA,
    DEFAULT_TIMEOUT_SECONDS,
    request,
)

__all__ = ["read_object", "read_object_bytes"]


def read_object_bytes(
    api_client: ApiClient,
    ref: ResourceRef,
    *,
    name: str,
    namespace: str | None = None,
    subresource: str | None = None,
    metadata_only: bool = False,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> bytes:
    """GET one object and return the body bytes untouched. Raises ``NotFound`` if absent."""
    return request(
        api_client,
        method="GET",
        path=ref.object_path(name=name, namespace=namespace, subresource=subresource),
        what=f"GET {ref.describe(name=name, namespace=namespace)}",
        accept=ACCEPT_PARTIAL_METADATA if metadata_only else ACCEPT_JSON,
        timeout=timeout,
    ).data


def read_object(
    api_client: ApiClient,
    ref: ResourceRef,
    *,
    name: str,
    namespace: str | None = None,
    subresource: str | None = None,
    metadata_only: bool = False,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """GET one object as a dict. Raises ``NotFound`` if absent."""
    data = read_object_bytes(
        api_client,
        ref,
        name=name,
        namespace=namespace,
        subresource=subresource,
        metadata_only=metadata_only,
        timeout=timeout,
    )
    return cast(dict[str, Any], json.loads(data))
