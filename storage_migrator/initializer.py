"""What the one-shot ``initialize`` flow requests: a migration per persisted resource.

Design decision (DESIGN 4.7, seed 002 "Alpha workflow"): the decision is a
pure function of observations (discovery, CRDs, APIServices, existing
migrations), so every rule is table-tested and the flow only reads, plans and
creates. Unlike the alpha initializer, which "removes the custom resources and
aggregated resources from the comprehensive resource list", we keep them and
record where each came from (``origin``): seed 002's Goals ask that the tool
"work for Kubernetes built-in APIs, custom resources (CR), and aggregated
APIs". Shared storage is detected from discovery (same storageVersionHash,
same plural) instead of the alpha's hard-coded list. Everything left out is
reported with a human reason, one entry per group-resource.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.crds import CrdObservation, as_mapping
from storage_migrator.dispatch import is_finished, migration_resource
from storage_migrator.kube.discovery import DiscoveredResource, GroupVersionFailure
from storage_migrator.models import StorageVersionMigration, storage_state_name
from storage_migrator.tracking import SkippedResource, track_storage

__all__ = [
    "ApiServiceInfo",
    "InitPlan",
    "InitialRequest",
    "Origin",
    "SkippedResource",
    "plan_initialization",
    "unreachable_reason",
]

Origin = Literal["built-in", "custom", "aggregated"]


class ApiServiceInfo(BaseModel):
    """An APIService: which group version it serves, and whether another server serves it."""

    model_config = ConfigDict(frozen=True)

    group: str = Field(description="spec.group; empty for the core group ('v1.').")
    version: str = Field(description="spec.version.")
    has_service: bool = Field(
        description=(
            "spec.service is set: an aggregated API server serves this group version "
            "(local APIServices of kube-apiserver have spec.service null)."
        )
    )

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ApiServiceInfo:
        """Read a raw ``apiregistration.k8s.io/v1`` APIService as the API returns it."""
        spec = as_mapping(obj.get("spec"))
        version = spec.get("version")
        if not isinstance(version, str) or not version:
            name = as_mapping(obj.get("metadata")).get("name", "<unnamed>")
            raise ValueError(f"APIService {name!r} has no spec.version")
        return cls(group=str(spec.get("group") or ""), version=version, has_service=spec.get("service") is not None)


class InitialRequest(BaseModel):
    """A migration the initializer creates: one persisted resource in its preferred version."""

    model_config = ConfigDict(frozen=True)

    group: str = Field(description="API group; empty for core.")
    version: str = Field(description="The preferred version from discovery, the endpoint the migration uses.")
    resource: str = Field(description="Plural resource name.")
    origin: Origin = Field(
        description="'custom' (a CRD defines it), 'aggregated' (an APIService with a service), else 'built-in'."
    )
    storage_version_hash: str = Field(description="The storageVersionHash discovery shows now.")

    @property
    def group_resource(self) -> str:
        """``<resource>.<group>`` or ``<resource>`` for core."""
        return storage_state_name(self.group, self.resource)


class InitPlan(BaseModel):
    """The initializer's decision: what to create and what was left out."""

    model_config = ConfigDict(frozen=True)

    requests: list[InitialRequest] = Field(
        default_factory=list, description="Migrations to create, sorted by group then resource."
    )
    skipped: list[SkippedResource] = Field(
        default_factory=list, description="One entry per group-resource left out, sorted by group then resource."
    )
    unreachable: list[str] = Field(
        default_factory=list,
        description=(
            "Group versions whose discovery failed (an aggregated API server down answers 503): "
            "their resources are not known, so none was requested. Sorted."
        ),
    )

    @property
    def complete(self) -> bool:
        """Whether every served group version was seen (else the run must say what it missed)."""
        return not self.unreachable


def unreachable_reason(failure: GroupVersionFailure) -> str:
    """What an operator reads about a group version discovery could not read, and what to do."""
    return (
        f"{failure.group_version}: discovery answered {failure.code} {failure.reason} ({failure.message}); "
        "its resources were not requested. Make the API service behind it available "
        "(kubectl get apiservices.apiregistration.k8s.io) or remove it, then run initialize again"
    )


def _origin(entry: DiscoveredResource, *, crds: set[tuple[str, str]], aggregated: set[tuple[str, str]]) -> Origin:
    """Seed 002: custom resources "via listing CRDs", aggregated ones "via listing all
    apiservices that have .spec.service != null"; the rest are built-in."""
    if (entry.group, entry.resource) in crds:
        return "custom"
    if (entry.group, entry.version) in aggregated:
        return "aggregated"
    return "built-in"


def plan_initialization(
    discovered: Sequence[DiscoveredResource],
    *,
    crds: Sequence[CrdObservation],
    apiservices: Sequence[ApiServiceInfo],
    existing: Sequence[StorageVersionMigration],
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    unreachable: Sequence[GroupVersionFailure] = (),
) -> InitPlan:
    """One migration request per persisted resource that is not already pending.

    ``unreachable`` are the group versions discovery could not read. On a real
    cluster that is most often an aggregated API whose server is down (503 from
    the aggregator); refusing to plan anything then would leave every other
    resource unmigrated because of, say, a broken metrics-server. They are
    reported in the plan instead, and the flow ends Failed naming them.

    ``include`` / ``exclude`` name resources as ``<resource>`` (core) or
    ``<resource>.<group>``. They speak of storage: naming either of two
    resources that share storage selects (or excludes) that one storage, which
    is migrated through the name kept.
    """
    included = {name.strip().lower() for name in include if name.strip()}
    excluded = {name.strip().lower() for name in exclude if name.strip()}
    crd_keys = {(crd.group, crd.plural) for crd in crds}
    aggregated = {(svc.group, svc.version) for svc in apiservices if svc.has_service}

    # One entry per storage, in its preferred version (storage_migrator.tracking).
    tracking = track_storage(discovered)
    skipped = dict(tracking.skipped)
    sharers = tracking.sharers
    kept = tracking.kept

    # Pending requests of any name of a storage count: seed 003 runs requests
    # for one resource serially, a second one would only re-do the work.
    pending: dict[str, str] = {}
    for migration in sorted(existing, key=lambda m: m.metadata.name or ""):
        if not is_finished(migration):
            name = migration.metadata.name or migration.metadata.generate_name or "<unnamed>"
            pending.setdefault(migration_resource(migration), name)

    requests: list[InitialRequest] = []
    for entry in kept:
        key = (entry.group, entry.resource)
        names = sharers[entry.group_resource]
        if included and not included.intersection(names):
            skipped[key] = "not in the include list"
        elif hits := [n for n in names if n in excluded]:
            as_other = entry.group_resource not in hits
            skipped[key] = "in the exclude list" + (
                f" (as {', '.join(hits)}, which shares its storage)" if as_other else ""
            )
        elif requested := next((pending[n] for n in names if n in pending), None):
            skipped[key] = f"already requested: {requested}"
        else:
            requests.append(
                InitialRequest(
                    group=entry.group,
                    version=entry.version,
                    resource=entry.resource,
                    origin=_origin(entry, crds=crd_keys, aggregated=aggregated),
                    storage_version_hash=entry.storage_version_hash,
                )
            )

    # A CRD that discovery does not serve (not yet established) cannot be
    # migrated now: say so rather than drop it silently.
    for crd in crds:
        if (crd.group, crd.plural) not in tracking.served:
            skipped.setdefault((crd.group, crd.plural), "defined by a CRD but not served by discovery")

    return InitPlan(
        requests=requests,
        unreachable=sorted(unreachable_reason(f) for f in unreachable),
        skipped=[
            SkippedResource(group_resource=storage_state_name(group, resource), reason=reason)
            for (group, resource), reason in sorted(skipped.items())
        ],
    )
