"""Which discovered resources have a storage of their own: what detection and initialization track.

Design decision (DESIGN 4.3, 4.7): one rule, shared by the one-shot
initializer and the detection poll, so both agree on what "a resource" is.
One entry per persisted group-resource, in its preferred version (all versions
of a group-resource share one storage version, hence one hash). Left out, each
with a human reason: sub-resources (stored with their parent), resources with
an empty ``storageVersionHash`` (virtual resources such as ``tokenreviews``),
resources the migrator cannot list or rewrite (seed 002: it must "get, list,
and update all resources"), and all but one of the resources that share a
storage (same hash and same plural in different groups: core ``events`` and
``events.events.k8s.io``; the group that sorts first is kept, ``''`` first).
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.kube.discovery import DiscoveredResource, pick_preferred
from storage_migrator.models import storage_state_name

__all__ = [
    "SkippedResource",
    "StorageTracking",
    "listed_out",
    "select_resources",
    "track_storage",
    "tracked_resources",
    "unfit_reason",
]


class SkippedResource(BaseModel):
    """A group-resource that is left out, and why."""

    model_config = ConfigDict(frozen=True)

    group_resource: str = Field(description="``<resource>.<group>`` or ``<resource>`` for core.")
    reason: str = Field(description="Why it is left out, for a person to read.")


@dataclass(frozen=True)
class StorageTracking:
    """The full answer of :func:`track_storage`, for callers that need more than the lists."""

    #: One entry per tracked storage, sorted by (group, resource).
    kept: list[DiscoveredResource]
    #: (group, resource) -> reason, for every group-resource left out.
    skipped: dict[tuple[str, str], str]
    #: Kept group-resource name -> all names of its storage (itself first, then the sharers).
    sharers: dict[str, list[str]]
    #: Every (group, resource) discovery serves, tracked or not.
    served: set[tuple[str, str]] = field(default_factory=set)

    def skipped_resources(self) -> list[SkippedResource]:
        """The skipped entries as :class:`SkippedResource`, sorted by group then resource."""
        return [
            SkippedResource(group_resource=storage_state_name(group, resource), reason=reason)
            for (group, resource), reason in sorted(self.skipped.items())
        ]


def unfit_reason(entry: DiscoveredResource) -> str | None:
    """Why this resource has no storage the migrator can rewrite, or None (DESIGN 4.3, 4.7)."""
    # Sub-resources are stored with their parent (DESIGN 4.3, 4.7).
    if entry.is_subresource:
        return "sub-resource: stored with its parent resource"
    # Virtual resources (tokenreviews, bindings) have no storage (DESIGN 4.3).
    if not entry.storage_version_hash:
        return "not persisted: no storageVersionHash"
    # Seed 002: the migrator must "get, list, and update all resources"; a merge
    # patch does the no-op write where the API serves it (DESIGN 4.5).
    if "list" not in entry.verbs:
        return f"cannot be listed: no list verb (serves {', '.join(entry.verbs) or 'nothing'})"
    if "update" not in entry.verbs and "patch" not in entry.verbs:
        return f"cannot be rewritten: neither update nor patch (serves {', '.join(entry.verbs)})"
    return None


def track_storage(discovered: Sequence[DiscoveredResource]) -> StorageTracking:
    """Pick one preferred entry per persisted storage; say why every other one is left out."""
    chosen = sorted(pick_preferred(discovered), key=lambda r: (r.group, r.resource))
    skipped: dict[tuple[str, str], str] = {}
    fit: list[DiscoveredResource] = []
    for entry in chosen:
        reason = unfit_reason(entry)
        if reason is None:
            fit.append(entry)
        else:
            skipped[(entry.group, entry.resource)] = reason

    # Shared storage (DESIGN 4.3, 4.7; seed 002 "removes resources that share the
    # same storage"): same hash and same plural in different groups is one
    # storage; keep the group that sorts first ('' first: core `events` is kept,
    # `events.events.k8s.io` is not). `fit` is sorted by group, so the first seen wins.
    keeper: dict[tuple[str, str], DiscoveredResource] = {}
    sharers: dict[str, list[str]] = {}
    kept: list[DiscoveredResource] = []
    for entry in fit:
        key = (entry.storage_version_hash, entry.resource)
        first = keeper.setdefault(key, entry)
        names = sharers.setdefault(first.group_resource, [first.group_resource])
        if first is entry:
            kept.append(entry)
        else:
            names.append(entry.group_resource)
            skipped[(entry.group, entry.resource)] = f"shares storage with {first.group_resource}"

    return StorageTracking(
        kept=kept,
        skipped=skipped,
        sharers=sharers,
        served={(r.group, r.resource) for r in chosen},
    )


def tracked_resources(
    discovered: Sequence[DiscoveredResource],
) -> tuple[list[DiscoveredResource], list[SkippedResource]]:
    """The resources to track (sorted by group, resource) and the ones left out, with reasons."""
    tracking = track_storage(discovered)
    return tracking.kept, tracking.skipped_resources()


def listed_out(names: Sequence[str], *, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> str | None:
    """Why the include / exclude lists leave out the storage known by ``names`` (the kept name
    first, then its sharers), or None when they keep it.

    The lists speak of storage (DESIGN 4.7): naming either of two resources that
    share one (core ``events`` and ``events.events.k8s.io``) selects, or excludes,
    that one storage. Names are ``<resource>`` (core) or ``<resource>.<group>``,
    matched without case; an empty include list means all; exclude applies after it.
    """
    included = {n.strip().lower() for n in include if n.strip()}
    excluded = {n.strip().lower() for n in exclude if n.strip()}
    if included and not included.intersection(names):
        return "not in the include list"
    if hits := [n for n in names if n in excluded]:
        as_other = names[0] not in hits
        return "in the exclude list" + (f" (as {', '.join(hits)}, which shares its storage)" if as_other else "")
    return None


def select_resources(
    discovered: Sequence[DiscoveredResource], *, include: Sequence[str] = (), exclude: Sequence[str] = ()
) -> list[DiscoveredResource]:
    """The entries an operator asked to track (DESIGN 5: resources to include / exclude).

    One rule for detection, ``initialize`` and ``rbac`` (:func:`listed_out`): the
    lists speak of storage, so every name of a shared storage follows the name given.
    A sub-resource follows its parent.
    """
    if not any(n.strip() for n in [*include, *exclude]):
        return list(discovered)
    names_of = {name: names for names in track_storage(discovered).sharers.values() for name in names}
    out = []
    for entry in discovered:
        name = storage_state_name(entry.group, entry.resource.split("/", 1)[0])
        if listed_out(names_of.get(name, [name]), include=include, exclude=exclude) is None:
            out.append(entry)
    return out
