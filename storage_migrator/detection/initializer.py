"""What the one-shot ``initialize`` flow does: the detection poll's first look at every resource.

Design decision (issue 24; DESIGN 4.3, 4.7; seed 002 "Alpha workflow"): there is
one path for the first look at a resource. ``initialize`` plans with
:func:`storage_migrator.detection.poll.plan_poll`, the function every detection poll
and ``storage-migrator plan`` use: it creates (or updates) each StorageState
with the hashes observed, through the same agreement rules, and requests a
migration only where seed 000 would (no StorageState yet, or persisted not
``[current]``). The state is written before its request, so the request starts
after the state recorded its hash and its success refines the state (seed 000:
a migration refines a state only if it started after that state recorded the
hash). An initializer that only requested migrations left the next poll with
no state to refine: it requested every migration a second time, every object
rewritten twice.

What is left here is the report: the origin of each request, and for every
group-resource no request was made for, why (structural, the include / exclude
lists, already requested, already migrated, API servers that disagree). Unlike
the alpha initializer, which "removes the custom resources and aggregated
resources from the comprehensive resource list", we keep them and say where
each came from (seed 002's Goals: "work for Kubernetes built-in APIs, custom
resources (CR), and aggregated APIs"); shared storage is found from discovery
(same hash, same plural), not from a hard-coded list. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.detection.actions import CreateMigration, CreateState, DeleteMigration, DetectionPlan, UpdateState
from storage_migrator.detection.observation import Observations
from storage_migrator.detection.poll import plan_poll
from storage_migrator.detection.tracking import SkippedResource, listed_out, track_storage
from storage_migrator.kube.crds import as_mapping
from storage_migrator.kube.discovery import DiscoveredResource, GroupVersionFailure
from storage_migrator.migration.dispatch import is_finished, migration_resource
from storage_migrator.models import UNKNOWN, storage_state_name
from storage_migrator.settings import Settings

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
    """A migration the initializer requests: one persisted resource in its preferred version."""

    model_config = ConfigDict(frozen=True)

    group: str = Field(description="API group; empty for core.")
    version: str = Field(description="The preferred version from discovery, the endpoint the migration uses.")
    resource: str = Field(description="Plural resource name.")
    origin: Origin = Field(
        description="'custom' (a CRD defines it), 'aggregated' (an APIService with a service), else 'built-in'."
    )
    storage_version_hash: str = Field(
        description="The hash it migrates to: the one the API servers agree on, recorded in its StorageState."
    )

    @property
    def group_resource(self) -> str:
        """``<resource>.<group>`` or ``<resource>`` for core."""
        return storage_state_name(self.group, self.resource)


class InitPlan(BaseModel):
    """The initializer's decision (a detection poll's plan) and its report."""

    model_config = ConfigDict(frozen=True)

    plan: DetectionPlan = Field(
        description=(
            "What to apply: the detection poll's plan (plan_poll) over the resources selected, "
            "each StorageState written before its migration request."
        )
    )
    requests: list[InitialRequest] = Field(
        default_factory=list, description="The migrations the plan requests, sorted by group then resource."
    )
    skipped: list[SkippedResource] = Field(
        default_factory=list,
        description="One entry per group-resource nothing is requested for, and why; sorted by group then resource.",
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
    seen: Observations,
    *,
    settings: Settings,
    apiservices: Sequence[ApiServiceInfo],
    now: datetime,
) -> InitPlan:
    """The detection poll's plan over every selected resource, and what it means for each.

    ``settings.include_resources`` / ``exclude_resources`` select the resources
    as they do for every poll (:func:`storage_migrator.detection.tracking.listed_out`).
    Group versions discovery could not read (most often an aggregated API whose
    server is down) do not stop the rest: they are reported, and the flow ends
    Failed naming them; the states of their resources are left alone, as a poll
    leaves them.
    """
    plan = plan_poll(seen, settings, now=now)
    tracking = track_storage(seen.discovered)
    crd_keys = {(crd.group, crd.plural) for crd in seen.crds}
    aggregated = {(svc.group, svc.version) for svc in apiservices if svc.has_service}
    requested = {a.group_resource: a for a in plan.of_kind(CreateMigration)}
    skipped = dict(tracking.skipped)
    requests: list[InitialRequest] = []
    for entry in tracking.kept:
        key, names = (entry.group, entry.resource), tracking.sharers[entry.group_resource]
        if (listed := listed_out(names, include=settings.include_resources,
                                 exclude=settings.exclude_resources)) is not None:  # fmt: skip
            skipped[key] = listed
        elif (action := requested.get(entry.group_resource)) is not None:
            requests.append(InitialRequest(group=entry.group, version=entry.version, resource=entry.resource,
                                           origin=_origin(entry, crds=crd_keys, aggregated=aggregated),
                                           storage_version_hash=action.target_hash))  # fmt: skip
        else:
            skipped[key] = _not_requested(entry.group_resource, names, plan, seen)
    # A CRD that discovery does not serve (not yet established) cannot be
    # migrated now: say so rather than drop it silently.
    for crd in seen.crds:
        if (crd.group, crd.plural) not in tracking.served:
            skipped.setdefault((crd.group, crd.plural), "defined by a CRD but not served by discovery")
    return InitPlan(
        plan=plan,
        requests=requests,
        unreachable=sorted(unreachable_reason(f) for f in seen.discovery_failures),
        skipped=[
            SkippedResource(group_resource=storage_state_name(group, resource), reason=reason)
            for (group, resource), reason in sorted(skipped.items())
        ],
    )


def _not_requested(name: str, names: Sequence[str], plan: DetectionPlan, seen: Observations) -> str:
    """Why the poll requests nothing for a tracked resource, from its planned state write."""
    write = next((a for a in plan.actions if isinstance(a, CreateState | UpdateState) and a.name == name), None)
    if write is None:  # pragma: no cover - plan_detection writes every tracked resource's state
        return "not planned"
    if write.persisted == [write.current_hash]:
        return f"already migrated: every object is stored in {write.current_hash} (its StorageState says so)"
    # Seed 003 runs requests for one resource one after another: a pending one (anyone's) is waited for.
    deleted = {a.name for a in plan.of_kind(DeleteMigration)}
    pending = sorted(m.metadata.name or "" for m in seen.migrations
                     if migration_resource(m) in names and not is_finished(m) and m.metadata.name not in deleted)  # fmt: skip
    if pending:
        return f"already requested: {pending[0]}"
    persisted = "" if write.persisted == [UNKNOWN] else f" (persisted {write.persisted})"
    return f"no migration yet{persisted}: {write.reason}"
