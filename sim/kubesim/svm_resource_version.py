"""kcm's resource version controller: what a migration migrates up to (kubernetes/kubernetes
`pkg/controller/storageversionmigrator/resourceversion.go`).

For a migration not terminal and without `status.resourceVersion`: a resource the RESTMapper
does not know fails it ("resource does not exist in discovery"; kubesim first waits the
controller's `gc_delay`, the wait reference/svm-unknown-resource.json shows), one whose
discovery lacks update, patch or list fails it ("does not support discovery operations");
else the resource's current resourceVersion, a metadata LIST with limit 1 (in a namespace that
cannot exist for a namespaced resource), goes into `status.resourceVersion`, once.
"""

from __future__ import annotations

import time
from typing import Any

from kubesim import storagemigration as svm_api
from kubesim.kcm_client import PARTIAL_LIST
from kubesim.svm_controller import (
    FAKE_NAMESPACE,
    MIGRATION_VERBS,
    REASON_FAILED,
    SvmController,
    gvr_string,
    list_path,
)


def record(ctl: SvmController, svm: dict[str, Any]) -> None:
    """sync of the resource version controller, for a migration not terminal and without its resourceVersion."""
    now = time.monotonic()
    first = ctl.first_seen(svm)
    found = ctl.resolve(svm["spec"]["resource"])
    if found is None:
        # kubesim: the wait the reference shows before this verdict (svm-unknown-resource.json).
        if now - first >= ctl.settings.gc_delay:
            ctl.set_condition(svm, svm_api.FAILED, "True", REASON_FAILED, "resource does not exist in discovery")
        return
    rt, version = found
    if not set(MIGRATION_VERBS) <= ctl.verbs(rt):
        message = (f'resource "{gvr_string(rt, version)}" does not support discovery operations: '
                   f"[{' '.join(MIGRATION_VERBS)}]")  # fmt: skip
        ctl.set_condition(svm, svm_api.FAILED, "True", REASON_FAILED, message)
        return
    answer = ctl.kube.request("GET", list_path(rt, version, FAKE_NAMESPACE if rt.namespaced else None) +
                               "?limit=1", accept=PARTIAL_LIST)  # fmt: skip
    if not answer.ok:
        ctl.retry_later(svm, after=answer.retry_after)
        return
    rv = str(((answer.body or {}).get("metadata") or {}).get("resourceVersion") or "")
    if not rv.isdigit():
        message = f"latest resourceVersion for {gvr_string(rt, version)} is empty"
        ctl.set_condition(svm, svm_api.FAILED, "True", REASON_FAILED, message)
        return
    ctl.write_status(svm, lambda current: current["status"].setdefault("resourceVersion", rv))
