"""Which resource a migration request names, checked against discovery.

Design decision (DESIGN 8 "bad input gives a clear error and changes
nothing"): a request names a resource the way an operator types it
(`secrets`, `deployments` with group `apps`, `widgets.example.com`); it is
resolved against what discovery serves before anything is created, and a name
that is not served fails with the list of what is. Pure functions over
discovery observations.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.kube.discovery import DiscoveredResource, pick_preferred
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.migration.chunk_terms import WriteMode

__all__ = ["MigrationTarget", "UnknownResource", "resolve_target", "write_mode_for"]


class UnknownResource(ValueError):
    """The request names a resource that discovery does not serve (or that cannot be migrated)."""


class MigrationTarget(BaseModel):
    """A resource to migrate, as discovery describes it now."""

    model_config = ConfigDict(frozen=True)

    ref: ResourceRef
    storage_version_hash: str = Field(description="The hash objects will be re-encoded to.")
    write_mode: WriteMode
    namespaced: bool


def write_mode_for(resource: DiscoveredResource) -> WriteMode:
    """Merge patch where the API serves `patch`; else PUT of the object as read (DESIGN 4.5)."""
    if "patch" in resource.verbs:
        return "patch"
    if "update" in resource.verbs:
        return "put"
    raise UnknownResource(
        f"{resource.group_resource} serves neither patch nor update (verbs: {', '.join(resource.verbs)}): "
        "its objects cannot be rewritten"
    )


def _split(resource: str, group: str) -> tuple[str, str]:
    """`widgets.example.com` with no group means resource `widgets` in group `example.com`."""
    if not group and "." in resource:
        name, _, rest = resource.partition(".")
        return name, rest
    return resource, group


def resolve_target(
    discovered: Sequence[DiscoveredResource], *, resource: str, group: str = "", version: str | None = None
) -> MigrationTarget:
    """The served, persisted resource the request names; `UnknownResource` otherwise."""
    name, grp = _split(resource.strip().lower(), group.strip().lower())
    persisted = [r for r in discovered if r.persisted and "list" in r.verbs]
    candidates = [r for r in persisted if r.resource == name and r.group == grp]
    if version:
        candidates = [r for r in candidates if r.version == version]
    else:
        candidates = pick_preferred(candidates) or candidates
    if not candidates:
        served = sorted({r.group_resource for r in persisted})
        wanted = f"{name}.{grp}" if grp else name
        if version:
            wanted += f" (version {version})"
        hint = ""
        same_name = sorted({r.group_resource for r in persisted if r.resource == name})
        if same_name and not version:
            hint = f"; did you mean {' or '.join(same_name)} (set group)?"
        raise UnknownResource(
            f"resource {wanted!r} is not served by this cluster as a persisted resource{hint}. "
            f"Served: {', '.join(served)}"
        )
    chosen = candidates[0]
    return MigrationTarget(
        ref=ResourceRef(group=chosen.group, version=chosen.version, resource=chosen.resource),
        storage_version_hash=chosen.storage_version_hash,
        write_mode=write_mode_for(chosen),
        namespaced=chosen.namespaced,
    )
