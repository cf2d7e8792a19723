"""A writer's share of the write budget: the budget held by leases.

Design decision (issue 13, seed 002 "< 10 writes/s by default"; DESIGN 4.5): the
promise is a count per window, at most `rate * window` writes in any `window`
seconds (10 s) across all writers. Each running migration holds one lease on a
shared counter (the writers), and every writer paces itself at its share:
at most `floor(rate * (window - 0.1 s) / writers) - 1` writes in any sliding `window`,
evenly paced in between (a token bucket of BURST). The shares add up to the budget as long as no writer counts fewer writers than
there are; two rules make sure of that:

- a writer's view (rate and writers, read from the server) is only good for
  `max_age` seconds after the read was *sent*; with an older view it stops
  writing until a read succeeds (a slow or unreachable server pauses writes,
  never speeds them up);
- a writer that joins while others hold leases waits `max_age` (plus
  CATCH_UP_SECONDS, below) before its first write: by then every other
  writer's view was read after it joined.

A writer alone makes up short pauses (a chunk's LIST and checkpoint) within
its 10 s count: once its views have said "one writer" without a gap for
`window + max_age` seconds, nobody else wrote in any window it writes in, so
its bucket may hold CATCH_UP_SECONDS of writes instead of BURST. A joiner's
extra CATCH_UP_SECONDS wait lets that saved-up second leave the window
before the joiner writes; a writer that is left alone after others catches
up only once their last writes are a whole window old.

Why not a slot-decay rate limit (what this replaced): on the Prefect server a
refused acquisition updates the limit's row and restarts its decay clock, so
contending acquirers push each other back (seen as 62 s stalls), and on SQLite
each acquisition waits on the database lock. Here the server sees one lease per
migration, one renewal per `lease_renew` seconds and a read per `refresh`:
never a refusal, and a slow answer costs pace, not the promise.

This module knows nothing of Prefect: `tasks/write_budget.py` feeds it views.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CATCH_UP_SECONDS", "ShareView", "WindowedLimiter", "share_quota"]

#: The promise is checked over this many seconds (issue 13: "never above 1.0 in any 10 s window").
WINDOW_SECONDS = 10.0
#: Seconds of budget kept back for the way to the API server: writes let go
#: 10 s apart may arrive closer together (a loaded client or network); measured
#: at kubesim, 0.1 s was enough on a 2-core machine at load 20+ (bench/budget.py).
JITTER_SECONDS = 0.1
#: Writes a writer may make back to back: one late wake-up (a loaded machine) is
#: caught up instead of lost; the sliding-window count still caps every window.
BURST = 2.0
#: Seconds of writes a writer alone may save up (its pauses between chunks), and
#: the extra wait of a joiner while others hold leases.
CATCH_UP_SECONDS = 1.0


def share_quota(rate: float, writers: int, window: float = WINDOW_SECONDS) -> int:
    """Writes one writer may make in any `window`: its floor share less one, at least 1.

    Floor: the shares of `writers` writers add up to at most `rate * window`.
    Less one: a writer paced at `quota / window` makes at most `l * quota /
    window + 1` writes in a part of length l of a window; the write kept back
    pays for that `+ 1` when writers join or leave mid-window. Less JITTER:
    the API server sees a write when it arrives, not when it was let go.
    """
    if rate <= 0 or window <= 0:
        raise ValueError(f"rate and window must be > 0, got rate={rate}, window={window}")
    return max(1, math.floor(rate * (window - JITTER_SECONDS) / max(1, writers) + 1e-9) - 1)


@dataclass(frozen=True)
class ShareView:
    """What the server said: the budget (writes/s) and how many writers hold a lease.

    `sent_at` is when the read was sent (this process's monotonic clock): the
    view is known to include every writer that joined before that moment.
    """

    rate: float
    writers: int
    sent_at: float


class WindowedLimiter:
    """Paces one writer at its share: a sliding-window count plus a token bucket.

    `acquire` blocks until (1) the view is fresh, (2) fewer than `quota` writes
    happened in the last `window` seconds and (3) the bucket, refilled at
    `quota / window` per second up to BURST, holds a token. Thread-safe;
    sleeps outside the lock.
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
        #: when the views began to say "one writer" without a gap longer than max_age
        self._alone_since: float | None = None
        self._writes: deque[float] = deque()
        self._tokens = 1.0
        self._refilled = clock()
        self._lock = threading.Lock()

    def set_view(self, view: ShareView) -> None:
        with self._lock:
            previous = self._view
            if previous is not None and view.sent_at < previous.sent_at:
                return
            if view.writers != 1:
                self._alone_since = None
            elif self._alone_since is None or previous is None or view.sent_at - previous.sent_at > self.max_age:
                # a gap longer than max_age may hide a writer that joined, wrote and left
                self._alone_since = view.sent_at
            self._view = view

    def _capacity(self, now: float, pace: float) -> float:
        """The bucket's size: BURST, or CATCH_UP_SECONDS of writes for a writer long alone."""
        alone = self._alone_since
        if alone is not None and now - alone >= self.window + self.max_age:
            return max(BURST, CATCH_UP_SECONDS * pace)
        return BURST

    @property
    def quota(self) -> int | None:
        view = self._view
        return None if view is None else share_quota(view.rate, view.writers, self.window)

    def wait_time(self) -> float:
        """Seconds until a write may go out now (0: go), taking it if so. Call under the lock."""
        now = self._clock()
        if now < self.not_before:
            return self.not_before - now
        view = self._view
        if view is None or now - view.sent_at > self.max_age:
            return min(0.05, self.max_age)  # stale: wait for the next read (DESIGN 4.5)
        quota = share_quota(view.rate, view.writers, self.window)
        while self._writes and self._writes[0] <= now - self.window:
            self._writes.popleft()
        if len(self._writes) >= quota:
            # the oldest write leaves the window just after `window` seconds
            return self._writes[-quota] + self.window - now + 1e-6
        pace = quota / self.window
        self._tokens = min(self._capacity(now, pace), self._tokens + (now - self._refilled) * pace)
        self._refilled = now
        if self._tokens < 1.0:
            return (1.0 - self._tokens) / pace
        self._tokens -= 1.0
        self._writes.append(now)
        return 0.0

    def acquire(self) -> None:
        while True:
            with self._lock:
                wait = self.wait_time()
            if wait <= 0:
                return
            self._sleep(wait)
