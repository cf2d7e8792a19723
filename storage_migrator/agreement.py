"""Whether the API servers agree on the version they encode a resource in (DESIGN 4.4).

Design decision: the sources of agreement are observations turned into one
shape, the reporters of seed 000 (:class:`storage_migrator.reporters.ReporterHash`),
so detection applies one set of rules whatever the source. Best first:

1. the StorageVersion API (seed 001, as shipped: ``internal.apiserver.k8s.io/v1alpha1``,
   reference/storageversion-core-secrets.json): one reporter per
   ``status.storageVersions[].apiServerID``; ``status.commonEncodingVersion`` is
   seed 001's ``agreedEncodingVersion`` and is absent while they differ;
2. one discovery poll per API server (each server's ``storageVersionHash``);
3. a single discovery document, only when there is one server.

Built-in resources only have StorageVersion objects (v1.36); custom resources
store in the version their CRD names, which every server reads from etcd, so
their discovery hash is one reporter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.crds import as_mapping, storage_version_hash
from storage_migrator.kube.discovery import DiscoveredResource
from storage_migrator.reporters import ReporterHash

__all__ = [
    "AgreementSource",
    "StorageVersionObservation",
    "reporters_from_storage_versions",
    "storage_version_name",
]

#: Which source told detection what each API server encodes (best first).
AgreementSource = Literal["storage-version-api", "discovery-per-server", "discovery"]

STORAGE_VERSION_GROUP: Final = "internal.apiserver.k8s.io"


def storage_version_name(group: str, resource: str) -> str:
    """The StorageVersion object of a resource: ``<group>.<resource>``, ``core`` for core (as shipped)."""
    return f"{group or 'core'}.{resource}"


class StorageVersionObservation(BaseModel):
    """One StorageVersion object as read: who encodes in what, and whether they agree."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="metadata.name, e.g. core.secrets or apps.deployments.")
    resource_version: str = Field(description="metadata.resourceVersion: moves whenever any server's entry changes.")
    common_encoding_version: str | None = Field(
        description="status.commonEncodingVersion (seed 001's agreedEncodingVersion); None while servers differ."
    )
    encodings: dict[str, str] = Field(
        description="apiServerID -> encodingVersion ('v1' for core, 'apps/v1' otherwise)."
    )

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> StorageVersionObservation:
        meta = as_mapping(obj.get("metadata"))
        status = as_mapping(obj.get("status"))
        encodings: dict[str, str] = {}
        for entry in status.get("storageVersions") or []:
            entry = as_mapping(entry)
            server, encoding = entry.get("apiServerID"), entry.get("encodingVersion")
            if isinstance(server, str) and server and isinstance(encoding, str) and encoding:
                encodings[server] = encoding
        common = status.get("commonEncodingVersion")
        return cls(
            name=str(meta.get("name", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            common_encoding_version=common if isinstance(common, str) and common else None,
            encodings=encodings,
        )

    def describe(self) -> str:
        """`apiserver-a: v1, apiserver-b: v2`, for messages."""
        return ", ".join(f"{server}: {encoding}" for server, encoding in sorted(self.encodings.items())) or "none"


def _hash_of(encoding_version: str, kind: str) -> str:
    group, _, version = encoding_version.rpartition("/")
    return storage_version_hash(group, version, kind)


def reporters_from_storage_versions(
    observations: Sequence[StorageVersionObservation], discovered: Sequence[DiscoveredResource]
) -> list[ReporterHash]:
    """One reporter per API server and resource, with the hash discovery would show for its encoding.

    The hash needs the stored kind, which discovery gives; a resource whose
    StorageVersion object is missing (custom resources, aggregated APIs) gets no
    reporter here, and the caller falls back to discovery for it.
    """
    by_name = {o.name: o for o in observations}
    out: list[ReporterHash] = []
    for entry in discovered:
        if not entry.storage_version_hash or "/" in entry.resource:
            continue
        observed = by_name.get(storage_version_name(entry.group, entry.resource))
        if observed is None:
            continue
        for server, encoding in sorted(observed.encodings.items()):
            out.append(
                ReporterHash(
                    reporter_id=server,
                    group=entry.group,
                    resource=entry.resource,
                    hash=_hash_of(encoding, entry.kind),
                )
            )
    return out
