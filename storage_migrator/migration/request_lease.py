"""A run's hold on its request: its writer Lease taken, renewed, counted among the writers, given back.

Design decision (issue 37; the rule is `write_budget.py`'s, the wire `writer_leases.py`'s): a
run takes its request's Lease before it writes anything of the request, or refuses
(`RequestHeld`) naming the holder. A thread of its own then, every REFRESH_SECONDS, renews the
Lease when RENEW_SECONDS have passed and LISTs the writers' Leases: the view it feeds the
`WindowedLimiter` (the run's share), the expired Leases it deletes, and whether the run still
holds its request. A run that learns it does not (its renewal answered 409 or 404 and the Lease
names another holder, or is gone) writes nothing more: every write asks `lost_error` first.

No Prefect here: the Kubernetes API is the only thing a run's writes wait on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from kubernetes.client import ApiClient

from storage_migrator.kube.errors import AlreadyExists, Conflict, KubeError, NotFound
from storage_migrator.migration.pacing import LocalRateLimiter
from storage_migrator.migration.requests import TAKEN_OVER, MigrationCancelled
from storage_migrator.migration.write_budget import (
    MAX_VIEW_AGE_SECONDS,
    REFRESH_SECONDS,
    RENEW_SECONDS,
    WriterLease,
    WritersView,
    count_writers,
    decide_claim,
    own_lease_fresh,
)
from storage_migrator.migration.write_share import ShareView, WindowedLimiter, join_wait
from storage_migrator.migration.writer_leases import (
    create_lease,
    delete_lease,
    lease_body,
    lease_name,
    list_writer_leases,
    renew_lease,
    replace_lease,
)

__all__ = ["LeasePacer", "RequestHeld", "RequestLease"]

log = logging.getLogger(__name__)

#: Tries to take a request whose Lease changes between our LIST and our write.
_TAKE_TRIES = 3
#: One Lease request's timeout (seconds): a renewal slower than this is retried by the next round.
REQUEST_TIMEOUT_SECONDS = 10.0


class RequestHeld(Exception):
    """Another run holds the request's live Lease: this run writes nothing."""

    def __init__(self, message: str, *, holder: str | None = None, until: datetime | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.holder = holder
        self.until = until

    def __reduce__(self) -> tuple[Any, ...]:
        return (_held, (self.message, self.holder, self.until))


def _held(message: str, holder: str | None, until: datetime | None) -> RequestHeld:
    return RequestHeld(message, holder=holder, until=until)


class RequestLease:
    """The Lease of one request held by one run (see the module docstring). Thread-safe."""

    def __init__(self, connect: Callable[[], ApiClient], *, namespace: str, request: str, holder: str,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.namespace = namespace
        self.request = request
        self.holder = holder
        self.name = lease_name(request)
        self.limiter = WindowedLimiter(max_age=MAX_VIEW_AGE_SECONDS)
        #: What taking it said: "created", or the take-over's message (the holder it replaced).
        self.taken = ""
        self._wall = wall
        self._clock = clock
        self._api = connect()
        self._write_lock = threading.Lock()
        self._resource_version = ""
        #: the monotonic time the last successful write of the Lease was sent (its renewal)
        self._renewed_sent: float | None = None
        #: the rate the run wants its Lease to say (None: not writing), and the one it says
        self._wanted: float | None = None
        self._written: float | None = None
        self._lost: str | None = None
        self._failing: type[BaseException] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ----- taking and giving back ------------------------------------------------------------

    @classmethod
    def take(cls, connect: Callable[[], ApiClient], *, namespace: str, request: str, holder: str) -> RequestLease:
        """The request's Lease, created or taken over from a holder whose Lease expired; `RequestHeld`
        if a live one holds it, `InstallNamespaceMissing` without the install's namespace."""
        lease = cls(connect, namespace=namespace, request=request, holder=holder)
        try:
            lease._take()
        except BaseException:
            lease._close()
            raise
        lease._thread = threading.Thread(target=lease._run, name=f"writer-lease-{request}", daemon=True)
        lease._thread.start()
        return lease

    def _take(self) -> None:
        for _ in range(_TAKE_TRIES):
            current = self._own(list_writer_leases(self._api, namespace=self.namespace,
                                                   timeout=REQUEST_TIMEOUT_SECONDS))  # fmt: skip
            claim = decide_claim(current, now=self._wall())
            if claim.action == "refuse":
                raise RequestHeld(claim.message, holder=claim.holder, until=claim.until)
            sent, now = self._clock(), self._wall()
            transitions = 0 if current is None else current.transitions + 1
            body = lease_body(namespace=self.namespace, request=self.request, holder=self.holder, acquired=now,
                              renewed=now, transitions=transitions, writes_per_second=None,
                              resource_version=None if current is None else current.resource_version)  # fmt: skip
            try:
                # Issue 37: a take-over is an update of the expired Lease with the resourceVersion read.
                got = create_lease(self._api, body) if current is None else replace_lease(self._api, body)
            except (AlreadyExists, Conflict, NotFound):
                continue  # another run wrote it since our LIST: judge it again
            self._resource_version, self._renewed_sent = got.resource_version, sent
            self.taken = "created" if current is None else claim.message
            return
        raise RequestHeld(f"{self.request}: its Lease {self.name} changed under each of {_TAKE_TRIES} tries to take "
                          "it (other runs take it at once): this run writes nothing")  # fmt: skip

    def _own(self, leases: list[WriterLease]) -> WriterLease | None:
        return next((lease for lease in leases if lease.name == self.name), None)

    def release(self) -> None:
        """The run is done with its request: the Lease deleted (conditionally: a run that took it over
        keeps it). One try; a Lease that could not be deleted expires on its own."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * REQUEST_TIMEOUT_SECONDS)
        try:
            if self._lost is None:
                with self._write_lock:
                    delete_lease(self._api, self._snapshot(), namespace=self.namespace,
                                 timeout=REQUEST_TIMEOUT_SECONDS)  # fmt: skip
        except (Conflict, NotFound):
            pass  # taken over, or deleted as expired: not ours any more
        except Exception as exc:  # noqa: BLE001 - it expires on its own
            log.warning("writer Lease %s/%s: could not delete it (%s: %s); it expires on its own", self.namespace,
                        self.name, type(exc).__name__, exc)  # fmt: skip
        finally:
            self._close()

    def __enter__(self) -> RequestLease:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def _close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    def _snapshot(self) -> WriterLease:
        return WriterLease(name=self.name, resource_version=self._resource_version, request=self.request,
                           holder=self.holder)  # fmt: skip

    # ----- holding -------------------------------------------------------------------------

    def lost_error(self) -> MigrationCancelled | None:
        """What a write raises once the run no longer holds its request (None: it holds it)."""
        if self._lost is None:
            return None
        return MigrationCancelled(self._lost, reason=TAKEN_OVER)

    def fresh(self) -> bool:
        """The run may write: it holds its Lease, renewed recently enough that nobody may take it yet."""
        sent = self._renewed_sent
        return self._lost is None and own_lease_fresh(None if sent is None else self._clock() - sent)

    def _lose(self, why: str) -> None:
        if self._lost is None:
            self._lost = (f"{self.request} was taken over: {why}; this run ({self.holder}) writes nothing more "
                          "(its Lease had expired: the run was stopped, or cut off from the API server, for longer "
                          "than the Lease)")  # fmt: skip
            log.warning("writer Lease %s/%s: %s", self.namespace, self.name, self._lost)
            self._stop.set()

    def _write(self) -> bool:
        """Renew the Lease, saying the rate wanted now; False when it could not (lost, or retried later)."""
        with self._write_lock:
            if self._lost is not None:
                return False
            wanted, sent = self._wanted, self._clock()
            try:
                got = renew_lease(self._api, namespace=self.namespace, name=self.name,
                                  resource_version=self._resource_version, renewed=self._wall(),
                                  writes_per_second=wanted, timeout=REQUEST_TIMEOUT_SECONDS)  # fmt: skip
            except (Conflict, NotFound):
                self._recheck()
                return False
            self._resource_version, self._renewed_sent, self._written = got.resource_version, sent, wanted
            return True

    def _recheck(self) -> None:
        """After a 409 or 404 on our own Lease: ours still (a write whose answer we missed), or lost."""
        current = self._own(list_writer_leases(self._api, namespace=self.namespace, timeout=REQUEST_TIMEOUT_SECONDS))
        if current is None:
            self._lose(
                f"its Lease {self.name} is gone (another run found it expired and deleted it, or took the "
                "request over and has finished)"
            )
        elif current.holder != self.holder:
            self._lose(f"its Lease {self.name} is held by {current.holder}")
        else:
            self._resource_version = current.resource_version

    def _due(self) -> bool:
        sent = self._renewed_sent
        return sent is None or self._clock() - sent >= RENEW_SECONDS or self._written != self._wanted

    def _refresh(self) -> WritersView | None:
        """One LIST of the writers: whether we still hold ours (None: lost), the expired ones deleted,
        the view fed to the limiter."""
        sent = self._clock()
        leases = list_writer_leases(self._api, namespace=self.namespace, timeout=REQUEST_TIMEOUT_SECONDS)
        view = count_writers(leases, now=self._wall(), own=self.name, holder=self.holder)
        if view.lost:
            current = self._own(leases)
            self._lose(
                f"its Lease {self.name} is "
                + (
                    "gone (another run found it expired and deleted it, or took the request over and has finished)"
                    if current is None
                    else f"held by {current.holder}"
                )
            )
            return None
        for expired in view.expired:
            try:  # issue 37: "An expired Lease counts for nothing, and whoever sees it deletes it."
                delete_lease(self._api, expired, namespace=self.namespace, timeout=REQUEST_TIMEOUT_SECONDS)
                log.info("writer Lease %s of %s (held by %s) had expired: deleted", expired.name, expired.request,
                         expired.holder)  # fmt: skip
            except (Conflict, NotFound):
                pass  # renewed, taken over or deleted since our LIST
        # Fed only once the LIST shows our own Lease writing (not one sent before our join landed).
        if self._written and self.fresh() and f"{self.name}/{self.holder}" in view.members:
            self.limiter.set_view(ShareView(rate=view.rate or self._written, writers=max(1, view.writers),
                                            sent_at=sent, members=view.members or None))  # fmt: skip
        return view

    def _round(self) -> None:
        joining = self._wanted is not None and self._written is None
        if self._due() and self._write() and joining and self._written is not None:
            self._joined()
        if self._lost is None:
            self._refresh()

    def _run(self) -> None:
        while not self._stop.wait(REFRESH_SECONDS):
            try:
                self._round()
            except Exception as exc:  # noqa: BLE001 - a stale view pauses writes; a stale Lease stops them
                if type(exc) is not self._failing:
                    log.warning("writer Lease %s/%s: the API server did not answer (%s: %s); writes pause until it "
                                "does", self.namespace, self.name, type(exc).__name__, exc)  # fmt: skip
                self._failing = type(exc)
                continue
            if self._failing is not None:
                log.warning("writer Lease %s/%s: the API server answers again; writes go on", self.namespace,
                            self.name)  # fmt: skip
                self._failing = None

    # ----- writing --------------------------------------------------------------------------

    def join(self, writes_per_second: float) -> None:
        """From now on the run writes at its share of `writes_per_second` (its Lease says so). Its first
        write waits until every other writer has counted it (write_share.join_wait), unless it is alone."""
        self._wanted = writes_per_second
        if self._written == writes_per_second:
            return
        try:
            if self._write():
                self._joined()
        except KubeError as exc:  # the thread says it again and tries every round; no view: no write
            log.warning("writer Lease %s/%s: could not say it writes (%s); tried again in the background",
                        self.namespace, self.name, exc)  # fmt: skip

    def _joined(self) -> None:
        self.limiter.not_before = self._clock() + join_wait(MAX_VIEW_AGE_SECONDS)
        try:
            view = self._refresh()
        except KubeError:
            return  # the thread reads again; the join wait stands
        if view is not None and view.writers == 1:
            self.limiter.not_before = 0.0  # read after we said we write: nobody else writes

    def leave(self) -> None:
        """The run's writes are over (its last chunk is done): its Lease stops counting it at once,
        so the others take its share; it keeps holding the request."""
        self._wanted = None
        if self._written is None:
            return
        try:
            self._write()
        except KubeError as exc:
            log.warning("writer Lease %s/%s: could not stop counting as a writer (%s); tried again in the "
                        "background", self.namespace, self.name, exc)  # fmt: skip

    def pacer(self, *, local_rate: float | None = None) -> LeasePacer:
        """The pacer of a chunk: the run's share (None), or `local_rate` writes/s of its own."""
        local = None if local_rate is None else LocalRateLimiter(local_rate, burst=2.0)
        return LeasePacer(self, local)


class LeasePacer:
    """`Pacer` of a chunk whose run holds a request: each write waits for its share (or its local
    rate), and none goes out once the run lost its request or its Lease is too old to be sure."""

    def __init__(self, lease: RequestLease, local: LocalRateLimiter | None) -> None:
        self._lease = lease
        self._local = local

    def check(self) -> None:
        """Issue 37: "Before each chunk's writes, a run checks that it still holds its request and its Lease"."""
        error = self._lease.lost_error()
        if error is not None:
            raise error

    def before_write(self) -> None:
        self.check()
        if self._local is None:
            self._lease.limiter.acquire(give_up=self._lease.lost_error)
            return
        while not self._lease.fresh():  # local pacing: the Lease alone says whether it may write
            self.check()
            time.sleep(0.1)
        self._local.acquire()
        self.check()

    def after_write(self) -> None:
        if self._local is None:
            self._lease.limiter.answered()
