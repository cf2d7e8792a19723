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
(`WindowedLimiter`). When no Prefect API answers at the start, the local token
bucket alone keeps the rate (one worker's promise only).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from uuid import UUID, uuid4

from prefect import task
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.fleet.names import writers_limit_name
from storage_migrator.migration.pacing import BatchedPacer, LocalRateLimiter, Pacer
from storage_migrator.migration.write_share import ShareView, WindowedLimiter, join_wait
from tasks.common import PRIVATE

log = logging.getLogger(__name__)

#: Seconds between reads of the budget and the writers (one GET of each).
REFRESH_SECONDS = 0.5
#: A view older than this (from the read's sending) stops writes; a joiner waits this long.
MAX_VIEW_AGE_SECONDS = 2.5
#: Prefect's shortest lease; renewed every LEASE_RENEW_SECONDS.
LEASE_SECONDS = 60.0
LEASE_RENEW_SECONDS = 15.0
#: The writers limit is a counter, not a limit: never refuse a writer.
WRITERS_LIMIT = 10_000


class RateLimitInfo(BaseModel):
    """The budget a run uses."""

    model_config = ConfigDict(frozen=True)

    name: str | None = Field(description="The global concurrency limit; None: local pacing only.")
    writes_per_second: float = Field(gt=0)
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


@task(name="ensure-write-rate-limit", **PRIVATE)
def ensure_write_rate_limit(name: str, writes_per_second: float, *, explicit: bool = False) -> RateLimitInfo:
    """The shared budget: created at `writes_per_second` if missing; an existing one
    keeps its rate unless this run was given one explicitly (then it is set for everyone)."""
    local = RateLimitInfo(name=None, writes_per_second=writes_per_second, batch=batch_for(writes_per_second))
    try:
        with get_client(sync_client=True) as client:
            _ensure_writers_limit(client, writers_limit_name(name))
            try:
                existing = client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                try:
                    client.create_global_concurrency_limit(
                        GlobalConcurrencyLimitCreate(
                            name=name, limit=local.batch, slot_decay_per_second=writes_per_second, active=True
                        )
                    )
                except ObjectAlreadyExists:
                    # Two first runs of a budget at once (a new cluster's first dispatch starts two):
                    # the second uses the one the first created, never local pacing beside it.
                    existing = client.read_global_concurrency_limit_by_name(name)
                else:
                    return local.model_copy(update={"name": name})
            if explicit and existing.slot_decay_per_second != writes_per_second:
                client.update_global_concurrency_limit(
                    name,
                    GlobalConcurrencyLimitUpdate(limit=local.batch, slot_decay_per_second=writes_per_second),
                )
                return local.model_copy(update={"name": name})
    except Exception as exc:  # noqa: BLE001 - no reachable Prefect API: pace locally
        log.warning("write budget %s unavailable (%s: %s): pacing writes locally at %s/s", name, type(exc).__name__, exc,
                    writes_per_second)  # fmt: skip
        return local
    if not existing.active or not existing.slot_decay_per_second:
        log.warning("global concurrency limit %s is inactive or has no slot decay: pacing writes locally", name)
        return local
    rate = existing.slot_decay_per_second
    return RateLimitInfo(name=name, writes_per_second=rate, batch=batch_for(rate))


class WriterLease:
    """One migration's place among the writers: holds the lease, keeps the view fresh."""

    def __init__(self, info: RateLimitInfo) -> None:
        if info.name is None:
            raise ValueError("a writer's lease needs the shared budget's name")
        self.name = info.name
        self.writers = writers_limit_name(info.name)
        self.limiter = WindowedLimiter(max_age=MAX_VIEW_AGE_SECONDS)
        self._lease: UUID | None = None
        self._renewed = 0.0
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

    def join(self) -> None:
        with get_client(sync_client=True) as client:
            self._acquire_lease(client)
            view = self._read(client)
        if view.writers == 1:
            self.limiter.not_before = 0.0  # nobody else holds a lease: nobody else writes
        self.limiter.set_view(view)
        self._thread = threading.Thread(target=self._run, name=f"write-share-{self.name}", daemon=True)
        self._thread.start()

    def _renew(self, client: object) -> None:
        if self._lease is None or time.monotonic() - self._renewed < LEASE_RENEW_SECONDS:
            return
        try:
            client.renew_concurrency_lease(self._lease, lease_duration=LEASE_SECONDS)  # type: ignore[attr-defined]
            self._renewed = time.monotonic()
        except ObjectNotFound:
            log.warning("write budget %s: writer's lease expired; joining again", self.name)
            self._acquire_lease(client)

    def _run(self) -> None:
        failing = False  # said once when reads start failing and once when they work again, not twice a second
        with get_client(sync_client=True) as client:
            while not self._stop.wait(REFRESH_SECONDS):
                try:
                    self._renew(client)
                    self.limiter.set_view(self._read(client))
                except Exception as exc:  # noqa: BLE001 - a stale view pauses writes (write_share)
                    if not failing:
                        log.warning("write budget %s: reading the budget failed (%s); writes pause until it "
                                    "answers", self.name, exc)  # fmt: skip
                    failing = True
                    continue
                if failing:
                    log.warning("write budget %s: the budget answers again; writes go on", self.name)
                    failing = False

    def leave(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._lease is not None:
            try:
                with get_client(sync_client=True) as client:
                    client.release_concurrency_slots_with_lease(self._lease)
            except Exception as exc:  # noqa: BLE001 - the lease expires on its own
                log.warning("write budget %s: releasing the writer's lease failed (%s)", self.name, exc)
            self._lease = None


class LeasedPacer:
    """`Pacer` over a writer's lease: no batches, each write waits for its share."""

    batch = 1_000_000

    def __init__(self, limiter: WindowedLimiter) -> None:
        self._limiter = limiter

    def admit(self, n: int) -> None:
        return None

    def before_write(self) -> None:
        self._limiter.acquire()


_HELD: dict[str, WriterLease] = {}
_HELD_LOCK = threading.Lock()


@contextmanager
def writer_lease(info: RateLimitInfo) -> Iterator[RateLimitInfo]:
    """Hold a writer's lease while the body runs (the flow's passes); yields the info chunks get."""
    if info.name is None or info.holder is None:
        yield info
        return
    lease = WriterLease(info)
    try:
        lease.join()
    except Exception as exc:  # noqa: BLE001 - no writers limit reachable: local pacing only
        log.warning("write budget %s unavailable (%s: %s): pacing writes locally", info.name, type(exc).__name__, exc)
        yield info.model_copy(update={"name": None})
        return
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
    try:
        lease.join()
    except Exception as exc:  # noqa: BLE001 - chunk_pacer falls back to a lease per chunk
        log.warning("write budget %s unavailable (%s: %s): the pass joins chunk by chunk", info.name, type(exc).__name__,
                    exc)  # fmt: skip
        return
    with _HELD_LOCK:
        _HELD[info.holder] = lease


@contextmanager
def chunk_pacer(info: RateLimitInfo, *, write_concurrency: int, chunk_limit: int) -> Iterator[Pacer]:
    """The pacer a chunk uses: its migration's share (the lease held in this process,
    or one held for this chunk alone); local pacing when there is no shared budget."""
    lease = _HELD.get(info.holder) if info.name and info.holder else None
    if lease is not None:
        yield LeasedPacer(lease.limiter)
        return
    if info.name is not None:
        with writer_lease(info.model_copy(update={"holder": f"chunk-{uuid4()}"})) as held:
            if held.name is not None and held.holder in _HELD:
                yield LeasedPacer(_HELD[held.holder].limiter)
                return
    limiter = LocalRateLimiter(info.writes_per_second, burst=min(info.batch, write_concurrency))
    yield BatchedPacer(_NoSharedBudget(), limiter, batch=min(info.batch, chunk_limit))


class _NoSharedBudget:
    """Local pacing only: the limiter is the whole budget."""

    def take(self, n: int) -> None:
        return None
