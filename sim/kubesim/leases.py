"""API server identity leases, and the garbage collection of what a gone server left.

kube-apiserver (gate `APIServerIdentity`, on by default) keeps one
`coordination.k8s.io/v1` Lease per server in `kube-system`, named after its ID
(`apiserver-<hash>`, the `apiServerID` of its StorageVersion entries), labelled
`apiserver.kubernetes.io/identity: kube-apiserver`, with `spec.holderIdentity`
`<id>_<uuid>` (a new uuid per process). It renews it every 10 s
(`--identity-lease-renew-interval-seconds`) for 3600 s
(`--identity-lease-duration-seconds`) (pkg/controlplane/apiserver/server.go).
A stopped server does not delete its lease: it expires.

Two controllers then clean up after a server that is gone:
- apiserverleasegc, in every kube-apiserver, every 3600 s
  (pkg/controlplane/controller/apiserverleasegc/gc_controller.go): deletes the
  identity leases whose `renewTime + leaseDurationSeconds` is past (or that lack
  either field);
- storageversiongc, in kube-controller-manager
  (pkg/controller/storageversiongc/gc_controller.go): when an identity lease is
  deleted, or a StorageVersion holds an entry whose apiServerID has no identity
  lease, it drops those entries (`storageversions.prune`). Seed 001, "Garbage
  collection": "stale storageVersion.status.serverStorageVersions entries left by
  API servers that have gone away" are removed by a control loop that "watches
  the list of participating API servers".

kubesim runs both in one thread per API server (every live server, idempotent;
concurrent passes meet on compare-and-swap): each tick deletes expired identity
leases, and prunes StorageVersions when the set of live leases changed (and
every renew interval, for entries written after a pass). Its writes go through
an etcd client of its own, so the server's request and write counters only
count what clients asked for.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from kubesim import storageversions
from kubesim.errors import StatusError
from kubesim.etcd import EtcdStore
from kubesim.registry import Registry
from kubesim.resources import STORAGE_VERSION_API_GATE, ResourceType, builtin_resources
from kubesim.server_config import ServerConfig

log = logging.getLogger("kubesim")

NAMESPACE = "kube-system"
#: IdentityLeaseComponentLabelKey and its value for kube-apiserver (pkg/controlplane/apiserver/server.go).
IDENTITY_LABEL = "apiserver.kubernetes.io/identity"
COMPONENT = "kube-apiserver"
#: kube-apiserver's defaults: --identity-lease-duration-seconds, --identity-lease-renew-interval-seconds.
LEASE_SECONDS = 3600
RENEW_SECONDS = 10.0
#: How often kubesim's collectors look (kube-apiserver: 3600 s for leases; storageversiongc reacts to events).
GC_SECONDS = 1.0


def lease_type() -> ResourceType:
    return next(rt for rt in builtin_resources() if rt.group == "coordination.k8s.io" and rt.resource == "leases")


def micro_time(at: float) -> str:
    """metav1.MicroTime as the API writes it: `2026-11-22T03:58:21.123456Z`."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    return None


def is_expired(lease: dict[str, Any], now: float) -> bool:
    """apiserverleasegc's isLeaseExpired: no renewTime or duration, or renewTime + duration before now."""
    spec = lease.get("spec") or {}
    renewed = parse_time(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds")
    return renewed is None or not isinstance(duration, int) or renewed + duration < now


def renew_interval(lease_seconds: int) -> float:
    """10 s as kube-apiserver, or a quarter of a lease shorter than 40 s (tests)."""
    return max(0.1, min(RENEW_SECONDS, lease_seconds / 4))


def renew(registry: Registry, *, holder: str, lease_seconds: int, now: float | None = None) -> dict[str, Any]:
    """Create or renew the identity lease of `registry`'s server (the lease controller's tick)."""
    rt = lease_type()
    name = registry.config.server_id
    labels = {IDENTITY_LABEL: COMPONENT, "kubernetes.io/hostname": socket.gethostname()}
    spec = {
        "holderIdentity": holder,
        "leaseDurationSeconds": int(lease_seconds),
        "renewTime": micro_time(time.time() if now is None else now),
    }

    def mutate(current: dict[str, Any]) -> dict[str, Any]:
        current["metadata"]["labels"] = {**(current["metadata"].get("labels") or {}), **labels}
        current["spec"] = {**(current.get("spec") or {}), **spec}
        return current

    for _ in range(3):
        try:
            return registry.update(rt, "v1", NAMESPACE, name, mutate, manager=COMPONENT)
        except StatusError as exc:
            if exc.code != 404:
                raise
        try:
            body = {"metadata": {"name": name, "namespace": NAMESPACE, "labels": labels}, "spec": spec}
            return registry.create(rt, "v1", NAMESPACE, body, manager=COMPONENT)
        except StatusError as exc:
            if exc.code != 409:  # created meanwhile: renew it
                raise
    raise RuntimeError(f"could not renew the identity lease {name}")


def collect_leases(registry: Registry, *, now: float | None = None) -> set[str]:
    """apiserverleasegc: delete expired identity leases; answer the IDs of the live ones.

    A lease renewed between the read and the delete (409) counts as live.
    """
    rt = lease_type()
    at = time.time() if now is None else now
    listed = registry.list(
        rt, "v1", NAMESPACE, predicate=lambda o: (o["metadata"].get("labels") or {}).get(IDENTITY_LABEL) == COMPONENT
    )
    live = set()
    for lease in listed.items:
        meta = lease["metadata"]
        if not is_expired(lease, at):
            live.add(meta["name"])
            continue
        try:
            registry.delete(
                rt, "v1", NAMESPACE, meta["name"], preconditions={"resourceVersion": meta["resourceVersion"]}
            )
        except StatusError as exc:
            if exc.code == 409:
                live.add(meta["name"])
            elif exc.code != 404:  # 404: another server's collector was first
                raise
    return live


class IdentityLease:
    """One API server's identity lease, renewed by a thread that also runs both collectors."""

    def __init__(self, etcd_url: str, config: ServerConfig, *, lease_seconds: int = LEASE_SECONDS) -> None:
        # An etcd client of its own: these writes are the control plane's, not the clients'.
        self.registry = Registry(EtcdStore(etcd_url), config)
        self.holder = f"{config.server_id}_{uuid.uuid4()}"
        self.lease_seconds = int(lease_seconds)
        self.renew_seconds = renew_interval(self.lease_seconds)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: set[str] | None = None
        self._pruned_at = 0.0
        #: Passes of the collectors made by the thread: what a test waits on to know they looked.
        self.passes = 0

    def renew(self, *, lease_seconds: int | None = None) -> dict[str, Any]:
        seconds = self.lease_seconds if lease_seconds is None else lease_seconds
        return renew(self.registry, holder=self.holder, lease_seconds=seconds)

    def collect(self) -> None:
        """One pass of both collectors; the StorageVersion one only with the StorageVersionAPI gate."""
        live = collect_leases(self.registry)
        if STORAGE_VERSION_API_GATE not in self.registry.config.feature_gates:
            return
        if live != self._live or time.monotonic() - self._pruned_at >= self.renew_seconds:
            storageversions.prune(self.registry, live)
            self._live, self._pruned_at = live, time.monotonic()

    def start(self) -> IdentityLease:
        """Renew at once (membership comes before publishing, seed 001), then keep renewing."""
        self.renew()
        self._thread = threading.Thread(target=self._run, name=f"kubesim-lease-{self.holder[:20]}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        tick = min(GC_SECONDS, self.renew_seconds)
        next_renewal = time.monotonic() + self.renew_seconds
        while not self._stopping.wait(tick):
            try:
                if time.monotonic() >= next_renewal:
                    self.renew()
                    next_renewal = time.monotonic() + self.renew_seconds
                self.collect()
                self.passes += 1
            except Exception:  # etcd away for a moment: try again next tick, as a controller would
                if not self._stopping.is_set():
                    log.warning("kubesim: identity lease %s: tick failed", self.holder, exc_info=True)

    def stop(self, *, lease_seconds: int | None = None) -> None:
        """Stop renewing; the lease stays and expires. `lease_seconds`: renew it once more
        for that long first (a test's short lease)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        try:
            if lease_seconds is not None:
                self.renew(lease_seconds=lease_seconds)
        finally:
            self.registry.etcd.close()
