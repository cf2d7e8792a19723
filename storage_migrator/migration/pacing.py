"""Pacing writes: a token bucket, and what the chunk loop asks before each write.

Design decision (DESIGN 4.5; issue 37): the chunk loop knows two things about the budget,
`Pacer.before_write`, called by each writing thread before each write (retries included),
and `Pacer.after_write`, once its answer is in (or the request failed): a write counts in
the budget's window from its answer, the latest it can have reached the API server, so that
writes let go on time but sent late by a loaded client never arrive bunched beyond it.
The run's share of the budget every writer in the cluster shares is
`request_lease.LeasePacer` (its request's Lease, write_budget.py's rule); `LocalPacer`
paces one run alone; `NoPacing` is for tests and benchmarks of raw speed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["LocalPacer", "LocalRateLimiter", "NoPacing", "Pacer"]


class LocalRateLimiter:
    """A token bucket: at most `rate` acquisitions per second, bursts up to `burst`.

    Thread-safe; `acquire` sleeps outside the lock.
    """

    def __init__(
        self,
        rate: float,
        *,
        burst: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        self.rate = rate
        self.burst = max(burst, 1.0)
        self._clock = clock
        self._sleep = sleep
        self._tokens = self.burst
        self._last = clock()
        self._lock = threading.Lock()

    def acquire(self) -> None:
        while True:
            with self._lock:
                now = self._clock()
                self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
                self._last = now
                if self._tokens >= 1.0:
                    self._tokens -= 1.0
                    return
                wait = (1.0 - self._tokens) / self.rate
            self._sleep(wait)


class Pacer(Protocol):
    """What the chunk loop needs: block until the next write may go out (or raise to stop the
    chunk), and hear when its answer is in."""

    def before_write(self) -> None: ...

    def after_write(self) -> None: ...


class NoPacing:
    """No budget and no pacing (tests, benchmarks of raw speed)."""

    def before_write(self) -> None:
        return None

    def after_write(self) -> None:
        return None


class LocalPacer:
    """One run paced alone by a token bucket: its promise holds for itself only."""

    def __init__(self, limiter: LocalRateLimiter) -> None:
        self._limiter = limiter

    def before_write(self) -> None:
        self._limiter.acquire()

    def after_write(self) -> None:
        return None
