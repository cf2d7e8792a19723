"""Which engine rewrites a migration's objects: ours (`client`) or kube-controller-manager's (`in-tree`).

Design decision (issue 36, "Prefect orders, shows and records; the cluster decides"):
the setting `engine` (storage_migrator/settings/engine.py) says what the operator
wants; the cluster's answers decide what runs:

- `client` is this project's chunk loop (DESIGN 4.5), whatever the cluster serves;
- `in-tree` needs the cluster to serve `storagemigration.k8s.io` (v1, else
  v1beta1) and the resource to be one kcm's controller can migrate
  (:func:`in_tree_refusal`); otherwise the request fails at once, naming the fix;
- `auto` is `in-tree` where both hold and the controller is seen working, else
  `client`, and says why. "Seen working" is evidence in the cluster, not a
  version number: the API is served while kcm's gate may be off, so a run creates
  its in-tree object and waits (``in_tree_pickup_seconds``) for the controller
  to record ``status.resourceVersion``, which kcm does at first sight, before any
  write. Not picked up: the object is deleted and the run falls back, and its
  request says so (``IN_TREE_UNSEEN_ANNOTATION``); later runs of the cluster
  read that from the requests and fall back at once for
  ``in_tree_recheck_seconds`` instead of waiting again.

Pure: observations in, a choice out. Where the setting comes from (the
install in pull mode, the cluster's deployment in push mode) is
:func:`engine_parameter_refusal`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.kube.discovery import DiscoveredResource
from storage_migrator.models import GROUP, StorageVersionMigration, format_time
from storage_migrator.settings.engine import EngineSetting

__all__ = [
    "ENGINE_ANNOTATION",
    "ENGINE_NOTE_ANNOTATION",
    "GC_IGNORED",
    "IN_TREE_FIX",
    "IN_TREE_UNSEEN_ANNOTATION",
    "Engine",
    "EngineChoice",
    "choose_engine",
    "engine_parameter_refusal",
    "in_tree_refusal",
    "recent_unseen",
]

#: The engine that ran a request last (`client` or `in-tree`), on the request: `status` shows it.
ENGINE_ANNOTATION: Final = f"{GROUP}/engine"
#: Why that engine (auto's choice, a fallback), on the request.
ENGINE_NOTE_ANNOTATION: Final = f"{GROUP}/engine-note"
#: When `auto` saw kcm's controller not pick up an in-tree migration of this request (RFC 3339).
IN_TREE_UNSEEN_ANNOTATION: Final = f"{GROUP}/in-tree-not-picked-up-at"

Engine = Literal["client", "in-tree"]

#: Resources kcm's garbage collector ignores (pkg/controller/garbagecollector, DefaultIgnoredResources):
#: its migrator reads objects from the collector's cache, so it fails them ("no monitor found").
GC_IGNORED: Final = frozenset({("", "events"), ("events.k8s.io", "events")})
#: What the collector watches (list, watch, delete) and what the migrator asks (update, patch, list).
_GC_VERBS: Final = frozenset({"list", "watch", "delete"})
_MIGRATOR_VERBS: Final = frozenset({"update", "patch", "list"})

#: What an operator does when the in-tree engine cannot be used for a resource.
IN_TREE_FIX: Final = (
    "set STORAGE_MIGRATOR_ENGINE=auto (the client engine then migrates it, and needs list and patch on it: "
    "storage-migrator rbac --resources RESOURCE) or leave the resource out (STORAGE_MIGRATOR_EXCLUDE_RESOURCES)"
)


class EngineChoice(BaseModel):
    """What a run does: which engine, whether it may still fall back, and why (for the log,
    the request's condition message and the ledger)."""

    model_config = ConfigDict(frozen=True)

    engine: Engine
    may_fall_back: bool = Field(
        default=False, description="auto chose in-tree: a controller that does not pick it up sends it to client."
    )
    note: str = Field(default="", description="Why this engine, when the setting alone does not say it.")
    refusal: str | None = Field(
        default=None, description="in-tree was asked and cannot be used: the request fails with this, naming the fix."
    )
    in_tree_version: str | None = Field(
        default=None, description="The in-tree API's version to use (v1, else v1beta1)."
    )


def in_tree_refusal(resource: DiscoveredResource, *, aggregated_groups: frozenset[str]) -> str | None:
    """Why kcm's controller cannot migrate `resource`, or None.

    Issue 36: "It cannot migrate aggregated APIs, nor resources the garbage collector
    ignores." kcm reads the objects from its garbage collector's cache of
    kube-apiserver's own resources, so: an aggregated API (an APIService with a
    service), `events` (ignored by the collector), a resource the collector does
    not watch (it needs list, watch and delete), and one the migrator refuses itself
    (it needs update, patch and list: `resource ... does not support discovery
    operations`)."""
    name = resource.group_resource
    if resource.group in aggregated_groups:
        return (f"{name} is served by an aggregated API server (an APIService with a service): kube-controller-"
                "manager's migrator reads only kube-apiserver's own resources")  # fmt: skip
    if (resource.group, resource.resource) in GC_IGNORED:
        return (f"{name}: kube-controller-manager's garbage collector ignores events, and its migrator fails "
                "what the collector does not watch ('resource does not exist in GC')")  # fmt: skip
    verbs = set(resource.verbs)
    if not verbs >= _GC_VERBS:
        missing = ", ".join(sorted(_GC_VERBS - verbs))
        return f"{name} serves no {missing}: kube-controller-manager's garbage collector does not watch it"
    if not verbs >= _MIGRATOR_VERBS:
        missing = ", ".join(sorted(_MIGRATOR_VERBS - verbs))
        return f"{name} serves no {missing}: kube-controller-manager's migrator refuses it"
    return None


def recent_unseen(
    requests: Sequence[StorageVersionMigration], *, now: datetime, within_seconds: float
) -> tuple[str, datetime] | None:
    """The newest request on which `auto` saw kcm's controller not working, if within the window."""
    seen: list[tuple[datetime, str]] = []
    for request in requests:
        raw = (request.metadata.annotations or {}).get(IN_TREE_UNSEEN_ANNOTATION)
        if not raw:
            continue
        try:
            at = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            continue  # not ours to judge: an annotation edited by hand is no evidence
        if at.tzinfo is not None and 0 <= (now - at).total_seconds() <= within_seconds:
            seen.append((at, request.metadata.name or ""))
    if not seen:
        return None
    at, name = max(seen)
    return name, at


def _not_served(setting: EngineSetting) -> str:
    return (f"engine {setting}: this cluster does not serve storagemigration.k8s.io (v1 since Kubernetes 1.37; "
            "v1beta1 in 1.35 and 1.36 with --runtime-config=storagemigration.k8s.io/v1beta1=true and the "
            "StorageVersionMigrator feature gate on kube-apiserver and kube-controller-manager)")  # fmt: skip


def choose_engine(
    setting: EngineSetting,
    *,
    served_version: str | None,
    refusal: str | None,
    unseen: tuple[str, datetime] | None,
    recheck_seconds: float,
) -> EngineChoice:
    """The engine of one run, from the setting and what the cluster answered.

    `served_version` is the in-tree API's version discovery serves (v1, else v1beta1; None:
    not served); `refusal` is :func:`in_tree_refusal`'s for the resource; `unseen` is
    :func:`recent_unseen`'s (a request of this cluster on which `auto` saw the controller
    not working, recently). `in-tree` ignores `unseen`: it tries, and fails if not picked up."""
    if setting == "client":
        return EngineChoice(engine="client")
    if setting == "in-tree":
        if served_version is None:
            return EngineChoice(engine="in-tree", refusal=f"{_not_served(setting)}: enable it, or {IN_TREE_FIX}")
        if refusal is not None:
            return EngineChoice(engine="in-tree", refusal=f"engine in-tree: {refusal}: {IN_TREE_FIX}")
        return EngineChoice(
            engine="in-tree",
            in_tree_version=served_version,
            note=f"engine in-tree (storagemigration.k8s.io/{served_version})",
        )
    if served_version is None:
        return EngineChoice(engine="client", note=f"{_not_served(setting)}: the client engine")
    if refusal is not None:
        return EngineChoice(engine="client", note=f"engine auto: {refusal}: the client engine")
    if unseen is not None:
        name, at = unseen
        return EngineChoice(engine="client", note=(
            f"engine auto: kube-controller-manager's migration controller did not pick up the in-tree migration of "
            f"request {name} at {format_time(at)} (less than {recheck_seconds:g} s ago): the client engine without "
            "trying again"))  # fmt: skip
    return EngineChoice(engine="in-tree", may_fall_back=True, in_tree_version=served_version,
                        note=f"engine auto: in-tree (storagemigration.k8s.io/{served_version} served)")  # fmt: skip


def engine_parameter_refusal(
    asked: EngineSetting | None, *, install: EngineSetting, pull_mode: str | None
) -> str | None:
    """Why a run may not use the engine its parameters ask for, or None.

    "The cluster decides": in pull mode (a worker of the cluster's own, with the install's
    credentials) the engine is the install's, from its ConfigMap storage-migrator-cluster;
    the Prefect API may repeat it (the parameter `storage-migrator fleet add --engine` puts on
    the cluster's deployments) but not change it. In push mode the Prefect server already
    holds the cluster's credentials, so its parameter chooses."""
    if asked is None or pull_mode is None or asked == install:
        return None
    return (f"the run asks for engine {asked}, and cluster {pull_mode!r}'s install runs engine {install} "
            "(STORAGE_MIGRATOR_ENGINE, its ConfigMap storage-migrator-cluster): in pull mode the cluster decides. "
            f"Leave the parameter out, or run `storage-migrator fleet add {pull_mode} --engine {install}` so that "
            "its deployments say what its install does")  # fmt: skip
