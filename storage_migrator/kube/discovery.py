"""Reading the legacy discovery documents into a flat list of resources.

Design decision: we read the per-group documents (``/api``, ``/api/<v>``,
``/apis``, ``/apis/<g>/<v>``) rather than the aggregated discovery document
because every API server since 1.14 serves them with ``storageVersionHash`` and
they are what seed 000's triggering controller polls. Parsing is pure
(``parse_*`` functions over ``TypedDict`` documents) so it is tested against the
recorded answers in ``shared/reference``; only ``discover`` talks HTTP.

Every served group version is read, not only the preferred one: a resource may
exist only in a non-preferred version. ``pick_preferred`` reduces that to one
entry per group and resource. A group version that fails to answer (an
aggregated API that is down) is reported in ``Discovery.failed`` instead of
failing the whole poll, so that a caller can tell "not served" from "unknown".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NotRequired, TypedDict, cast

from kubernetes.client import ApiClient
from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.kube.errors import KubeError
from storage_migrator.kube.transport import DEFAULT_TIMEOUT_SECONDS, request

__all__ = [
    "APIGroupDoc",
    "APIGroupListDoc",
    "APIResourceDoc",
    "APIResourceListDoc",
    "APIVersionsDoc",
    "DiscoveredResource",
    "Discovery",
    "GroupVersionDoc",
    "GroupVersionFailure",
    "discover",
    "parse_group_list",
    "parse_resource_list",
    "pick_preferred",
    "preferred_versions",
]


class APIVersionsDoc(TypedDict):
    """``GET /api``: the core group's versions."""

    kind: str
    versions: list[str]


class GroupVersionDoc(TypedDict):
    """One entry of ``APIGroup.versions`` (``{"groupVersion": "apps/v1", "version": "v1"}``)."""

    groupVersion: str
    version: str


class APIGroupDoc(TypedDict):
    """One entry of ``GET /apis``."""

    name: str
    versions: list[GroupVersionDoc]
    preferredVersion: NotRequired[GroupVersionDoc]


class APIGroupListDoc(TypedDict):
    """``GET /apis``: every group and the versions it serves."""

    kind: str
    groups: list[APIGroupDoc]


class APIResourceDoc(TypedDict):
    """One resource of a group version (``metav1.APIResource``)."""

    name: str
    namespaced: bool
    kind: str
    verbs: list[str]
    singularName: NotRequired[str]
    group: NotRequired[str]
    version: NotRequired[str]
    shortNames: NotRequired[list[str]]
    categories: NotRequired[list[str]]
    storageVersionHash: NotRequired[str]


class APIResourceListDoc(TypedDict):
    """``GET /api/<v>`` or ``GET /apis/<g>/<v>``."""

    kind: str
    groupVersion: str
    resources: list[APIResourceDoc]


class DiscoveredResource(BaseModel):
    """One resource of one served group version, as discovery describes it."""

    model_config = ConfigDict(frozen=True)

    group: str = Field(description="API group; empty for the core group.")
    version: str = Field(description="The group version this entry was read from.")
    resource: str = Field(description="Plural name, e.g. 'configmaps' or 'pods/status'.")
    kind: str = Field(description="The kind served at this endpoint.")
    namespaced: bool = Field(description="Whether objects live in namespaces.")
    verbs: tuple[str, ...] = Field(description="Verbs the endpoint serves.")
    storage_version_hash: str = Field(
        default="",
        description=(
            "Opaque hash of the storage version (group/version/kind objects are "
            "encoded in); empty for sub-resources and virtual resources, which are "
            "not persisted on their own."
        ),
    )
    is_subresource: bool = Field(description="True for 'pods/status' and the like.")
    preferred: bool = Field(
        default=False,
        description="Whether this version is the group's preferred version.",
    )

    @property
    def persisted(self) -> bool:
        """Whether objects of this resource are stored (has a hash, not a sub-resource)."""
        return bool(self.storage_version_hash) and not self.is_subresource

    @property
    def group_resource(self) -> str:
        """``<resource>.<group>`` or ``<resource>`` for core."""
        return f"{self.resource}.{self.group}" if self.group else self.resource


class GroupVersionFailure(BaseModel):
    """A group version whose document could not be read during a discovery poll."""

    group_version: str
    code: int
    reason: str
    message: str


class Discovery(BaseModel):
    """The result of one discovery poll."""

    resources: list[DiscoveredResource] = Field(default_factory=list)
    preferred_versions: dict[str, str] = Field(
        default_factory=dict,
        description="Group ('' for core) to its preferred version.",
    )
    failed: list[GroupVersionFailure] = Field(default_factory=list)


def _split_group_version(group_version: str) -> tuple[str, str]:
    group, _, version = group_version.rpartition("/")
    return group, version


def parse_resource_list(doc: APIResourceListDoc, *, preferred: bool = False) -> list[DiscoveredResource]:
    """Turn one group version document into ``DiscoveredResource`` entries."""
    group, version = _split_group_version(doc["groupVersion"])
    found: list[DiscoveredResource] = []
    for entry in doc.get("resources") or []:
        name = entry["name"]
        found.append(
            DiscoveredResource(
                # The endpoint's group version, even for sub-resources whose
                # entry names another kind's group (e.g. autoscaling Scale).
                group=group,
                version=version,
                resource=name,
                kind=entry.get("kind", ""),
                namespaced=bool(entry.get("namespaced", False)),
                verbs=tuple(entry.get("verbs") or ()),
                storage_version_hash=entry.get("storageVersionHash", "") or "",
                is_subresource="/" in name,
                preferred=preferred,
            )
        )
    return found


def parse_group_list(doc: APIGroupListDoc) -> list[tuple[str, str]]:
    """The (group, version) pairs ``/apis`` says are served, in server order."""
    return [(group["name"], gv["version"]) for group in doc.get("groups") or [] for gv in group.get("versions") or []]


def preferred_versions(*, core: APIVersionsDoc | None, groups: APIGroupListDoc | None) -> dict[str, str]:
    """Each group's preferred version ('' is core: its first listed version)."""
    chosen: dict[str, str] = {}
    if core and core.get("versions"):
        chosen[""] = core["versions"][0]
    for group in (groups.get("groups") or []) if groups else []:
        pref = group.get("preferredVersion")
        if pref:
            chosen[group["name"]] = pref["version"]
        elif group.get("versions"):
            chosen[group["name"]] = group["versions"][0]["version"]
    return chosen


def pick_preferred(resources: Iterable[DiscoveredResource]) -> list[DiscoveredResource]:
    """One entry per (group, resource): the preferred version's, else the first served.

    Pure: the storage version hash is the same in every version of a group
    (it names the storage version), so one entry is enough to detect changes.
    """
    chosen: dict[tuple[str, str], DiscoveredResource] = {}
    for entry in resources:
        key = (entry.group, entry.resource)
        current = chosen.get(key)
        if current is None or (entry.preferred and not current.preferred):
            chosen[key] = entry
    return list(chosen.values())


def _get_json(api_client: ApiClient, path: str, *, timeout: float) -> Any:
    return request(api_client, method="GET", path=path, what=f"discovery {path}", timeout=timeout).json()


def discover(api_client: ApiClient, *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> Discovery:
    """Read every served group version; failures of single group versions are reported.

    ``/api`` and ``/apis`` themselves failing raises: without them we know nothing.
    """
    core = cast(APIVersionsDoc, _get_json(api_client, "/api", timeout=timeout))
    groups = cast(APIGroupListDoc, _get_json(api_client, "/apis", timeout=timeout))
    preferred = preferred_versions(core=core, groups=groups)
    targets: list[tuple[str, str]] = [("", v) for v in core.get("versions") or []]
    targets += parse_group_list(groups)
    result = Discovery(preferred_versions=preferred)
    for group, version in targets:
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        group_version = f"{group}/{version}" if group else version
        try:
            doc = cast(APIResourceListDoc, _get_json(api_client, path, timeout=timeout))
        except KubeError as err:
            result.failed.append(
                GroupVersionFailure(
                    group_version=group_version,
                    code=err.code,
                    reason=err.reason,
                    message=err.message,
                )
            )
            continue
        doc.setdefault("groupVersion", group_version)
        result.resources.extend(parse_resource_list(doc, preferred=preferred.get(group) == version))
    return result
