"""A writer's share of the write budget: the budget held by leases.

Design decision (issue 13, seed 002 "< 10 writes/s by default"; DESIGN 4.5): the
promise is a count per window, at most `rate * window` writes in any `window`
seconds (10 s) across all writers. Each running migration holds one lease (issue 37:
a Lease in the cluster, write_budget.py) and paces itself at its share

    share_pace(rate, n) = (rate * (window - JITTER) / n - 1) / window

with a token bucket of BURST writes and a window count: its last `window`
seconds hold at most the pace over them plus one write. So n writers pacing at
the share of n make at most n * (share * window + 1) = rate * (window - JITTER)
in any window. What keeps every writer at a share no larger than that of the
writers actually writing:

- **A view is good for `max_age`** seconds from the moment its read was sent;
  with an older one the pace is 0 (a slow or unreachable server pauses writes,
  never speeds them up, and a pause earns nothing).
- **A joiner waits `join_wait` = max_age + 2 * CATCH_UP_SECONDS** before its first
  write when others hold leases: by then each of them has read a view that
  counts it, or has stopped.
- **Writers already writing keep their pace until shortly before the joiner may
  write.** A writer that sees the writers grow knows the joiner joined after
  its previous read was sent, so the joiner writes no earlier than that read +
  join_wait; it keeps its pace until then, less a margin (`_Hold`), then takes
  the smaller share. The margin pays for what the window count does not cover
  when a pace falls (each writer's bucket may hold a write more): n writes at
  the new share, or 2 * CATCH_UP_SECONDS after a catch-up (below). The design
  this replaced cut the pace at once and capped each writer's 10 s count at
  the new share: a writer whose last 10 s were above it stopped for seconds
  while the joiner still waited (about 10% of the budget lost with three
  migrations in bench/budget.py). A writer that sees the writers shrink takes
  the larger share at once: a leaver stops writing before it gives its lease back.

A writer alone makes up short pauses (a chunk's LIST and checkpoint): once its
views have said "one writer", without a gap longer than max_age, for window +
max_age seconds, nobody else wrote in any window it writes in, so its bucket may
hold CATCH_UP_SECONDS of writes, still within its window count. Saved up, or
spent within the last window, when it learns of a joiner, those writes are paid
for by its margin: at half the budget, 2 * CATCH_UP_SECONDS of the joiner's share.
tests/unit/migration/test_write_share.py simulates joins, leaves, slow reads and pauses
and checks every 10 s window.

This module knows nothing of Prefect nor of Kubernetes: `request_lease.py` feeds it views
read from the writers' Leases (issue 37; the rule of who counts: `write_budget.py`).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CATCH_UP_SECONDS", "ShareView", "WindowedLimiter", "join_wait", "share_pace"]

#: The promise is checked over this many seconds (issue 13: "never above 1.0 in any 10 s window").
WINDOW_SECONDS = 10.0
#: Seconds of budget kept back for the way to the API server: writes let go
#: 10 s apart may arrive closer together (a loaded client or network); measured
#: at kubesim, 0.1 s was enough on a 2-core machine at load 20+ (bench/budget.py).
JITTER_SECONDS = 0.1
#: Writes a writer's bucket may hold: one late wake-up (a loaded machine) is caught up
#: instead of lost; the window count still holds every window to the pace plus one.
BURST = 2.0
#: Seconds of writes a writer long alone may save up (its pauses between chunks).
CATCH_UP_SECONDS = 0.5


def _check(rate: float, writers: int, window: float) -> None:
    if rate <= 0 or window <= JITTER_SECONDS or writers < 1:
        raise ValueError(f"rate, writers and window must be > 0, got rate={rate}, writers={writers}, window={window}")


def share_pace(rate: float, writers: int, window: float = WINDOW_SECONDS) -> float:
    """Writes per second one of `writers` writers may make: its share of `rate * (window - JITTER)`
    per window, less the one write its bucket may hold, spread over the window."""
    _check(rate, writers, window)
    return max(0.0, (rate * (window - JITTER_SECONDS) / writers - 1.0) / window)


def join_wait(max_age: float) -> float:
    """Seconds a joiner waits before its first write while others hold leases."""
    return max_age + 2 * CATCH_UP_SECONDS


@dataclass(frozen=True)
class ShareView:
    """What the cluster said: the budget (writes/s) and how many writers hold a lease.

    `sent_at` is when the read was sent (this process's monotonic clock): the
    view is known to include every writer that joined before that moment.
    `members`, when known, names them (issue 37: each writer's Lease), so that a
    writer that sees one leave as another joins between two reads keeps the
    leaver's share until the joiner may write, as it would had it seen them apart.
    """

    rate: float
    writers: int
    sent_at: float
    members: frozenset[str] | None = None


@dataclass(frozen=True)
class _Hold:
    """A pace kept after the writers grew, until the newcomer may write (less the margin)."""

    pace: float
    until: float


class WindowedLimiter:
    """Paces one writer at its share (see the module docstring). Thread-safe; sleeps outside the lock.

    `acquire` blocks until the view is fresh, the bucket holds a write, and the
    last window holds fewer writes than the pace allowed over it plus one (a write
    counting from its answer, `answered`, and as now until then).
    """

    def __init__(
        self,
        *,
        max_age: float,
        window: float = WINDOW_SECONDS,
        not_before: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if max_age <= 0:
            raise ValueError(f"max_age must be > 0, got {max_age}")
        self.max_age = max_age
        self.window = window
        self.not_before = not_before
        self._clock = clock
        self._sleep = sleep
        self._view: ShareView | None = None
        self._holds: list[_Hold] = []
        #: writers named by the views that joined since the view before (member -> until when they
        #: do not write yet, less the margin): views that name their writers (issue 37)
        self._joining: dict[str, float] = {}
        #: when the views began to say "one writer" without a gap longer than max_age
        self._alone_since: float | None = None
        #: when the answers of this writer's writes came (the window counts them from then), and
        #: how many writes were let go whose answer has not come yet (counted as now)
        self._answered: deque[float] = deque()
        self._in_flight = 0
        #: the pace over the last window: (start, end, writes per second)
        self._paced: deque[tuple[float, float, float]] = deque()
        self._tokens = 1.0
        #: when this writer last let a write go from a bucket holding more than BURST (a catch-up)
        self._caught_up_at = -math.inf
        self._advanced = clock()
        self._lock = threading.Lock()

    @property
    def pace(self) -> float | None:
        """Writes per second at the newest view's share (None: no view yet)."""
        view = self._view
        return None if view is None else share_pace(view.rate, view.writers, self.window)

    def set_view(self, view: ShareView) -> None:
        with self._lock:
            previous = self._view
            if previous is not None and view.sent_at < previous.sent_at:
                return
            now = self._clock()
            self._advance(now)
            if previous is not None and view.members is not None and previous.members is not None:
                # Named writers (their Leases): each one new since `previous` was sent writes no
                # earlier than previous.sent_at + join_wait; until then (less the margin) its share
                # is the others'. A writer gone since has stopped: its share is free at once, even
                # while another joins (a dispatcher starts the next migration as one ends).
                until = previous.sent_at + join_wait(self.max_age) - self._margin(now, view)
                for member in view.members - previous.members:
                    self._joining[member] = until
                self._joining = {m: u for m, u in self._joining.items() if m in view.members and u > now}
            elif previous is not None and view.writers > previous.writers:
                # Someone joined after `previous` was sent: it writes no earlier than
                # previous.sent_at + join_wait. Keep the pace until then, less the margin.
                # The share of the writers `previous` counted, not the pace in force: that may be
                # an earlier hold's, good only until an earlier joiner may write.
                held = previous.sent_at + join_wait(self.max_age) - self._margin(now, view)
                pace = share_pace(previous.rate, previous.writers, self.window)
                self._holds.append(_Hold(pace=pace, until=held))
            if view.writers != 1:
                self._alone_since = None
            elif self._alone_since is None or previous is None or view.sent_at - previous.sent_at > self.max_age:
                # a gap longer than max_age may hide a writer that joined, wrote and left
                self._alone_since = view.sent_at
            self._view = view
            self._tokens = min(self._tokens, self._capacity(now))

    def _margin(self, now: float, view: ShareView) -> float:
        """How long before the newcomer may write the old pace ends. It pays, at the new share,
        for what a window may hold beyond the pace: a catch-up saved up in the bucket at this
        read, or spent within the last window (2 * CATCH_UP at half the budget), else one write
        of each writer's bucket. Judged by what the bucket held, not by what it may hold: a
        writer long alone that writes without pauses saves nothing up, and a margin of a whole
        second at every join cost issue 37's join-and-leave test 1-2% of the budget."""
        if self._tokens > BURST or now - self._caught_up_at < self.window:
            return 2 * CATCH_UP_SECONDS
        pace = share_pace(view.rate, view.writers, self.window)
        return min(2 * CATCH_UP_SECONDS, view.writers / pace) if pace > 0 else 2 * CATCH_UP_SECONDS

    def _pace_at(self, t: float) -> float:
        """The pace in force at `t`: 0 with no fresh view; else the share of the view's writers less
        those that do not write yet, or a hold's, the larger."""
        view = self._view
        if view is None or t > view.sent_at + self.max_age:
            return 0.0
        held = max((h.pace for h in self._holds if t < h.until), default=0.0)
        waiting = sum(1 for until in self._joining.values() if t < until)
        return max(share_pace(view.rate, max(1, view.writers - waiting), self.window), held)

    def _advance(self, now: float) -> None:
        """Refill the bucket with the pace since the last call (piecewise: holds end, the view
        ages), and keep the last window's pace for the window count."""
        if now <= self._advanced:
            return
        fresh_until = -math.inf if self._view is None else self._view.sent_at + self.max_age
        t, added = self._advanced, 0.0
        for edge in sorted({now, fresh_until, *(h.until for h in self._holds), *self._joining.values()}):
            if edge <= t:
                continue
            end = min(edge, now)
            pace = self._pace_at((t + end) / 2)  # constant between edges
            added += (end - t) * pace
            if self._paced and self._paced[-1][1] == t and self._paced[-1][2] == pace:
                self._paced[-1] = (self._paced[-1][0], end, pace)  # one segment per pace, not per call
            else:
                self._paced.append((t, end, pace))
            t = end
            if t >= now:
                break
        self._tokens = min(self._capacity(now), self._tokens + added)
        self._advanced = now
        self._holds = [h for h in self._holds if h.until > now]
        self._joining = {m: until for m, until in self._joining.items() if until > now}
        while self._paced and self._paced[0][1] <= now - self.window:
            self._paced.popleft()

    def _allowed(self, now: float) -> int:
        """Writes the last window may hold: the pace over it, plus the one write of the bucket."""
        start = now - self.window
        paced = sum((end - max(begin, start)) * pace for begin, end, pace in self._paced if end > start)
        return math.floor(paced + 1.0 + 1e-9)

    def _capacity(self, now: float) -> float:
        """BURST writes, or CATCH_UP_SECONDS of writes for a writer long alone."""
        alone = self._alone_since
        if alone is not None and now - alone >= self.window + self.max_age:
            return max(BURST, CATCH_UP_SECONDS * self._pace_at(now))
        return BURST

    def wait_time(self) -> float:
        """Seconds until a write may go out now (0: go), taking it if so. Call under the lock."""
        now = self._clock()
        if now < self.not_before:
            return self.not_before - now
        self._advance(now)
        pace = self._pace_at(now)
        if pace <= 0:
            return min(0.05, self.max_age)  # stale: wait for the next read (DESIGN 4.5)
        while self._answered and self._answered[0] <= now - self.window:
            self._answered.popleft()
        if len(self._answered) + self._in_flight >= self._allowed(now):
            # the window's count leaves room as its oldest write leaves it, an answer comes, or the pace adds up
            oldest = self._answered[0] + self.window - now + 1e-6 if self._answered else 1.0 / pace
            return min(oldest, 1.0 / pace)
        if self._tokens < 1.0:
            return (1.0 - self._tokens) / pace
        if self._tokens > BURST:
            self._caught_up_at = now
        self._tokens -= 1.0
        self._in_flight += 1
        return 0.0

    def answered(self) -> None:
        """A write let go by `acquire` has its answer (or failed): from now on it counts in the window
        as of now. A write arrives at the API server between its release and its answer, so counting
        it from its answer, and until then as now, holds every window of arrivals to the count,
        however late a loaded client sends what it let go on time."""
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            self._answered.append(self._clock())

    def acquire(self, give_up: Callable[[], BaseException | None] | None = None) -> None:
        """Block until a write may go out. `give_up` is asked before each wait: what it
        returns is raised instead (issue 31: a budget that stopped answering ends the wait)."""
        while True:
            with self._lock:
                wait = self.wait_time()
            if wait <= 0:
                return
            error = give_up() if give_up is not None else None
            if error is not None:
                raise error
            self._sleep(wait)
