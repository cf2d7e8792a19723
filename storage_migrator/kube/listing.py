"""Chunked LIST of one resource, cluster-wide, as raw JSON.

Design decision (DESIGN 4.1, 4.5): items stay plain dicts, never typed models,
so nothing of an object is lost or invented; and the default mode asks the API
server for metadata only (``PartialObjectMetadataList``), so object bodies (a
Secret's data) never leave the server. In metadata mode each item is also cut
down to ``apiVersion``/``kind``/``metadata`` here, in case a server ignores the
media type and answers full objects.

A 410 raises ``errors.Expired`` whose ``continue_token`` is the Status's
``metadata.continue`` (inconsistent continue) or None (restart the LIST); the
decision what to do with it belongs to the chunk loop, not here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

from kubernetes.client import ApiClient
from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.transport import (
    ACCEPT_JSON,
    ACCEPT_PARTIAL_METADATA_LIST,
    DEFAULT_TIMEOUT_SECONDS,
    request,
)

__all__ = ["ListPage", "current_resource_version", "iterate_items", "list_page"]

_METADATA_KEYS = ("apiVersion", "kind", "metadata")


class ListPage(BaseModel):
    """One page of a chunked LIST.

    ``items`` are raw dicts: in metadata mode they hold metadata only; in full
    mode they are whole objects and must not be logged, cached or returned from
    a task (DESIGN 8).
    """

    model_config = ConfigDict(frozen=True)

    kind: str = Field(default="", description="List kind, e.g. 'PartialObjectMetadataList'.")
    items: list[dict[str, Any]] = Field(default_factory=list, repr=False)
    resource_version: str = Field(
        default="",
        description="The list's resourceVersion (the snapshot every page shares).",
    )
    continue_token: str | None = Field(default=None, description="Token for the next page; None on the last page.")
    remaining_item_count: int | None = Field(
        default=None, description="Objects after this page, when the server knows."
    )
    response_bytes: int = Field(default=0, description="Bytes of the answer body.")


def list_page(
    api_client: ApiClient,
    ref: ResourceRef,
    *,
    limit: int,
    continue_token: str | None = None,
    metadata_only: bool = True,
    namespace: str | None = None,
    label_selector: str | None = None,
    field_selector: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> ListPage:
    """LIST one page of ``ref`` (all namespaces unless ``namespace``).

    Raises ``Expired`` (410, with the server's continue token if any),
    ``NotFound`` (resource not served), ``MethodNotAllowed`` (no list verb).
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    query: dict[str, str | int] = {"limit": limit}
    if continue_token:
        query["continue"] = continue_token
    if label_selector:
        query["labelSelector"] = label_selector
    if field_selector:
        query["fieldSelector"] = field_selector
    response = request(
        api_client,
        method="GET",
        path=ref.collection_path(namespace=namespace),
        what=f"LIST {ref}",
        query=query,
        accept=ACCEPT_PARTIAL_METADATA_LIST if metadata_only else ACCEPT_JSON,
        timeout=timeout,
    )
    doc = cast(dict[str, Any], response.json())
    meta = cast(dict[str, Any], doc.get("metadata") or {})
    raw_items = cast(list[dict[str, Any]], doc.get("items") or [])
    if metadata_only:
        raw_items = [{k: item[k] for k in _METADATA_KEYS if k in item} for item in raw_items]
    remaining = meta.get("remainingItemCount")
    return ListPage(
        kind=str(doc.get("kind", "")),
        items=raw_items,
        resource_version=str(meta.get("resourceVersion", "")),
        continue_token=meta.get("continue") or None,
        remaining_item_count=int(remaining) if remaining is not None else None,
        response_bytes=response.size,
    )


def iterate_items(
    api_client: ApiClient,
    ref: ResourceRef,
    *,
    limit: int = 500,
    metadata_only: bool = False,
    namespace: str | None = None,
    label_selector: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> Iterator[dict[str, Any]]:
    """Every item of a LIST, page by page: for reading our own small collections.

    (StorageStates, migrations.) Not for migrating: the chunk loop needs the
    page boundaries to checkpoint, and handles 410 itself; here errors propagate.
    """
    token: str | None = None
    while True:
        page = list_page(
            api_client,
            ref,
            limit=limit,
            continue_token=token,
            metadata_only=metadata_only,
            namespace=namespace,
            label_selector=label_selector,
            timeout=timeout,
        )
        yield from page.items
        token = page.continue_token
        if not token:
            return


def current_resource_version(
    api_client: ApiClient, ref: ResourceRef, *, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> str:
    """The resource's list resourceVersion now: a metadata-only LIST with limit 1, as
    kube-controller-manager's migration controller records it (issue 36). Raises as ``list_page``."""
    return list_page(api_client, ref, limit=1, metadata_only=True, timeout=timeout).resource_version
