"""kube-controller-manager's storage version migrator, as kubesim runs it for the in-tree API.

kcm runs three controllers over `storagemigration.k8s.io` StorageVersionMigrations
(kubernetes/kubernetes `pkg/controller/storageversionmigrator/`, read with the
`search` tool: `migrationrunner.go` of the v1 API, `resourceversion.go`,
`storageversionmigrator.go`, `metrics.go`, and `cmd/kube-controller-manager/app/
storageversionmigrator.go`); kubesim runs the same three from one loop here,
each in a module named after its file: sim/kubesim/svm_runner.py,
svm_resource_version.py and svm_migrator.py (the scan of one migration, 5
workers):

- **the migration runner** (migrationrunner.go): per group-resource, one
  migration at a time. Of the migrations not yet terminal, the oldest
  (creationTimestamp, then name) is promoted when none is running: `Running`
  True, reason `MigrationRunning`, "The migration is running"; for a custom
  resource, the CRD gets the condition `StorageMigrating` True, reason
  `MigrationRunning`, "Migration <name> is running", observedGeneration the
  CRD's generation. Once a migration is terminal it turns `Running` False,
  `MigrationCompleted`, "Migration completed" (reference/svm-succeeded.json),
  and for a CRD sets `StorageMigrating` False (`MigrationSucceeded` "The
  migration has succeeded and the stored versions have been updated", or "...
  but the stored versions have not been updated due to a generation mismatch";
  `MigrationFailed` "The migration has failed") and, when the CRD's generation
  is still the one recorded at the start, `status.storedVersions` = [the
  storage version]: on success **and on failure**, as the source does;
- **the resource version controller** (resourceversion.go): for every migration
  not terminal and without `status.resourceVersion`: a resource not in
  discovery fails it ("resource does not exist in discovery",
  reference/svm-unknown-resource.json); one without the verbs update, patch and
  list fails it ('resource "<gvr>" does not support discovery operations:
  [update patch list]'); else it records the resource's current
  resourceVersion, a LIST with limit 1 (in the namespace "@fake:svm_ns!" for a
  namespaced resource), in `status.resourceVersion`;
- **the migrator** (storageversionmigrator.go, 5 workers): for a running
  migration with its resourceVersion, once the garbage collector's cache of the
  resource has reached it, a no-op patch with a uid and resourceVersion
  precondition to each object of the cache not newer than it (sent as the
  controller's field manager, through the API server); a conflict skips the
  object; a throttle or a server error requeues the migration (with the
  controller's back-off, or the server's Retry-After), which then rescans from
  the start; any other error fails it ("migration encountered unhandled error:
  ..."); the end sets `Succeeded` True, `StorageVersionMigrationSucceeded`.
  Terminal migrations are never touched again (`Failed` is terminal: create
  another). A resource the garbage collector does not watch (kcm ignores
  `events` and `events.events.k8s.io`; it watches only resources with list,
  watch and delete) fails a minute after the migration's creation: "migration
  encountered unhandled error: resource does not exist in GC: no monitor found
  for resource <gvr>". Progress is kcm's gauges (metrics.go:
  `storage_migrator_core_migrator_migrated_objects`, `..._remaining_objects`,
  `..._migrations_total`), reported by the admin API (`state()["migrations"]`),
  not in a condition's message.

What kubesim changes, and why (docs/kubesim.md says it for users):
- time: the garbage collector's cache catches up after `gc_delay` seconds
  (default 1; a real one took ~80 s on the reference cluster, the same wait
  before the unknown resource failed), and "a minute" of grace is
  `missing_resource_grace` (default 3 s): tests must not wait minutes;
- the patch: a JSON merge patch `{"metadata":{"uid":U,"resourceVersion":RV}}`
  (kubesim has no server-side apply, which the real one sends); a deleted
  object answers 404 where the apply patch answers a uid conflict: both skip it;
- reads: the migrations, CRDs and the garbage collector's cache are read from
  etcd (kcm's informers, which cost it no request per migration); every write,
  and the LIST of the resource version controller, goes over HTTP(S) to one API
  server (sim/kubesim/kcm_client.py), as kcm talks to one through its kubeconfig;
- the client's rate: `qps`/`burst` (kcm's `--kube-api-qps`/`--kube-api-burst`)
  default to 50/100, which gives the ~50 objects/s measured on a real v1.36.2
  (53/s for 5,000 Secrets); kcm documents 20/30 as its flags' defaults.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from kubesim import storagemigration as svm_api
from kubesim import svm_runner
from kubesim.errors import StatusError, bad_request
from kubesim.etcd import EtcdStore
from kubesim.kcm_client import Answer, Endpoint, KubeClient, Stopped, TokenBucket, Unreachable
from kubesim.managed_fields import now_rfc3339
from kubesim.registry import Registry
from kubesim.resources import STORAGE_VERSION_MIGRATOR_GATE, ResourceType, sort_versions
from kubesim.svm_runner import RETRIES, gr_key, running, terminal

if TYPE_CHECKING:
    from kubesim.server import ApiServer

log = logging.getLogger("kubesim")

CONTROLLER_NAME = "storage-version-migrator-controller"
USER_AGENT = f"kube-controller-manager/v1.37.0 (linux/amd64) kubernetes/kubesim/{CONTROLLER_NAME}"
#: resourceversion.go: "guaranteed to be not present in the cluster as it not a valid namespace name".
FAKE_NAMESPACE = "@fake:svm_ns!"
WORKERS = 5
REASON_SUCCEEDED = "StorageVersionMigrationSucceeded"
REASON_FAILED = "StorageVersionMigrationFailed"
MIGRATION_VERBS = ("update", "patch", "list")
#: The garbage collector ignores these (pkg/controller/garbagecollector/graph_builder.go, DefaultIgnoredResources).
GC_IGNORED = frozenset({("", "events"), ("events.k8s.io", "events")})
GC_VERBS = frozenset({"list", "watch", "delete"})
_TICK = 0.1
_IDLE_TICK = 0.25


def created_at(obj: dict[str, Any]) -> float:
    text = (obj.get("metadata") or {}).get("creationTimestamp")
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0


def gvr_string(rt: ResourceType, version: str) -> str:
    """schema.GroupVersionResource.String(): `apps/v1, Resource=deployments`, `/v1, Resource=secrets`."""
    return f"{rt.group}/{version}, Resource={rt.resource}"


@dataclass
class ControllerSettings:
    """What kcm's flags and kubesim's clock decide (the admin API's `svm-controller`)."""

    #: kcm runs the controller (its `StorageVersionMigrator` gate, its `--controllers`); the API
    #: server's gate decides whether the API is served, and the controller runs only where it is.
    enabled: bool = True
    #: Seconds until the garbage collector's cache reaches a recorded resourceVersion.
    gc_delay: float = 1.0
    #: Seconds after a migration's creation before a resource missing from the cache fails it (kcm: 60).
    missing_resource_grace: float = 3.0
    #: kcm's --kube-api-qps and --kube-api-burst for the controller's clients.
    qps: float = 50.0
    burst: int = 100

    def as_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "gcDelaySeconds": self.gc_delay,
            "missingResourceGraceSeconds": self.missing_resource_grace,
            "kubeAPIQPS": self.qps,
            "kubeAPIBurst": self.burst,
        }

    def update(self, body: dict[str, Any]) -> None:
        """Apply `{"enabled": false, "gcDelaySeconds": 0.2, ...}`; 400 naming the field on bad input."""
        fields = {"enabled": bool, "gcDelaySeconds": float, "missingResourceGraceSeconds": float,
                  "kubeAPIQPS": float, "kubeAPIBurst": int}  # fmt: skip
        unknown = sorted(set(body) - set(fields))
        if unknown:
            raise bad_request(f"unknown svm-controller settings {unknown}; known: {sorted(fields)}")
        for key, value in body.items():
            kind = fields[key]
            ok = (
                isinstance(value, bool)
                if kind is bool
                else isinstance(value, (int, float)) and not isinstance(value, bool)
            )
            if kind is int and ok:
                ok = float(value).is_integer()
            if not ok or (kind is not bool and value < 0):
                raise bad_request(f"svm-controller {key}: expected a non-negative {kind.__name__}, got {value!r}")
            if key in ("kubeAPIQPS", "kubeAPIBurst") and value <= 0:
                raise bad_request(f"svm-controller {key}: must be more than 0, got {value!r}")
        self.enabled = bool(body.get("enabled", self.enabled))
        self.gc_delay = float(body.get("gcDelaySeconds", self.gc_delay))
        self.missing_resource_grace = float(body.get("missingResourceGraceSeconds", self.missing_resource_grace))
        self.qps = float(body.get("kubeAPIQPS", self.qps))
        self.burst = int(body.get("kubeAPIBurst", self.burst))


class SvmController:
    """The three controllers, talking to the API server `target()` returns (kcm's kubeconfig)."""

    def __init__(
        self,
        *,
        etcd_url: str,
        target: Callable[[], ApiServer | None],
        token: str,
        settings: ControllerSettings | None = None,
    ) -> None:
        self.settings = settings or ControllerSettings()
        self._target = target
        self._token = token
        self.registry = Registry(EtcdStore(etcd_url))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._workers: dict[str, threading.Thread] = {}
        #: In memory only, lost by a restart, as kcm's (no checkpoint): when each migration (uid)
        #: was first seen, when its resourceVersion was, when it may be tried again and how often it failed.
        self._seen: dict[str, float] = {}
        self._rv_seen: dict[str, float] = {}
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        #: kcm's gauges (metrics.go): per group-resource the migration running and its counts.
        self.progress: dict[str, dict[str, Any]] = {}
        self.migrations_total: dict[str, int] = {}
        self.syncs = 0
        self.restarts = 0
        self.patches = TokenBucket(self.settings.qps, self.settings.burst)
        self.status_writes = TokenBucket(self.settings.qps, self.settings.burst)
        self.dynamic = KubeClient(self._endpoint, self.patches, user_agent=USER_AGENT, stop=self._stop)
        self.kube = KubeClient(self._endpoint, self.status_writes, user_agent=USER_AGENT, stop=self._stop)

    # ----- lifecycle --------------------------------------------------------------
    def start(self) -> SvmController:
        self._stop = threading.Event()
        self.dynamic = KubeClient(self._endpoint, self.patches, user_agent=USER_AGENT, stop=self._stop)
        self.kube = KubeClient(self._endpoint, self.status_writes, user_agent=USER_AGENT, stop=self._stop)
        self._thread = threading.Thread(target=self._run, name="kubesim-svm-controller", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop and every worker (a migration half done stays as it is: no checkpoint)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)  # first the loop, which starts workers
        self._thread = None
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.join(timeout=30)
        with self._lock:
            self._workers.clear()
            self._seen.clear()
            self._rv_seen.clear()
            self._retry_at.clear()
            self._failures.clear()
            self.progress.clear()
            self.migrations_total.clear()

    def close(self) -> None:
        self.stop()
        self.registry.etcd.close()

    def restart(self) -> dict[str, Any]:
        """kcm restarted: what it had in memory is gone; running migrations are scanned again."""
        self.stop()
        self.restarts += 1
        self.start()
        return self.state()

    def configure(self, body: dict[str, Any]) -> dict[str, Any]:
        self.settings.update(body)
        self.patches.configure(self.settings.qps, self.settings.burst)
        self.status_writes.configure(self.settings.qps, self.settings.burst)
        return self.state()

    def state(self) -> dict[str, Any]:
        server = self._target()
        with self._lock:
            progress = {gr: dict(p) for gr, p in self.progress.items()}
            totals = dict(self.migrations_total)
        return {
            **self.settings.as_dict(),
            "running": self._thread is not None and server is not None and self._active(server),
            "server": server.url if server is not None else None,
            "syncs": self.syncs,
            "restarts": self.restarts,
            "migrations": progress,
            "migrationsTotal": totals,
        }

    # ----- where it talks ------------------------------------------------------------
    def _endpoint(self) -> Endpoint | None:
        server = self._target()
        if server is None:
            return None
        context = server.tls.client_context() if server.tls is not None else None
        return Endpoint(url=server.url, context=context, token=self._token)

    def _active(self, server: ApiServer) -> bool:
        return self.settings.enabled and STORAGE_VERSION_MIGRATOR_GATE in server.registry.config.feature_gates

    def may_continue(self) -> bool:
        """A worker's check between two objects: not stopped, switched off, or its API gone."""
        server = self._target()
        return not self._stop.is_set() and server is not None and self._active(server)

    def _sync_config(self, server: ApiServer) -> None:
        # kcm's informers decode what the server it talks to would (its storage versions and keys).
        if self.registry.config is not server.registry.config:
            self.registry.config = server.registry.config

    # ----- the loop -------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            pause = _IDLE_TICK
            try:
                server = self._target()
                if server is not None and self._active(server):
                    self._sync_config(server)
                    self._sync()
                    pause = _TICK
            except (Stopped, Unreachable) as exc:
                log.debug("kubesim svm controller: %s", exc)
            except Exception:
                log.exception("kubesim svm controller: sync failed")
            self.syncs += 1
            self._stop.wait(pause)
        self.kube.close()  # the loop's connection
        self.dynamic.close()

    def svm_type(self) -> ResourceType:
        return self.registry.lookup(svm_api.GROUP, "v1", svm_api.RESOURCE)

    def _list_svms(self) -> list[dict[str, Any]]:
        try:
            return list(self.registry.list(self.svm_type(), "v1", None).items)
        except StatusError:
            return []

    def _sync(self) -> None:
        """One pass over what the informer holds; every write re-reads the object it changes, and the
        next pass (a tenth of a second later) sees what this one wrote."""
        from kubesim import svm_resource_version  # it builds on this module's names

        svms = self._list_svms()
        by_resource: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for svm in svms:
            res = svm["spec"]["resource"]
            by_resource.setdefault((res["group"], res["resource"]), []).append(svm)
        for items in by_resource.values():
            svm_runner.admit(self, items)
        now = time.monotonic()
        for svm in svms:
            due = self._retry_at.get(svm["metadata"]["uid"], 0.0) <= now
            if due and not terminal(svm) and not svm["status"].get("resourceVersion"):
                svm_resource_version.record(self, svm)
        self._dispatch(svms)

    # ----- the RESTMapper and discovery, as kcm's controllers see them ---------------------------
    def resolve(self, res: dict[str, str]) -> tuple[ResourceType, str] | None:
        """The RESTMapper's answer for a group-resource: the type and its preferred version, or None."""
        self.registry.refresh_crds()
        for rt in self.registry.resource_types():
            if rt.group == res["group"] and rt.resource == res["resource"] and not rt.virtual:
                return rt, sort_versions(rt.served_versions)[0]
        return None

    @staticmethod
    def verbs(rt: ResourceType) -> set[str]:
        return set(rt.verbs) if not rt.is_custom else {"create", "delete", "deletecollection", "get", "list",
                                                          "patch", "update", "watch"}  # fmt: skip

    # ----- the migrator (storageversionmigrator.go) ---------------------------------------
    def _dispatch(self, svms: list[dict[str, Any]]) -> None:
        from kubesim.svm_migrator import migrate  # it builds on this module's names

        now = time.monotonic()
        with self._lock:
            for name in [n for n, t in self._workers.items() if not t.is_alive()]:
                del self._workers[name]
            for svm in svms:
                uid = svm["metadata"]["uid"]
                ready = running(svm) and not terminal(svm) and svm["status"].get("resourceVersion")
                if not ready or uid in self._workers or len(self._workers) >= WORKERS:
                    continue
                if self._retry_at.get(uid, 0.0) > now:
                    continue
                worker = threading.Thread(target=migrate, args=(self, svm), name=f"kubesim-svm-{uid[:8]}",
                                          daemon=True)  # fmt: skip
                self._workers[uid] = worker
                worker.start()

    def retry_later(self, svm: dict[str, Any], *, after: float | None = None) -> None:
        """processNext: requeue with the controller's back-off (5 ms doubling, at most 1000 s), or
        after the server's suggested delay when it is longer."""
        uid = svm["metadata"]["uid"]
        with self._lock:
            failures = self._failures.get(uid, 0)
            self._failures[uid] = failures + 1
            backoff = min(1000.0, 0.005 * 2**failures)
            self._retry_at[uid] = time.monotonic() + max(backoff, after or 0.0)

    def wait_until(self, svm: dict[str, Any], at: float) -> None:
        """Look at `svm` again at `at` (monotonic): a wait, not a failure."""
        with self._lock:
            self._retry_at[svm["metadata"]["uid"]] = at

    def forget(self, svm: dict[str, Any]) -> None:
        with self._lock:
            self._failures.pop(svm["metadata"]["uid"], None)

    def first_seen(self, svm: dict[str, Any]) -> float:
        """When this controller (since its start) first saw the migration (monotonic)."""
        with self._lock:
            return self._seen.setdefault(svm["metadata"]["uid"], time.monotonic())

    def rv_seen(self, svm: dict[str, Any]) -> float:
        with self._lock:
            return self._rv_seen.setdefault(svm["metadata"]["uid"], time.monotonic())

    def started(self, svm: dict[str, Any]) -> None:
        """A migration promoted: kcm's gauges start again for its resource (metrics.go)."""
        gr = gr_key(svm["spec"]["resource"])
        with self._lock:
            self.progress[gr] = {"migration": svm["metadata"]["name"], "migratedObjects": 0, "remainingObjects": 0}
            self.migrations_total[gr] = self.migrations_total.get(gr, 0) + 1

    def report(self, res: dict[str, str], *, migrated: int, remaining: int) -> None:
        with self._lock:
            entry = self.progress.setdefault(gr_key(res), {"migration": ""})
            entry.update({"migratedObjects": migrated, "remainingObjects": remaining})

    # ----- status writes (the typed client's UpdateStatus) ------------------------------------
    def set_condition(self, svm: dict[str, Any], kind: str, status: str, reason: str, message: str) -> None:
        self.write_status(svm, lambda current: svm_api.set_condition(current, kind, status, reason, message,
                                                                        now_rfc3339()))  # fmt: skip

    def write_status(self, svm: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> Answer | None:
        """Change the migration as it is now and PUT it to /status with its resourceVersion; a conflict
        re-reads and tries again; a migration gone meanwhile is left alone."""
        name = svm["metadata"]["name"]
        for _ in range(RETRIES):
            try:
                current = self.registry.get(self.svm_type(), "v1", None, name)
            except StatusError:
                return None  # deleted, or the API no longer served
            if current["metadata"]["uid"] != svm["metadata"]["uid"]:
                return None  # deleted and created again: another migration
            change(current)
            answer = self.kube.request(
                "PUT", f"/apis/{svm_api.GROUP}/v1/{svm_api.RESOURCE}/{quote(name)}/status", current
            )
            if answer.status != 409:
                return answer
        return None


def list_path(rt: ResourceType, version: str, namespace: str | None) -> str:
    base = f"/apis/{rt.group}/{version}" if rt.group else f"/api/{version}"
    if namespace is not None:
        return f"{base}/namespaces/{quote(namespace, safe='')}/{rt.resource}"
    return f"{base}/{rt.resource}"
