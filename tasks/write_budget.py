"""The write budget every worker shares, on a Prefect server: the budget held by leases.

Design decision (issue 13; DESIGN 4.5; the rules in `storage_migrator.migration.write_share`):
two global concurrency limits, created idempotently.

- `storage-migrator-writes` carries the budget: its `slot_decay_per_second` is
  the writes per second every run uses. It belongs to the operator once created
  (`prefect gcl update storage-migrator-writes --slot-decay-per-second 50`
  changes it for every running migration within a second). No run takes its
  slots any more: a refused slot-decay acquisition restarts the limit's decay
  clock on the server, and contending runs stalled each other for up to a minute.
- `storage-migrator-writes-writers` counts the migrations writing: each holds
  one slot under a lease (renewed every 15 s, gone 60 s after a crash), never
  refused (its limit is far above any real number of runs).

Each migration reads both every second and paces itself at its share
(`WindowedLimiter`). A limit made inactive (or without slot decay) by the operator
means local pacing: the local token bucket alone keeps the rate (one worker's promise only).

Issue 31: a Prefect server that does not answer is not a reason to pace locally: several
workers pacing locally exceed the budget, and a run that fell back never came back. While
the budget does not answer the run writes nothing (a stale view's pace is 0); a lease that
could not be taken at the start is taken in the background once the server answers, the
limits created then if missing. A chunk waiting longer than its grace (a quarter of the lease) stops
(`BudgetUnreachable`): the flow keeps its request's lease and waits for the server.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from uuid import UUID, uuid4

import httpx
from prefect import task
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.fleet.names import writers_limit_name
from storage_migrator.migration.chunk_terms import BudgetUnreachable
from storage_migrator.migration.pacing import BatchedPacer, LocalRateLimiter, Pacer
from storage_migrator.migration.write_share import ShareView, WindowedLimiter, join_wait
from tasks.common import PRIVATE
from tasks.single_try import single_try

log = logging.getLogger(__name__)

#: Seconds between reads of the budget and the writers (one GET of each).
REFRESH_SECONDS = 0.5
#: A view older than this (from the read's sending) stops writes; a joiner waits this long.
MAX_VIEW_AGE_SECONDS = 2.5
#: Prefect's shortest lease; renewed every LEASE_RENEW_SECONDS.
LEASE_SECONDS = 60.0
LEASE_RENEW_SECONDS = 15.0
#: Seconds between tries to heal the writers' count after a rejoin (a restarted server may answer 503 at first).
HEAL_RETRY_SECONDS = 5.0
#: The writers limit is a counter, not a limit: never refuse a writer.
WRITERS_LIMIT = 10_000
#: How long a write waits on a budget that does not answer before its chunk stops (issue 31), as
#: a share of the request's lease (lease_seconds, 600 s by default: 150 s). A server's restart is
#: waited out inside the chunk; a longer outage stops it (the chunk is done again later), so that
#: the run refreshes its request's lease long before a dispatcher would resume it beside it.
SILENCE_SHARE_OF_LEASE = 0.25


class RateLimitInfo(BaseModel):
    """The budget a run uses."""

    model_config = ConfigDict(frozen=True)

    name: str | None = Field(description="The global concurrency limit; None: local pacing only.")
    writes_per_second: float = Field(gt=0)
    silence_grace_seconds: float = Field(
        default=150.0,
        gt=0,
        description="Seconds a write waits on a budget that does not answer before its chunk stops "
        "(SILENCE_SHARE_OF_LEASE of the lease).",
    )
    ensured: bool = Field(
        default=True,
        description="False: the limits could not be read or made at the start "
        "(the server did not answer); the writer's lease makes them when it answers.",
    )
    batch: int = Field(ge=1, description="Writes admitted at a time by the local pacer.")
    holder: str | None = Field(default=None, description="The migration holding a writer's lease in this process.")


def batch_for(rate: float) -> int:
    """About one second of writes."""
    return max(1, math.floor(rate))


def _ensure_writers_limit(client: object, name: str) -> None:
    try:
        client.read_global_concurrency_limit_by_name(name)  # type: ignore[attr-defined]
    except ObjectNotFound:
        # another run may create it between our read and our create: the same counter
        with contextlib.suppress(ObjectAlreadyExists):
            client.create_global_concurrency_limit(  # type: ignore[attr-defined]
                GlobalConcurrencyLimitCreate(name=name, limit=WRITERS_LIMIT, slot_decay_per_second=0.0, active=True)
            )


def _ensure_limits(client: object, name: str, writes_per_second: float, *, explicit: bool) -> RateLimitInfo:
    """The budget and its writers' counter, made if missing; the budget's rate (see below)."""
    local = RateLimitInfo(name=None, writes_per_second=writes_per_second, batch=batch_for(writes_per_second))
    _ensure_writers_limit(client, writers_limit_name(name))
    try:
        existing = client.read_global_concurrency_limit_by_name(name)  # type: ignore[attr-defined]
    except ObjectNotFound:
        try:
            client.create_global_concurrency_limit(  # type: ignore[attr-defined]
                GlobalConcurrencyLimitCreate(
                    name=name, limit=local.batch, slot_decay_per_second=writes_per_second, active=True
                )
            )
        except ObjectAlreadyExists:
            # Two first runs of a budget at once (a new cluster's first dispatch starts two):
            # the second uses the one the first created, never local pacing beside it.
            existing = client.read_global_concurrency_limit_by_name(name)  # type: ignore[attr-defined]
        else:
            return local.model_copy(update={"name": name})
    if explicit and existing.slot_decay_per_second != writes_per_second:
        client.update_global_concurrency_limit(  # type: ignore[attr-defined]
            name, GlobalConcurrencyLimitUpdate(limit=local.batch, slot_decay_per_second=writes_per_second)
        )
        return local.model_copy(update={"name": name})
    if not existing.active or not existing.slot_decay_per_second:
        log.warning("global concurrency limit %s is inactive or has no slot decay: pacing writes locally", name)
        return local
    rate = existing.slot_decay_per_second
    return RateLimitInfo(name=name, writes_per_second=rate, batch=batch_for(rate))


@task(name="ensure-write-rate-limit", **PRIVATE)
def ensure_write_rate_limit(name: str, writes_per_second: float, *, explicit: bool = False) -> RateLimitInfo:
    """The shared budget: created at `writes_per_second` if missing; an existing one
    keeps its rate unless this run was given one explicitly (then it is set for everyone).
    A server that does not answer leaves it to the writer's lease (issue 31), never to local pacing."""
    try:
        with get_client(sync_client=True) as client:
            return _ensure_limits(client, name, writes_per_second, explicit=explicit)
    except Exception as exc:  # noqa: BLE001 - the lease makes them once the server answers
        log.warning("write budget %s unavailable (%s: %s): no writes until the Prefect server answers", name,
                    type(exc).__name__, exc)  # fmt: skip
        return RateLimitInfo(name=name, writes_per_second=writes_per_second, batch=batch_for(writes_per_second),
                             ensured=False)  # fmt: skip


def _lease_gone(exc: BaseException) -> bool:
    """A renewal the server refused because it does not know the lease: Prefect 3.9 answers
    410 Gone (issue 31: after a restart, its leases kept in memory are gone), older ones 404."""
    if isinstance(exc, ObjectNotFound):
        return True
    response = getattr(exc, "response", None)
    return isinstance(exc, httpx.HTTPStatusError) and response is not None and response.status_code in (404, 410)


class WriterLease:
    """One migration's place among the writers: holds the lease, keeps the view fresh.

    The lease is taken at `join` if the server answers, else by the background thread once it
    does (issue 31); until then the limiter has no view and nothing is written."""

    def __init__(self, info: RateLimitInfo, *, on_rejoin: Callable[[], bool] | None = None) -> None:
        if info.name is None:
            raise ValueError("a writer's lease needs the shared budget's name")
        self.info = info
        #: called (in the lease's thread) after it joined again because the server forgot its
        #: lease: the slot of the lost lease is still counted (issue 31; `heal_writers_count`).
        #: Called again every HEAL_RETRY_SECONDS until it returns True (healed, or nothing to heal).
        self._on_rejoin = on_rejoin
        self._rejoined = False
        self.name = info.name
        self.writers = writers_limit_name(info.name)
        self.limiter = WindowedLimiter(max_age=MAX_VIEW_AGE_SECONDS)
        self._lease: UUID | None = None
        self._renewed = 0.0
        self._ensured = info.ensured
        #: since when (monotonic) reads of the budget fail; None: the last one answered (for the log)
        self._failing_since: float | None = None
        #: when (monotonic) the budget last answered: silence counts from here, not from a read's
        #: failure, which the client's retries put off by up to a minute (2 + 4 + 8 + 16 + 32 s)
        self._answered_at = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _acquire_lease(self, client: object) -> None:
        resp = client.increment_concurrency_slots_with_lease(  # type: ignore[attr-defined]
            names=[self.writers], slots=1, mode="concurrency", lease_duration=LEASE_SECONDS
        )
        self._lease = UUID(resp.json()["lease_id"])
        self._renewed = time.monotonic()
        # Others' views may not count this writer for MAX_VIEW_AGE seconds, and a writer
        # alone may have saved up a little (write_share.join_wait).
        self.limiter.not_before = self._renewed + join_wait(MAX_VIEW_AGE_SECONDS)

    def _read(self, client: object) -> ShareView:
        sent = time.monotonic()
        budget = client.read_global_concurrency_limit_by_name(self.name)  # type: ignore[attr-defined]
        writers = client.read_global_concurrency_limit_by_name(self.writers)  # type: ignore[attr-defined]
        rate = float(budget.slot_decay_per_second) if budget.active and budget.slot_decay_per_second else 0.0
        if rate <= 0:
            raise RuntimeError(f"global concurrency limit {self.name} is inactive or has no slot decay")
        return ShareView(rate=rate, writers=max(1, int(writers.active_slots)), sent_at=sent)

    def _connect(self, client: object) -> ShareView:
        """The limits made if the start could not, the lease taken, a first view."""
        if not self._ensured:
            _ensure_limits(client, self.name, self.info.writes_per_second, explicit=False)
            self._ensured = True
        if self._stop.is_set():  # leaving before the server answered: take no lease
            raise RuntimeError(f"write budget {self.name}: the writer is leaving")
        self._acquire_lease(client)
        view = self._read(client)
        if view.writers == 1:
            self.limiter.not_before = 0.0  # nobody else holds a lease: nobody else writes
        return view

    def join(self) -> None:
        self._answered_at = time.monotonic()
        try:
            with get_client(sync_client=True) as client:
                view = self._connect(client)
        except Exception as exc:  # noqa: BLE001 - the thread takes the lease once the server answers
            log.warning("write budget %s unavailable (%s: %s): no writes until the Prefect server answers", self.name,
                        type(exc).__name__, exc)  # fmt: skip
            # A lease taken before a read failed is kept: the thread renews it instead of taking another.
            self._failing_since = time.monotonic()
        else:
            self.limiter.set_view(view)
            self._answered_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"write-share-{self.name}", daemon=True)
        self._thread.start()

    def _renew(self, client: object) -> None:
        if self._lease is None or time.monotonic() - self._renewed < LEASE_RENEW_SECONDS:
            return
        try:
            client.renew_concurrency_lease(self._lease, lease_duration=LEASE_SECONDS)  # type: ignore[attr-defined]
            self._renewed = time.monotonic()
        except Exception as exc:
            if not _lease_gone(exc):
                raise
            if self._stop.is_set():  # leaving: a lease taken now would outlive the run (a ghost writer)
                return
            log.warning("write budget %s: the server no longer knows the writer's lease (it expired, or the server "
                        "restarted); joining again", self.name)  # fmt: skip
            self._acquire_lease(client)
            self._rejoined = True

    def _refresh(self, client: object) -> ShareView:
        if self._lease is None:
            return self._connect(client)
        self._renew(client)
        return self._read(client)

    def _run(self) -> None:
        failed_with: type[BaseException] | None = None
        heal_after = 0.0
        with get_client(sync_client=True) as client:
            while not self._stop.wait(REFRESH_SECONDS):
                try:
                    self.limiter.set_view(self._refresh(client))
                except Exception as exc:  # noqa: BLE001 - a stale view pauses writes (write_share)
                    # Said when reads start failing, or fail otherwise, not twice a second.
                    if self._failing_since is None or type(exc) is not failed_with:
                        log.warning("write budget %s: reading the budget failed (%s: %s); writes pause until it "
                                    "answers", self.name, type(exc).__name__, exc)  # fmt: skip
                        failed_with = type(exc)
                    if self._failing_since is None:
                        self._failing_since = time.monotonic()
                    continue
                self._answered_at = time.monotonic()
                if self._failing_since is not None:
                    log.warning("write budget %s: the budget answers again after %.0f s; writes go on", self.name,
                                time.monotonic() - self._failing_since)  # fmt: skip
                    self._failing_since = None
                if self._rejoined and self._on_rejoin is not None and time.monotonic() >= heal_after:
                    try:
                        self._rejoined = not self._on_rejoin()
                    except Exception as exc:  # noqa: BLE001 - a server just restarted may answer 503: again soon
                        log.warning("write budget %s: healing the writers' count failed (%s); trying again in %.0f s",
                                    self.name, exc, HEAL_RETRY_SECONDS)  # fmt: skip
                    heal_after = time.monotonic() + HEAL_RETRY_SECONDS

    def wait_answered(self, timeout: float) -> bool:
        """Block until the budget answers (True) or `timeout` seconds pass."""
        deadline = time.monotonic() + timeout
        while self.silent_for() > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, REFRESH_SECONDS))
        return True

    def silent_for(self) -> float:
        """Seconds since the budget last answered, once that is longer than a view may be old
        (0: it answers; writes go on)."""
        silent = time.monotonic() - self._answered_at
        return silent if silent > MAX_VIEW_AGE_SECONDS else 0.0

    def unreachable(self) -> BudgetUnreachable | None:
        """What a waiting write raises once the budget has been silent longer than the grace."""
        silent = self.silent_for()
        if silent < self.info.silence_grace_seconds:
            return None
        return BudgetUnreachable(f"the write budget {self.name} has not answered for {silent:.0f} s (the Prefect "
                                 "server is unreachable): writes stop until it answers")  # fmt: skip

    def leave(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._lease is not None:
            # A budget that is silent is asked once, not through the client's retries: the run is
            # ending (or giving up on the server), and the lease expires on its own.
            tries = single_try() if self.silent_for() > 0 else contextlib.nullcontext()
            try:
                with tries, get_client(sync_client=True) as client:
                    client.release_concurrency_slots_with_lease(self._lease)
            except Exception as exc:  # noqa: BLE001 - the lease expires on its own
                log.warning("write budget %s: releasing the writer's lease failed (%s)", self.name, exc)
            self._lease = None


class LeasedPacer:
    """`Pacer` over a writer's lease: no batches, each write waits for its share, and stops
    its chunk (`BudgetUnreachable`) once the budget has been silent past the grace."""

    batch = 1_000_000

    def __init__(self, lease: WriterLease) -> None:
        self._lease = lease

    def admit(self, n: int) -> None:
        return None

    def before_write(self) -> None:
        self._lease.limiter.acquire(give_up=self._lease.unreachable)


_HELD: dict[str, WriterLease] = {}
_HELD_LOCK = threading.Lock()


@contextmanager
def writer_lease(info: RateLimitInfo, *, on_rejoin: Callable[[], bool] | None = None) -> Iterator[RateLimitInfo]:
    """Hold a writer's lease while the body runs (the flow's passes); yields the info chunks get."""
    if info.name is None or info.holder is None:
        yield info
        return
    lease = WriterLease(info, on_rejoin=on_rejoin)
    lease.join()
    with _HELD_LOCK:
        _HELD[info.holder] = lease
    try:
        yield info
    finally:
        with _HELD_LOCK:
            again = _HELD.pop(info.holder, None)  # the one `rejoin_writer` took, if any
        if again is not None and again is not lease:
            again.leave()
        lease.leave()  # a second leave (after release_writer) does nothing


def wait_for_budget(info: RateLimitInfo, timeout: float) -> float:
    """Wait up to `timeout` seconds for the run's shared budget to answer; the seconds it has
    been silent then (0: it answers, or the run holds no lease)."""
    lease = _HELD.get(info.holder) if info.name and info.holder else None
    if lease is None:
        return 0.0
    lease.wait_answered(timeout)
    return lease.silent_for()


def release_writer(info: RateLimitInfo) -> None:
    """The run's writes are over (its last chunk is done): give its share back now,
    not after the checks that end the run. A later pass joins again, chunk by chunk."""
    if info.holder is None:
        return
    with _HELD_LOCK:
        lease = _HELD.pop(info.holder, None)
    if lease is not None:
        lease.leave()


def rejoin_writer(info: RateLimitInfo) -> None:
    """A new pass writes again after `release_writer`: take the run's lease back once,
    so its chunks share one lease instead of joining (and waiting) chunk by chunk."""
    if info.name is None or info.holder is None:
        return
    with _HELD_LOCK:
        if info.holder in _HELD:
            return
    lease = WriterLease(info)
    lease.join()
    with _HELD_LOCK:
        _HELD[info.holder] = lease


@contextmanager
def chunk_pacer(info: RateLimitInfo, *, write_concurrency: int, chunk_limit: int) -> Iterator[Pacer]:
    """The pacer a chunk uses: its migration's share (the lease held in this process,
    or one held for this chunk alone); local pacing when there is no shared budget."""
    lease = _HELD.get(info.holder) if info.name and info.holder else None
    if lease is not None:
        yield LeasedPacer(lease)
        return
    if info.name is not None:
        holder = f"chunk-{uuid4()}"
        with writer_lease(info.model_copy(update={"holder": holder})):
            yield LeasedPacer(_HELD[holder])
        return
    limiter = LocalRateLimiter(info.writes_per_second, burst=min(info.batch, write_concurrency))
    yield BatchedPacer(_NoSharedBudget(), limiter, batch=min(info.batch, chunk_limit))


class _NoSharedBudget:
    """Local pacing only: the limiter is the whole budget."""

    def take(self, n: int) -> None:
        return None
