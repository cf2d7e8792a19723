"""Pacing writes (storage_migrator.migration.pacing), on a fake clock.

Seed 002's goal: the migrator "should generate less than 10 qps of single object
operations". A run paced alone (`LocalPacer`) keeps it with a token bucket; the
run's share of the cluster's budget is tests/unit/migration/test_write_budget_rule.py's
and test_write_share.py's. The clock is a fake that the limiter's `sleep` advances,
so rates are checked exactly and nothing waits.
"""

from __future__ import annotations

import itertools
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage_migrator.migration.pacing import LocalPacer, LocalRateLimiter, NoPacing, Pacer

MIN_SLEEP = 1e-6


class FakeClock:
    """monotonic() and sleep() of a world where sleeping only moves the clock.

    As a real sleep, one takes at least a microsecond: a float clock far from 0
    cannot advance by a wait smaller than its resolution, and the limiter's
    tiny top-up waits (float rounding of tokens) would otherwise never end.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.slept: list[float] = []
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        with self._lock:
            self.slept.append(seconds)
            self.now += max(seconds, MIN_SLEEP)


class CountingLimiter(LocalRateLimiter):
    def __init__(self, rate: float, clock: FakeClock) -> None:
        super().__init__(rate, clock=clock, sleep=clock.sleep)
        self.acquired = 0
        self._count_lock = threading.Lock()

    def acquire(self) -> None:
        super().acquire()
        with self._count_lock:
            self.acquired += 1


def acquisition_times(limiter: LocalRateLimiter, clock: FakeClock, n: int) -> list[float]:
    times = []
    for _ in range(n):
        limiter.acquire()
        times.append(clock() - 1000.0)
    return times


def test_ten_writes_per_second_by_default_rate() -> None:
    """Seed 002's 10 qps: 101 writes take 10 s (the first goes at once)."""
    clock = FakeClock()
    times = acquisition_times(LocalRateLimiter(10, clock=clock, sleep=clock.sleep), clock, 101)
    assert times[0] == 0
    assert times[-1] == pytest.approx(10.0)
    assert all(b - a == pytest.approx(0.1) for a, b in itertools.pairwise(times))


@given(
    rate=st.floats(min_value=0.1, max_value=1000),
    burst=st.floats(min_value=1, max_value=20),
    n=st.integers(min_value=1, max_value=200),
)
def test_the_limiter_gives_the_configured_rate(rate: float, burst: float, n: int) -> None:
    """A token bucket: any window of t seconds holds at most burst + rate * t
    acquisitions, and the limiter waits no longer than that needs."""
    clock = FakeClock()
    times = acquisition_times(LocalRateLimiter(rate, burst=burst, clock=clock, sleep=clock.sleep), clock, n)
    tolerance = 1e-6
    for i in range(n):
        for j in range(i, n):
            assert j - i + 1 <= burst + (times[j] - times[i]) * rate + tolerance
    # and no slower than needed (up to the fake's microsecond per top-up sleep)
    assert times[-1] == pytest.approx(max(0.0, n - burst) / rate, rel=1e-6, abs=4 * n * MIN_SLEEP)


def test_an_idle_limiter_does_not_save_up_more_than_its_burst() -> None:
    clock = FakeClock()
    limiter = LocalRateLimiter(2, burst=3, clock=clock, sleep=clock.sleep)
    clock.now += 3600  # an hour idle
    times = acquisition_times(limiter, clock, 5)
    assert [t - times[0] for t in times] == pytest.approx([0, 0, 0, 0.5, 1.0])


def test_the_limiter_is_shared_by_threads() -> None:
    clock = FakeClock()
    limiter = CountingLimiter(5, clock)

    def worker() -> None:
        for _ in range(20):
            limiter.acquire()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert limiter.acquired == 80
    # 80 acquisitions at 5/s, the first free: at least 79 / 5 s passed on the clock
    assert clock() - 1000.0 >= 79 / 5 - 1e-6


@pytest.mark.parametrize("rate", [0, -1])
def test_a_rate_must_be_positive(rate: float) -> None:
    with pytest.raises(ValueError, match="rate"):
        LocalRateLimiter(rate)


def test_a_local_pacer_paces_every_write_through_its_limiter_threads_included() -> None:
    """What migrate_chunk's writing threads do: `before_write` before each write (retries included)."""
    clock = FakeClock()
    limiter = CountingLimiter(1000, clock)
    pacer: Pacer = LocalPacer(limiter)

    def worker() -> None:
        for _ in range(25):
            pacer.before_write()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert limiter.acquired == 200
    assert clock() - 1000.0 >= 199 / 1000 - 1e-6


def test_no_pacing_paces_nothing() -> None:
    pacer: Pacer = NoPacing()
    for _ in range(1000):
        pacer.before_write()  # returns at once: nothing to wait for
