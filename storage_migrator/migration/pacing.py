"""Pacing writes: one budget shared by every worker, spent in batches.

Design decision (DESIGN 4.5, PREFECT.md "Rate limits across workers"): the
shared budget is a Prefect global concurrency limit with slot decay, and one
acquisition is one server round trip, so it is taken `batch` writes at a time
(`WriteBudget.take`), while a local token bucket (`LocalRateLimiter`) paces the
individual writes inside the process at the same rate, so a batch does not go
out as a burst. This module knows nothing of Prefect: the budget is a
`Protocol`; `tasks/` implements it over Prefect, and `LocalRateLimiter` alone
keeps the promise when no Prefect server is reachable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["BatchedPacer", "LocalRateLimiter", "NoPacing", "Pacer", "WriteBudget"]


class WriteBudget(Protocol):
    """Permission for `n` more writes from the budget all workers share; blocks until granted."""

    def take(self, n: int) -> None: ...


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
    """What the chunk loop needs: admit writes from the shared budget, pace each one."""

    batch: int

    def admit(self, n: int) -> None: ...

    def before_write(self) -> None: ...


class NoPacing:
    """No budget and no pacing (tests, benchmarks of raw speed)."""

    batch = 1_000_000

    def admit(self, n: int) -> None:
        return None

    def before_write(self) -> None:
        return None


class BatchedPacer:
    """Takes the shared budget `batch` writes at a time and paces each write locally.

    `admit` is called by the thread that queues the writes (the task's own
    thread: Prefect's concurrency client misbehaves when called from worker
    threads, seen here as 2 s per call and minute-long stalls); `before_write`
    by each writing thread.
    """

    def __init__(self, budget: WriteBudget, limiter: LocalRateLimiter, *, batch: int) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.batch = batch
        self._budget = budget
        self._limiter = limiter
        self._granted = 0

    def admit(self, n: int) -> None:
        while self._granted < n:
            self._budget.take(self.batch)
            self._granted += self.batch
        self._granted -= n

    def before_write(self) -> None:
        self._limiter.acquire()
