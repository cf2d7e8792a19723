"""kcm's migration runner: one migration per resource at a time, and the CRD's side of it
(kubernetes/kubernetes `pkg/controller/storageversionmigrator/migrationrunner.go`, the v1 one).

Per group-resource, of the migrations not terminal the oldest (creationTimestamp, then name)
is promoted when none is running: `Running` True, `MigrationRunning`, "The migration is
running"; for a custom resource its CRD first gets `StorageMigrating` True, `MigrationRunning`,
"Migration <name> is running", with the CRD's generation as observedGeneration. A migration
that is terminal and still `Running` turns it False, `MigrationCompleted`, "Migration
completed" (reference/svm-succeeded.json), after finishing its CRD (`finish_crd`). The
controller (sim/kubesim/svm_controller.py) calls `admit` on every pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from kubesim import storagemigration as svm_api
from kubesim.errors import StatusError
from kubesim.managed_fields import now_rfc3339

if TYPE_CHECKING:
    from kubesim.svm_controller import SvmController

#: retry.DefaultRetry's steps, for a write that meets a conflict.
RETRIES = 5
CONDITION = "StorageMigrating"


def gr_key(res: dict[str, str]) -> str:
    """`secrets`, `widgets.example.com`: a group-resource as kcm's metrics and kubesim's counters name it."""
    return f"{res['resource']}.{res['group']}" if res["group"] else res["resource"]


def running(svm: dict[str, Any]) -> bool:
    return svm_api.condition_true(svm, svm_api.RUNNING)


def terminal(svm: dict[str, Any]) -> bool:
    return svm_api.condition_true(svm, svm_api.SUCCEEDED) or svm_api.condition_true(svm, svm_api.FAILED)


def admit(ctl: SvmController, items: list[dict[str, Any]]) -> None:
    """sync for one group-resource: clean up the ended ones, promote the oldest waiting one if none runs."""
    in_progress = any(running(s) and not terminal(s) for s in items)
    for svm in items:
        if running(svm) and terminal(svm):
            cleanup(ctl, svm)
    if in_progress:
        return
    waiting = [s for s in items if not running(s) and not terminal(s)]
    if waiting:
        oldest = min(waiting, key=lambda s: (s["metadata"].get("creationTimestamp", ""), s["metadata"]["name"]))
        mark_active(ctl, oldest)


def mark_active(ctl: SvmController, svm: dict[str, Any]) -> None:
    name = svm["metadata"]["name"]
    res = svm["spec"]["resource"]
    crd_condition(
        ctl, res, lambda crd: storage_migrating(crd, "True", "MigrationRunning", f"Migration {name} is running")
    )
    ctl.started(svm)
    ctl.set_condition(svm, svm_api.RUNNING, "True", "MigrationRunning", "The migration is running")


def cleanup(ctl: SvmController, svm: dict[str, Any]) -> None:
    success = svm_api.condition_true(svm, svm_api.SUCCEEDED)
    crd_condition(ctl, svm["spec"]["resource"], lambda crd: finish_crd(crd, success))
    ctl.set_condition(svm, svm_api.RUNNING, "False", "MigrationCompleted", "Migration completed")


def crd_condition(ctl: SvmController, res: dict[str, str], change: Callable[[dict[str, Any]], None]) -> None:
    """Read the CRD of a custom resource, change its status, write it through /status with the
    resourceVersion read (the source's apply carries it too), again on a conflict."""
    if not res["group"]:
        return
    name = f"{res['resource']}.{res['group']}"
    crd_type = ctl.registry.lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    for _ in range(RETRIES):
        try:
            crd = ctl.registry.get(crd_type, "v1", None, name)
        except StatusError:
            return  # no CRD of that name: a built-in resource
        change(crd)
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{quote(name)}/status"
        if ctl.kube.request("PUT", path, crd).status != 409:
            return


def storage_migrating(crd: dict[str, Any], status: str, reason: str, message: str) -> None:
    """The CRD's `StorageMigrating` condition, observedGeneration its generation."""
    conditions = crd.setdefault("status", {}).setdefault("conditions", [])
    generation = int(crd["metadata"].get("generation") or 0)
    for cond in conditions:
        if cond.get("type") == CONDITION:
            if cond.get("status") != status:
                cond["lastTransitionTime"] = now_rfc3339()
            cond.update({"status": status, "reason": reason, "message": message, "observedGeneration": generation})
            return
    conditions.append({"type": CONDITION, "status": status, "lastTransitionTime": now_rfc3339(),
                       "reason": reason, "message": message, "observedGeneration": generation})  # fmt: skip


def finish_crd(crd: dict[str, Any], success: bool) -> None:
    """finishCRDMigration: `storedVersions` = [the storage version] when the CRD's generation is the
    one recorded at the start (success or not: the source trims on failure too), and
    `StorageMigrating` False."""
    cond = next((c for c in (crd.get("status") or {}).get("conditions") or [] if c.get("type") == CONDITION), None)
    generation = int(crd["metadata"].get("generation") or 0)
    unchanged = cond is not None and int(cond.get("observedGeneration") or 0) == generation
    if success:
        reason, message = "MigrationSucceeded", "The migration has succeeded"
        message += (" and the stored versions have been updated" if unchanged
                    else " but the stored versions have not been updated due to a generation mismatch")  # fmt: skip
    else:
        reason, message = "MigrationFailed", "The migration has failed"
    storage_migrating(crd, "False", reason, message)
    if unchanged:
        storage = next((v["name"] for v in crd["spec"].get("versions") or [] if v.get("storage")), None)
        if storage is not None:
            crd["status"]["storedVersions"] = [storage]
