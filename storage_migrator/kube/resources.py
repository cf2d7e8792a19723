"""Resource coordinates and the URL paths they map to.

Design decision: migrated objects are addressed by group/version/resource only
(never by a typed client class), so one ``ResourceRef`` reaches built-in
resources, custom resources and aggregated APIs alike. Path building lives here
and nowhere else: core group under ``/api/v1``, every other group under
``/apis/<group>/<version>``, namespaced objects under ``namespaces/<ns>``.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["ResourceRef"]

# DNS-1123 subdomain for groups; lowercase path segment for versions and resources.
_GROUP_RE: Final = re.compile(r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SEGMENT_RE: Final = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def _segment(value: str, *, what: str) -> str:
    """Quote one path segment; names with '/' or '..' must not change the path."""
    if not value or value in {".", ".."} or "/" in value:
        raise ValueError(f"invalid {what} {value!r}: must be a non-empty path segment without '/'")
    return quote(value, safe="")


class ResourceRef(BaseModel):
    """A group/version/resource: what a migration, a LIST or a write targets.

    ``group`` is empty for the core group (``configmaps`` is ``("", "v1",
    "configmaps")``).
    """

    model_config = ConfigDict(frozen=True)

    group: str = Field(default="", description="API group; empty for the core group.")
    version: str = Field(description="API version served, e.g. 'v1'.")
    resource: str = Field(description="Plural resource name, e.g. 'configmaps'.")

    @field_validator("group")
    @classmethod
    def _check_group(cls, value: str) -> str:
        if not _GROUP_RE.match(value):
            raise ValueError(f"invalid API group {value!r}: expected a DNS subdomain or '' for core")
        return value

    @field_validator("version", "resource")
    @classmethod
    def _check_segment(cls, value: str) -> str:
        if not _SEGMENT_RE.match(value):
            raise ValueError(f"invalid version/resource {value!r}: expected lowercase letters, digits, '-' or '.'")
        return value

    @property
    def api_version(self) -> str:
        """The ``apiVersion`` string: ``v1`` for core, ``<group>/<version>`` else."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """``<resource>.<group>``, or ``<resource>`` for core (StorageState naming)."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def group_version_path(self) -> str:
        """``/api/v1`` for core, ``/apis/<group>/<version>`` for every other group."""
        if self.group:
            return f"/apis/{self.group}/{self.version}"
        return f"/api/{self.version}"

    def collection_path(self, *, namespace: str | None = None) -> str:
        """Path of the collection: cluster-wide (all namespaces) unless ``namespace``."""
        if namespace:
            ns = _segment(namespace, what="namespace")
            return f"{self.group_version_path}/namespaces/{ns}/{self.resource}"
        return f"{self.group_version_path}/{self.resource}"

    def object_path(
        self,
        *,
        name: str,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> str:
        """Path of one object (``namespace`` empty or None for cluster-scoped ones)."""
        path = f"{self.collection_path(namespace=namespace)}/{_segment(name, what='name')}"
        if subresource:
            path += f"/{_segment(subresource, what='subresource')}"
        return path

    def describe(self, *, name: str, namespace: str | None = None, subresource: str | None = None) -> str:
        """Name one object for messages: ``configmaps.v1 default/cm-1``."""
        where = f"{namespace}/{name}" if namespace else name
        return f"{self} {where}/{subresource}" if subresource else f"{self} {where}"

    def __str__(self) -> str:
        # kubectl's fully qualified form: deployments.v1.apps, configmaps.v1
        return ".".join(part for part in (self.resource, self.version, self.group) if part)
