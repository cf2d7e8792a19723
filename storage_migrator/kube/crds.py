"""What we read of a CustomResourceDefinition, and the storage version hash.

Design decision: one reading of a raw CRD for every planner (the initializer
tells custom resources apart by group and plural; detection checks the storage
version's hash before trimming `status.storedVersions`), and one place that
computes a `storageVersionHash` as kube-apiserver does.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from typing import Any, Final

from kubernetes.client import ApiClient
from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.kube.listing import iterate_items
from storage_migrator.kube.resources import ResourceRef

__all__ = ["CRDS", "CrdObservation", "as_mapping", "read_crds", "storage_version_hash"]

CRDS: Final = ResourceRef(group="apiextensions.k8s.io", version="v1", resource="customresourcedefinitions")


def storage_version_hash(group: str, version: str, kind: str) -> str:
    """The ``storageVersionHash`` discovery shows for objects stored as group/version/kind.

    As kube-apiserver computes it: base64 of the first 8 bytes of the SHA-256
    of ``"<group>/<version>/<kind>"`` (``""`` for the core group).
    """
    digest = hashlib.sha256(f"{group}/{version}/{kind}".encode()).digest()
    return base64.b64encode(digest[:8]).decode("ascii")


def as_mapping(value: Any) -> Mapping[str, Any]:
    """A field of a raw API object as a mapping ({} when absent or of another type)."""
    return value if isinstance(value, Mapping) else {}


class CrdObservation(BaseModel):
    """A CustomResourceDefinition, reduced to what refinement needs (seed 000, DESIGN 4.3)."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="metadata.name, e.g. 'widgets.example.com'.")
    group: str = Field(description="spec.group.")
    plural: str = Field(description="spec.names.plural: the resource name.")
    kind: str = Field(description="spec.names.kind: part of the storage version hash.")
    storage_version: str = Field(description="The version marked storage: true.")
    stored_versions: list[str] = Field(
        default_factory=list,
        description="status.storedVersions: versions objects may still be stored in.",
    )
    resource_version: str = Field(description="metadata.resourceVersion: guards the trim against a concurrent edit.")

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> CrdObservation | None:
        """Read a raw ``apiextensions.k8s.io/v1`` CRD; None when it lacks what a trim needs."""
        metadata = as_mapping(obj.get("metadata"))
        spec = as_mapping(obj.get("spec"))
        names = as_mapping(spec.get("names"))
        status = as_mapping(obj.get("status"))
        storage = ""
        for version in spec.get("versions") or []:
            entry = as_mapping(version)
            if entry.get("storage") is True:
                storage = str(entry.get("name") or "")
                break
        else:
            storage = str(spec.get("version") or "")
        fields: dict[str, str] = {}
        for key, value in (
            ("name", metadata.get("name")),
            ("group", spec.get("group")),
            ("plural", names.get("plural")),
            ("kind", names.get("kind")),
            ("resource_version", metadata.get("resourceVersion")),
        ):
            if not isinstance(value, str) or not value:
                return None
            fields[key] = value
        if not storage:
            return None
        stored = status.get("storedVersions") or []
        return cls(
            storage_version=storage,
            stored_versions=[str(v) for v in stored] if isinstance(stored, list) else [],
            **fields,
        )

    @property
    def storage_version_hash(self) -> str:
        """The hash discovery shows while ``storage_version`` is the storage version."""
        return storage_version_hash(self.group, self.storage_version, self.kind)


def read_crds(api: ApiClient) -> list[CrdObservation]:
    """Every CRD of the cluster that has what a trim needs (the others cannot be refined)."""
    return [c for c in (CrdObservation.from_object(o) for o in iterate_items(api, CRDS, limit=500)) if c]
