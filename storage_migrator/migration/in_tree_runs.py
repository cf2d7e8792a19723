"""A migration run on the in-tree engine: the object it creates, what the object's state means for our
request, and the counts we make ourselves.

Design decision (issue 36, item 2): our request (`migration.k8s.io`) stays the record;
kube-controller-manager's object (`storagemigration.k8s.io`) does the writes. So:

- the object is named after our request (``in_tree_name``: pass 1 is the request's
  own name, a new pass after the storage version or encryption configuration moved is
  ``<name>-pass<N>``: Failed and Succeeded are terminal there, so a new pass is a new
  object); it is annotated with the request (name and uid) and with the resourceVersion
  we read before creating it (``BASELINE_ANNOTATION``), labelled ours
  (``MANAGED_BY_LABEL``, so that others' tooling can tell it apart), and owned by the
  request (its ownerReference: deleting the request deletes it on a cluster with a
  garbage collector);
- its state decides our step (:func:`judge_in_tree`): waiting for pickup, queued behind
  another migration of the resource (kcm runs one at a time), running, succeeded,
  failed (its message quoted), gone (deleted by someone), or not picked up / timed out;
- the counts are ours, not the controller's word (its conditions carry none): one
  metadata-only LIST at the end counts the objects whose resourceVersion is newer than
  the baseline (written since the run began: rewritten by the controller, or written by
  others meanwhile) and the rest (unchanged). resourceVersions compare as integers
  (kubernetes/kubernetes#126521, approved for this API's GA). A verification pass of a
  key rotation "rewrote nothing" exactly when that count is 0: every object's
  resourceVersion the same after the pass as before it;
- kcm trims a CRD's ``status.storedVersions`` at the end of a migration, on failure too
  (when the CRD's generation did not move): when our request does not succeed, the
  versions we read before are put back (:func:`restored_stored_versions`), so that no
  one drops a version objects may still be stored in.
Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.kube.in_tree import IN_TREE_GROUP, IN_TREE_KIND_NAME, IN_TREE_RESOURCE, InTreeMigration
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.models import API_VERSION, GROUP, MigrationProgress

__all__ = [
    "BASELINE_ANNOTATION",
    "MANAGED_BY",
    "MANAGED_BY_LABEL",
    "REQUEST_ANNOTATION",
    "REQUEST_UID_ANNOTATION",
    "STORED_VERSIONS_ANNOTATION",
    "InTreeStep",
    "InTreeVerdict",
    "Ownership",
    "count_since",
    "in_tree_name",
    "in_tree_object",
    "in_tree_ref",
    "judge_in_tree",
    "ownership",
    "restored_stored_versions",
]

MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "storage-migrator"
#: Our request that made the object, by name and uid (the uid tells a re-created request apart).
REQUEST_ANNOTATION: Final = f"{GROUP}/request"
REQUEST_UID_ANNOTATION: Final = f"{GROUP}/request-uid"
#: The resource's list resourceVersion we read just before creating the object: what the counts compare with.
BASELINE_ANNOTATION: Final = f"{GROUP}/baseline-resource-version"
#: A CRD's status.storedVersions as we read them before creating the object (comma-separated).
STORED_VERSIONS_ANNOTATION: Final = f"{GROUP}/stored-versions-before"
_MAX_NAME: Final = 253

InTreeStep = Literal["wait", "queued", "running", "succeeded", "failed", "gone", "not-picked-up", "timed-out"]
Ownership = Literal["this-request", "earlier-request", "not-ours"]


def in_tree_ref(version: str) -> ResourceRef:
    return ResourceRef(group=IN_TREE_GROUP, version=version, resource=IN_TREE_RESOURCE)


def in_tree_name(request: str, passes: int) -> str:
    """Pass 1 is the request's own name; a later pass `<name>-pass<N>` (cut to fit a name)."""
    if passes <= 1:
        return request
    suffix = f"-pass{passes}"
    return request[: _MAX_NAME - len(suffix)] + suffix


def in_tree_object(
    *, version: str, name: str, group: str, resource: str, request: str, request_uid: str, baseline: str,
    stored_versions: list[str] | None,
) -> dict[str, Any]:  # fmt: skip
    """The in-tree object to create (the API names no version of the resource: kcm migrates to the
    storage version the API server writes now)."""
    annotations = {REQUEST_ANNOTATION: request, REQUEST_UID_ANNOTATION: request_uid, BASELINE_ANNOTATION: baseline}
    if stored_versions is not None:
        annotations[STORED_VERSIONS_ANNOTATION] = ",".join(stored_versions)
    owner = {"apiVersion": API_VERSION, "kind": "StorageVersionMigration", "name": request, "uid": request_uid}
    return {
        "apiVersion": f"{IN_TREE_GROUP}/{version}",
        "kind": "StorageVersionMigration",
        "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY}, "annotations": annotations,
                     "ownerReferences": [owner]},
        "spec": {"resource": {"group": group, "resource": resource}},
    }  # fmt: skip


def ownership(metadata: dict[str, Any], *, request_uid: str) -> Ownership:
    """Whose an existing in-tree object of the name is: this request's (a resumed run adopts it), an
    earlier request's of the same name (ours, to replace), or someone else's (never touched)."""
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    if labels.get(MANAGED_BY_LABEL) != MANAGED_BY or not annotations.get(REQUEST_UID_ANNOTATION):
        return "not-ours"
    return "this-request" if annotations[REQUEST_UID_ANNOTATION] == request_uid else "earlier-request"


class InTreeVerdict(BaseModel):
    """What our run does next about its in-tree object, and the words for the request and the log."""

    model_config = ConfigDict(frozen=True)

    step: InTreeStep
    message: str = Field(description="For the request's condition and the log; names the object.")


def judge_in_tree(
    observed: InTreeMigration | None, *, name: str, waited_seconds: float, pickup_seconds: float,
    timeout_seconds: float,
) -> InTreeVerdict:  # fmt: skip
    """Our step for the in-tree object `name` as just read (None: it is gone).

    `waited_seconds` counts from its creation (or adoption) by this run. The controller records
    `status.resourceVersion` at first sight, before anything else: without it after
    `pickup_seconds`, nothing runs it."""
    shown = f"{IN_TREE_KIND_NAME}/{name}"
    if observed is None:
        return InTreeVerdict(step="gone", message=(
            f"{shown} was deleted by someone else while it ran: what it rewrote is not proven. Our request fails; "
            "a new request (detection retries with back-off) makes a new one"))  # fmt: skip
    if observed.phase == "Succeeded":
        return InTreeVerdict(step="succeeded", message=f"{shown} Succeeded")
    if observed.phase == "Failed":
        why = observed.message or observed.reason or "no message"
        return InTreeVerdict(step="failed", message=(
            f"{shown} Failed ({why}). Failed is terminal there: a retry is a new request, and a new in-tree "
            "migration (detection retries with back-off; by hand, delete this request and ask again)"))  # fmt: skip
    if waited_seconds > timeout_seconds:
        return InTreeVerdict(step="timed-out", message=(
            f"{shown} did not end within in_tree_timeout_seconds ({timeout_seconds:g} s): deleted; check "
            "kube-controller-manager (its logs, its storage_migrator_core_migrator_* metrics)"))  # fmt: skip
    if observed.resource_version is None:
        if waited_seconds > pickup_seconds:
            return InTreeVerdict(step="not-picked-up", message=(
                f"kube-controller-manager's migration controller did not pick up {shown} within "
                f"in_tree_pickup_seconds ({pickup_seconds:g} s; it records status.resourceVersion at first sight): "
                "its StorageVersionMigrator feature gate is off, or the controller is not running"))  # fmt: skip
        return InTreeVerdict(step="wait", message=f"{shown} created; waiting for kube-controller-manager to pick it up")
    if observed.phase == "Running":
        return InTreeVerdict(step="running", message=(
            f"{shown} running (kube-controller-manager migrates every object not newer than resourceVersion "
            f"{observed.resource_version})"))  # fmt: skip
    return InTreeVerdict(step="queued", message=(
        f"{shown} picked up (resourceVersion {observed.resource_version}), waiting behind another in-tree migration "
        "of the resource (kube-controller-manager runs one per resource at a time)"))  # fmt: skip


def _as_int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def count_since(resource_versions: Iterable[str], *, baseline: str) -> MigrationProgress:
    """Our own counts after an in-tree migration: ``rewritten`` are the objects whose resourceVersion is
    newer than `baseline` (written since the run began, by the controller or by others), ``unchanged``
    the others. A resourceVersion that is not an integer counts as rewritten: never a proof by accident."""
    floor = _as_int(baseline)
    listed = rewritten = 0
    for raw in resource_versions:
        listed += 1
        value = _as_int(raw)
        if floor is None or value is None or value > floor:
            rewritten += 1
    return MigrationProgress(listed=listed, rewritten=rewritten, unchanged=listed - rewritten)


def restored_stored_versions(before: list[str], now: list[str]) -> list[str] | None:
    """The CRD's storedVersions to put back after kcm trimmed them and our request did not succeed
    (what was there before, then what was added since), or None when nothing was dropped."""
    if set(before) <= set(now):
        return None
    return [*before, *(v for v in now if v not in before)]
