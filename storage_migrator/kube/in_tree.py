"""Kubernetes' own migration API, ``storagemigration.k8s.io``, as detection reads it.

Design decision (issue 36, item 4): the in-tree controller in
kube-controller-manager (KEP-4192; ``v1beta1`` behind the ``StorageVersionMigrator``
gate in 1.35 and 1.36, ``v1`` GA in 1.37) migrates when anyone creates one of
its objects: ``kubectl``, Gardener, a provider's tooling. Detection observes
them, so this module reduces one raw object to what a poll, the ledger and
``history`` need: which resource, which phase, the list resourceVersion it
migrated up to (``status.resourceVersion``: tests/reference/svm-succeeded.json),
and who created it where the object says so. The version read is a parameter,
``v1`` preferred where it is served (:func:`in_tree_version`).

Who created it: the object carries no requester field. ``metadata.managedFields``
does: the manager that owns ``spec`` (immutable, so set only on create) made it
(``kubectl-create``, ``kubectl-client-side-apply``, ``kubectl`` for a server-side
apply, a controller's own name); kube-controller-manager's own entry is for the
``status`` subresource. Our label ``migration.k8s.io/requested-by`` is kept as
read, for whoever labels the objects they create.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final, Literal

from kubernetes.client import ApiClient
from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.kube.crds import as_mapping
from storage_migrator.kube.discovery import DiscoveredResource
from storage_migrator.kube.listing import iterate_items
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.transport import DEFAULT_TIMEOUT_SECONDS
from storage_migrator.kube.wire_time import parse_time

__all__ = [
    "IN_TREE_GROUP",
    "IN_TREE_KIND_NAME",
    "IN_TREE_RESOURCE",
    "IN_TREE_VERSIONS",
    "InTreeMigration",
    "InTreePhase",
    "creator_of",
    "in_tree_version",
    "list_in_tree",
]

IN_TREE_GROUP: Final = "storagemigration.k8s.io"
IN_TREE_RESOURCE: Final = "storageversionmigrations"  # the in-tree plural (ours shares it)
#: The versions of the in-tree API we read, preferred first (v1: GA in 1.37; v1beta1: 1.35, 1.36).
IN_TREE_VERSIONS: Final = ("v1", "v1beta1")
#: What a user types to read them: a bare ``storageversionmigrations`` may be ours (DESIGN 4.2).
IN_TREE_KIND_NAME: Final = f"{IN_TREE_RESOURCE}.{IN_TREE_GROUP}"

InTreePhase = Literal["Pending", "Running", "Succeeded", "Failed"]


def in_tree_version(discovered: Sequence[DiscoveredResource]) -> str | None:
    """The version of the in-tree API to read, ``v1`` where served, else ``v1beta1``; None: not served."""
    served = {r.version for r in discovered if r.group == IN_TREE_GROUP and r.resource == IN_TREE_RESOURCE}
    return next((v for v in IN_TREE_VERSIONS if v in served), None)


def creator_of(metadata: Mapping[str, Any]) -> str | None:
    """The field manager that created the object: the one owning ``spec``, not through ``status``.

    The earliest such entry wins (a server-side apply of the same spec by another
    manager shares ownership later). None when the object records no managers.
    """
    candidates: list[tuple[int, datetime | None, int, str]] = []
    for index, raw in enumerate(metadata.get("managedFields") or []):
        entry = as_mapping(raw)
        manager = entry.get("manager")
        if not isinstance(manager, str) or not manager or entry.get("subresource"):
            continue
        owns_spec = "f:spec" in as_mapping(entry.get("fieldsV1"))
        when = parse_time(entry.get("time"))
        # Owners of spec first; then the earliest; entries without a time after those with one.
        candidates.append((0 if owns_spec else 1, when, index, manager))
    if not candidates:
        return None
    candidates.sort(key=lambda c: (c[0], c[1] is None, c[1] or datetime.min, c[2]))
    return candidates[0][3]


class InTreeMigration(BaseModel):
    """One ``storagemigration.k8s.io`` StorageVersionMigration, reduced to what detection records."""

    model_config = ConfigDict(frozen=True)

    api_version: str = Field(description="storagemigration.k8s.io/v1 or /v1beta1: the version it was read in.")
    name: str
    uid: str
    group: str = Field(description="spec.resource.group; empty for the core group.")
    resource: str = Field(description="spec.resource.resource (the in-tree API names no version).")
    created_at: datetime | None = Field(default=None, description="metadata.creationTimestamp.")
    phase: InTreePhase = Field(description="Succeeded or Failed when that condition is True, else Running or Pending.")
    resource_version: str | None = Field(
        default=None,
        description=(
            "status.resourceVersion: the list resourceVersion the controller recorded when it started "
            "(a LIST with limit 1); it migrates every object not newer than it."
        ),
    )
    running_since: datetime | None = Field(default=None, description="The Running condition's lastTransitionTime.")
    finished_at: datetime | None = Field(
        default=None, description="The Succeeded or Failed condition's lastTransitionTime."
    )
    reason: str = Field(default="", description="The reason of the condition that gives the phase.")
    message: str = Field(default="", description="Its message (the controller's counts, or why it failed).")
    created_by: str | None = Field(
        default=None, description="The field manager that created it (creator_of); None: the object does not say."
    )
    labels: dict[str, str] = Field(default_factory=dict)

    @property
    def group_resource(self) -> str:
        """``<resource>.<group>`` or ``<resource>`` for core (a StorageState's name)."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def display_name(self) -> str:
        """How reports name it: ``storageversionmigrations.storagemigration.k8s.io/<name>``."""
        return f"{IN_TREE_KIND_NAME}/{self.name}"

    @classmethod
    def from_object(cls, obj: Mapping[str, Any], *, api_version: str = "") -> InTreeMigration | None:
        """Read a raw object as the API returns it; None without a name, uid or resource. `api_version`
        is the version it was listed in: a list's items may carry no apiVersion of their own (a real
        kube-apiserver leaves it out of a built-in type's items)."""
        metadata = as_mapping(obj.get("metadata"))
        resource = as_mapping(as_mapping(obj.get("spec")).get("resource"))
        name, uid, plural = metadata.get("name"), metadata.get("uid"), resource.get("resource")
        if not (isinstance(name, str) and name and isinstance(uid, str) and uid and isinstance(plural, str) and plural):
            return None
        status = as_mapping(obj.get("status"))
        conditions = {str(c.get("type")): c for c in map(as_mapping, status.get("conditions") or [])}

        def true(kind: str) -> Mapping[str, Any] | None:
            found = conditions.get(kind)
            return found if found is not None and found.get("status") == "True" else None

        phase: InTreePhase = "Pending"
        deciding: Mapping[str, Any] | None = None
        for kind in ("Succeeded", "Failed", "Running"):
            if (deciding := true(kind)) is not None:
                phase = kind  # type: ignore[assignment]
                break
        running = conditions.get("Running")
        rv = status.get("resourceVersion")
        labels = as_mapping(metadata.get("labels"))
        return cls(
            api_version=str(obj.get("apiVersion") or api_version),
            name=name,
            uid=uid,
            group=str(resource.get("group") or ""),
            resource=plural,
            created_at=parse_time(metadata.get("creationTimestamp")),
            phase=phase,
            resource_version=str(rv) if rv not in (None, "") else None,
            running_since=parse_time(running.get("lastTransitionTime")) if running is not None else None,
            finished_at=parse_time(deciding.get("lastTransitionTime")) if deciding and phase != "Running" else None,
            reason=str((deciding or {}).get("reason") or ""),
            message=str((deciding or {}).get("message") or ""),
            created_by=creator_of(metadata),
            labels={str(k): str(v) for k, v in labels.items()},
        )


def list_in_tree(api: ApiClient, version: str, *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> list[InTreeMigration]:
    """Every in-tree StorageVersionMigration, read in ``version`` (metadata, spec and status only)."""
    ref = ResourceRef(group=IN_TREE_GROUP, version=version, resource=IN_TREE_RESOURCE)
    listed_in = f"{IN_TREE_GROUP}/{version}"
    found = (
        InTreeMigration.from_object(item, api_version=listed_in)
        for item in iterate_items(api, ref, limit=500, timeout=timeout)
    )
    return [m for m in found if m is not None]
