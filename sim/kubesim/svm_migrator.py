"""One migration of kcm's storage version migrator: the scan a worker runs (kubernetes/kubernetes
`pkg/controller/storageversionmigrator/storageversionmigrator.go`, `sync` and `runMigration`).

The controller around it (sim/kubesim/svm_controller.py) promotes migrations, records their
resourceVersion and gives each running one to a worker; its docstring says what kubesim
changes of kcm's behaviour and why. Here, for one running migration:

1. the resource must be known (the RESTMapper) and watched by the garbage collector, else,
   once the migration is a minute old (kubesim: `missing_resource_grace`), it fails;
2. the garbage collector's cache must have reached `status.resourceVersion` (kubesim: the
   resourceVersion was seen `gc_delay` seconds ago), else the worker comes back later;
3. every object of the cache whose resourceVersion is not newer gets a no-op patch naming
   its uid and resourceVersion; a conflict skips it, a throttle or a server error requeues
   the migration (which rescans from the start: no checkpoint), any other error fails it;
4. then `Succeeded`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from kubesim import storagemigration as svm_api
from kubesim.errors import StatusError
from kubesim.kcm_client import MERGE_PATCH, Stopped, Unreachable
from kubesim.resources import ResourceType
from kubesim.svm_controller import (
    CONTROLLER_NAME,
    GC_IGNORED,
    GC_VERBS,
    REASON_FAILED,
    REASON_SUCCEEDED,
    SvmController,
    created_at,
    gvr_string,
    list_path,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

log = logging.getLogger("kubesim")

#: isRetriableError: throttled, internal error, unavailable, timeouts (and no answer at all).
RETRIABLE = frozenset({429, 500, 503, 504})
#: A deleted object: the real apply patch answers a uid conflict, kubesim's merge patch 404 (both skip it).
SKIPPED = frozenset({404, 409})
_PAGE = 500


def migrate(ctl: SvmController, svm: dict[str, Any]) -> None:
    """A worker's body: one pass over the migration; whatever stops it leaves it for another pass."""
    try:
        _migrate(ctl, svm)
    except Stopped:
        return
    except Unreachable as exc:
        log.debug("kubesim svm controller: %s: %s", svm["metadata"]["name"], exc)
        ctl.retry_later(svm)
    except StatusError as exc:  # the cache could not be read (e.g. a value under a removed key)
        log.debug("kubesim svm controller: %s: %s", svm["metadata"]["name"], exc.message)
        ctl.retry_later(svm)
    except Exception:
        log.exception("kubesim svm controller: migration %s failed", svm["metadata"]["name"])
        ctl.retry_later(svm)
    finally:
        ctl.dynamic.close()  # this worker thread's connections end with it
        ctl.kube.close()


def _fail(ctl: SvmController, svm: dict[str, Any], error: str) -> None:
    """failMigration."""
    ctl.set_condition(svm, svm_api.FAILED, "True", REASON_FAILED, f"migration encountered unhandled error: {error}")


def _within_grace(ctl: SvmController, svm: dict[str, Any]) -> bool:
    """A resource missing from the mapper or the cache may be a CRD just created: wait a while (kcm: a minute)."""
    left = created_at(svm) + ctl.settings.missing_resource_grace - time.time()
    if left <= 0:
        return False
    ctl.wait_until(svm, time.monotonic() + min(left, 1.0))
    return True


def gc_watches(rt: ResourceType, verbs: set[str]) -> bool:
    """The garbage collector keeps a monitor for deletable, listable, watchable resources it does not ignore."""
    return (rt.group, rt.resource) not in GC_IGNORED and verbs >= GC_VERBS


def _migrate(ctl: SvmController, svm: dict[str, Any]) -> None:
    res = svm["spec"]["resource"]
    found = ctl.resolve(res)
    if found is None:
        if not _within_grace(ctl, svm):
            _fail(ctl, svm, "unable to obtain GVR from discovery")
        return
    rt, version = found
    if not gc_watches(rt, ctl.verbs(rt)):
        if not _within_grace(ctl, svm):
            _fail(ctl, svm, f"resource does not exist in GC: no monitor found for resource {gvr_string(rt, version)}")
        return
    ready_at = ctl.rv_seen(svm) + ctl.settings.gc_delay
    if time.monotonic() < ready_at:
        ctl.wait_until(svm, ready_at)  # the GC cache has not reached the migration's resourceVersion yet
        return
    limit = int(svm["status"]["resourceVersion"])
    eligible = [obj for obj in _gc_cache(ctl, rt, version) if int(obj[3]) <= limit]
    ctl.report(res, migrated=0, remaining=len(eligible))
    for done, (namespace, name, uid, rv) in enumerate(eligible, start=1):
        if not ctl.may_continue():
            return  # switched off or restarted: the migration stays as it is
        path = f"{list_path(rt, version, namespace)}/{quote(name, safe='')}?fieldManager={CONTROLLER_NAME}"
        answer = ctl.dynamic.request("PATCH", path, {"metadata": {"uid": uid, "resourceVersion": rv}},
                                     ctype=MERGE_PATCH)  # fmt: skip
        if answer.status in RETRIABLE:
            ctl.retry_later(svm, after=answer.retry_after)
            return
        if not answer.ok and answer.status not in SKIPPED:
            _fail(ctl, svm, answer.message)
            return
        ctl.report(res, migrated=done, remaining=len(eligible) - done)
    ctl.set_condition(svm, svm_api.SUCCEEDED, "True", REASON_SUCCEEDED, "")
    ctl.forget(svm)


def _gc_cache(ctl: SvmController, rt: ResourceType, version: str) -> Iterator[tuple[str | None, str, str, str]]:
    """What the garbage collector's monitor of the resource holds: every object's namespace, name,
    uid and resourceVersion, read in pages (in key order; the real store's order is a map's)."""
    token: str | None = None
    while True:
        page = ctl.registry.list(rt, version, None, limit=_PAGE, continue_token=token)
        for obj in page.items:
            meta = obj["metadata"]
            yield meta.get("namespace"), meta["name"], meta.get("uid", ""), meta["resourceVersion"]
        token = page.continue_token
        if not token:
            return
