"""Writes: the no-op rewrite of migrated objects, and plain writes of our own CRs.

Design decision (DESIGN 4.1, 4.5): a migrated object is rewritten with a minimal
JSON merge patch ``{"metadata":{"resourceVersion": RV}}``: it carries no content
(nothing can be lost or overwritten), the resourceVersion makes it conditional
(409 if someone wrote since our LIST), and the answer is asked for as
``PartialObjectMetadata`` so the body does not travel back. Where the patch verb
is missing the fallback is a PUT of the object exactly as read (raw bytes, same
``metadata.resourceVersion``). Results carry names and resourceVersions only,
never a body.

Our own CRs (StorageVersionMigration, StorageState) are written with
create/replace/patch/delete taking and returning dicts; the pydantic models in
``storage_migrator.models`` produce and read those dicts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, cast

from kubernetes.client import ApiClient
from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.transport import (
    ACCEPT_JSON,
    ACCEPT_PARTIAL_METADATA,
    CONTENT_JSON,
    CONTENT_MERGE_PATCH,
    DEFAULT_TIMEOUT_SECONDS,
    request,
)

__all__ = [
    "WriteResult",
    "create_object",
    "delete_object",
    "patch_object",
    "replace_object",
    "rewrite_with_patch",
    "rewrite_with_put",
]


class WriteResult(BaseModel):
    """What a no-op rewrite did to one object: names and versions, never content."""

    model_config = ConfigDict(frozen=True)

    namespace: str | None = Field(default=None, description="None for cluster-scoped objects.")
    name: str
    old_resource_version: str = Field(description="The resourceVersion we read and sent.")
    new_resource_version: str = Field(description="The resourceVersion the server answered.")
    response_bytes: int = Field(default=0, description="Bytes of the answer body.")

    @property
    def rewritten(self) -> bool:
        """True when the server wrote (new resourceVersion); False: bytes were current."""
        return self.new_resource_version != self.old_resource_version


def _answer_resource_version(data: bytes) -> str:
    doc = json.loads(data)
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    return str((meta or {}).get("resourceVersion", ""))


def rewrite_with_patch(
    api_client: ApiClient,
    ref: ResourceRef,
    *,
    name: str,
    namespace: str | None,
    resource_version: str,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> WriteResult:
    """No-op merge patch conditional on ``resource_version`` (DESIGN 4.5).

    Raises ``Conflict`` (written since), ``NotFound`` (deleted since),
    ``MethodNotAllowed`` (no patch verb) and the transient errors.
    """
    if not resource_version:
        raise ValueError(f"{ref.describe(name=name, namespace=namespace)}: a rewrite needs the resourceVersion it read")
    body = json.dumps({"metadata": {"resourceVersion": resource_version}}).encode()
    response = request(
        api_client,
        method="PATCH",
        path=ref.object_path(name=name, namespace=namespace),
        what=f"PATCH {ref.describe(name=name, namespace=namespace)}",
        accept=ACCEPT_PARTIAL_METADATA,
        content_type=CONTENT_MERGE_PATCH,
        body=body,
        timeout=timeout,
    )
    return WriteResult(
        namespace=namespace or None,
        name=name,
        old_resource_version=resource_version,
        new_resource_version=_answer_resource_version(response.data),
        response_bytes=response.size,
    )


def rewrite_with_put(
    api_client: ApiClient,
    ref: ResourceRef,
    *,
    body: bytes,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> WriteResult:
    """PUT the object exactly as read (raw bytes, never re-encoded): the fallback.

    The name, namespace and resourceVersion are read from the bytes' metadata;
    the bytes themselves are sent unchanged so no unknown field is lost.
    """
    doc = json.loads(body)
    meta = cast(dict[str, Any], doc.get("metadata") or {}) if isinstance(doc, dict) else {}
    name = str(meta.get("name", ""))
    namespace = cast("str | None", meta.get("namespace")) or None
    resource_version = str(meta.get("resourceVersion", ""))
    if not name or not resource_version:
        raise ValueError(f"PUT {ref}: the object must carry metadata.name and metadata.resourceVersion")
    response = request(
        api_client,
        method="PUT",
        path=ref.object_path(name=name, namespace=namespace),
        what=f"PUT {ref.describe(name=name, namespace=namespace)}",
        accept=ACCEPT_PARTIAL_METADATA,
        content_type=CONTENT_JSON,
        body=body,
        timeout=timeout,
    )
    return WriteResult(
        namespace=namespace,
        name=name,
        old_resource_version=resource_version,
        new_resource_version=_answer_resource_version(response.data),
        response_bytes=response.size,
    )


def _object_meta(obj: Mapping[str, Any]) -> tuple[str, str | None, str]:
    meta = cast(Mapping[str, Any], obj.get("metadata") or {})
    return (
        str(meta.get("name", "")),
        meta.get("namespace") or None,
        str(meta.get("resourceVersion", "")),
    )


def create_object(
    api_client: ApiClient,
    ref: ResourceRef,
    obj: Mapping[str, Any],
    *,
    namespace: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """POST a new object; answers the created object. ``AlreadyExists`` if taken."""
    name, obj_namespace, _ = _object_meta(obj)
    namespace = namespace or obj_namespace
    label = name or str(cast(Mapping[str, Any], obj.get("metadata") or {}).get("generateName", ""))
    response = request(
        api_client,
        method="POST",
        path=ref.collection_path(namespace=namespace),
        what=f"POST {ref.describe(name=label, namespace=namespace)}",
        accept=ACCEPT_JSON,
        content_type=CONTENT_JSON,
        body=json.dumps(obj).encode(),
        timeout=timeout,
    )
    return cast(dict[str, Any], response.json())


def replace_object(
    api_client: ApiClient,
    ref: ResourceRef,
    obj: Mapping[str, Any],
    *,
    subresource: Literal["status"] | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """PUT an object (or its ``status``), conditional on its ``metadata.resourceVersion``.

    The resourceVersion is required: an unconditional replace could overwrite
    a newer write (DESIGN 4.1). ``Conflict`` tells the caller to re-read.
    """
    name, namespace, resource_version = _object_meta(obj)
    if not name or not resource_version:
        raise ValueError(f"replace {ref}: metadata.name and metadata.resourceVersion are required")
    response = request(
        api_client,
        method="PUT",
        path=ref.object_path(name=name, namespace=namespace, subresource=subresource),
        what=f"PUT {ref.describe(name=name, namespace=namespace, subresource=subresource)}",
        accept=ACCEPT_JSON,
        content_type=CONTENT_JSON,
        body=json.dumps(obj).encode(),
        timeout=timeout,
    )
    return cast(dict[str, Any], response.json())


def patch_object(
    api_client: ApiClient,
    ref: ResourceRef,
    *,
    name: str,
    patch: Mapping[str, Any],
    namespace: str | None = None,
    subresource: Literal["status"] | None = None,
    resource_version: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """JSON merge patch of an object (or its ``status``); answers the patched object.

    With ``resource_version`` the patch is conditional (409 ``Conflict`` if stale).
    """
    body: dict[str, Any] = dict(patch)
    if resource_version:
        metadata = dict(cast(Mapping[str, Any], body.get("metadata") or {}))
        metadata["resourceVersion"] = resource_version
        body["metadata"] = metadata
    response = request(
        api_client,
        method="PATCH",
        path=ref.object_path(name=name, namespace=namespace, subresource=subresource),
        what=f"PATCH {ref.describe(name=name, namespace=namespace, subresource=subresource)}",
        accept=ACCEPT_JSON,
        content_type=CONTENT_MERGE_PATCH,
        body=json.dumps(body).encode(),
        timeout=timeout,
    )
    return cast(dict[str, Any], response.json())


def delete_object(
    api_client: ApiClient,
    ref: ResourceRef,
    *,
    name: str,
    namespace: str | None = None,
    resource_version: str | None = None,
    uid: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """DELETE an object, optionally only if it is still the one we read.

    ``uid`` / ``resource_version`` become DeleteOptions preconditions (409 if
    the object changed or was re-created).
    """
    preconditions: dict[str, str] = {}
    if uid:
        preconditions["uid"] = uid
    if resource_version:
        preconditions["resourceVersion"] = resource_version
    options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
    if preconditions:
        options["preconditions"] = preconditions
    request(
        api_client,
        method="DELETE",
        path=ref.object_path(name=name, namespace=namespace),
        what=f"DELETE {ref.describe(name=name, namespace=namespace)}",
        accept=ACCEPT_JSON,
        content_type=CONTENT_JSON,
        body=json.dumps(options).encode(),
        timeout=timeout,
    )
