"""A writer's share of the write budget (storage_migrator.write_share), simulated.

Issue 13: "at 10, 50 and 200 writes/s, achieved rate / budget between 0.95 and
1.00 over the run and never above 1.0 in any 10 s window, with 1 and with 3
migrations sharing the budget". Seed 002: the migrator "should generate less
than 10 qps of single object operations". Here writers run on a simulated
clock: each one's view of the server is refreshed every second (as
tasks/write_budget.py does), writers join and leave, and every write time is
recorded; the promise is checked over every 10 s window exactly.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from storage_migrator.write_share import CATCH_UP_SECONDS, ShareView, WindowedLimiter, share_quota

WINDOW = 10.0
MAX_AGE = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def max_in_window(times: list[float], window: float = WINDOW) -> int:
    """The most writes in any half-open window [t, t + window)."""
    times = sorted(times)
    best = lo = 0
    for hi, t in enumerate(times):
        while times[lo] <= t - window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def simulate(
    rate: float,
    spans: list[tuple[float, float]],
    *,
    until: float,
    refresh: float = 1.0,
    paused: Callable[[int, float], bool] = lambda i, t: False,
    answer_delay: float = 0.0,
) -> list[float]:
    """Writers holding a lease over [join, leave), each writing as fast as its limiter lets it
    except while `paused(writer, now)` (a chunk's LIST and checkpoint).

    A joiner reads the writers right after joining: alone, it starts at once;
    otherwise it waits MAX_AGE + CATCH_UP_SECONDS (tasks/write_budget.WriterLease.join).
    A read's answer arrives `answer_delay` seconds after it was sent (a slow server).
    """
    clock = Clock()
    limiters: dict[int, WindowedLimiter] = {}
    next_try: dict[int, float] = {}
    next_read: dict[int, float] = {}
    answers: list[tuple[float, int, ShareView]] = []
    writes: list[float] = []

    def holders(t: float) -> int:
        return sum(1 for join, leave in spans if join <= t < leave)

    step = 0.0005
    while clock.now < until:
        now = clock.now
        for i, (join, leave) in enumerate(spans):
            if now < join or now >= leave:
                limiters.pop(i, None)
                continue
            if i not in limiters:
                lim = WindowedLimiter(max_age=MAX_AGE, window=WINDOW, clock=clock, sleep=lambda s: None)
                lim.not_before = 0.0 if holders(now) == 1 else now + MAX_AGE + CATCH_UP_SECONDS
                limiters[i] = lim
                next_try[i] = now
                next_read[i] = now
            if now >= next_read[i]:
                answers.append((now + answer_delay, i, ShareView(rate=rate, writers=holders(now), sent_at=now)))
                next_read[i] = now + refresh
            for answer in [a for a in answers if a[1] == i and a[0] <= now]:
                answers.remove(answer)
                limiters[i].set_view(answer[2])
            if now >= next_try[i] and not paused(i, now):
                wait = limiters[i].wait_time()
                if wait == 0:
                    writes.append(now)
                next_try[i] = now + wait
        clock.now = round(now + step, 6)
    return writes


@pytest.mark.parametrize(("rate", "writers", "quota"), [(10, 1, 98), (10, 3, 32), (50, 3, 164), (200, 1, 1979)])
def test_quota_is_the_floor_share_less_one_and_the_jitter(rate: float, writers: int, quota: int) -> None:
    assert share_quota(rate, writers) == quota
    assert share_quota(rate, writers) * writers <= rate * WINDOW


@pytest.mark.parametrize("writers", [1, 3])
def test_writers_together_never_exceed_the_budget_in_any_10_s_window(writers: int) -> None:
    """Issue 13: "never above 1.0 in any 10 s window", and 0.95 of the budget over the run."""
    rate, seconds = 10.0, 60.0
    writes = simulate(rate, [(0.0, seconds)] * writers, until=seconds)
    assert max_in_window(writes) <= rate * WINDOW
    # over the run: from the first write (joiners who see others wait MAX_AGE first)
    assert len(writes) >= 0.95 * rate * (seconds - writes[0])


def test_a_joiner_and_a_leaver_keep_the_promise() -> None:
    """A writer joins while another writes at the full budget, a third comes and goes."""
    rate = 10.0
    spans = [(0.0, 60.0), (12.3, 60.0), (25.7, 41.1)]
    writes = simulate(rate, spans, until=60.0)
    assert max_in_window(writes) <= rate * WINDOW
    # what the promise costs: a joiner's MAX_AGE wait while the others already slowed down
    assert len(writes) >= 0.8 * rate * 60.0


def chunk_pauses(every: float, pause: float) -> Callable[[int, float], bool]:
    """Each writer stops for `pause` seconds after every `every` seconds (its chunk boundaries)."""
    return lambda i, t: (t + 0.37 * i) % (every + pause) >= every


@pytest.mark.parametrize("rate", [10.0, 50.0, 200.0])
def test_a_writer_alone_makes_up_its_pauses_between_chunks(rate: float) -> None:
    """Issue 13: "achieved rate / budget between 0.95 and 1.00 over the run". A run alone
    pauses at every chunk boundary (0.3 s every 2.5 s: 500 writes at 200/s); it catches up
    within its 10 s count, and no window goes above the budget."""
    seconds = 60.0
    writes = simulate(rate, [(0.0, seconds)], until=seconds, paused=chunk_pauses(2.5, 0.3))
    assert max_in_window(writes) <= rate * WINDOW
    assert len(writes) >= 0.95 * rate * seconds


def test_a_joiner_after_a_catch_up_keeps_the_promise() -> None:
    """The worst join: the writer alone has saved up a full second (a pause) and spends it
    just as another joins; then writers come and go while every run pauses at its chunks."""
    rate = 50.0
    # A read sent just before the join is answered at once, the next one as late as still
    # allowed: the incumbent learns of the joiner MAX_AGE after it joined.
    for join in (19.8, 20.0, 20.2, 20.4, 20.6):  # the joiner writes 9-10 s after the catch-up at 16 s
        spans = [(0.0, 60.0), (join, 60.0), (30.0, 41.0)]
        writes = simulate(rate, spans, until=45.0, refresh=0.5, answer_delay=MAX_AGE - 0.5,
                          paused=lambda i, t: i == 0 and 14.0 <= t < 16.0)  # fmt: skip
        assert max_in_window(writes) <= rate * WINDOW, join
    spans = [(0.0, 25.0), (5.0, 60.0)]  # a leaver: the one left alone catches up only a window later
    writes = simulate(rate, spans, until=60.0, refresh=0.5, paused=chunk_pauses(2.5, 0.3))
    assert max_in_window(writes) <= rate * WINDOW


def test_catching_up_needs_a_window_alone_without_gaps() -> None:
    """Views that say "one writer" with a gap longer than max_age may hide a writer that
    came and went: the streak starts again, and the bucket stays at BURST meanwhile."""
    clock = Clock()
    lim = WindowedLimiter(max_age=MAX_AGE, clock=clock, sleep=lambda s: None)
    for t in range(0, 30):
        clock.now = float(t)
        lim.set_view(ShareView(rate=100, writers=1, sent_at=clock.now))
    assert lim._capacity(clock.now, 10.0) == 10.0  # 1 s of writes at its pace
    clock.now = 40.0  # ten seconds without a read
    lim.set_view(ShareView(rate=100, writers=1, sent_at=clock.now))
    assert lim._capacity(clock.now, 10.0) == 2.0
    lim.set_view(ShareView(rate=100, writers=2, sent_at=41.0))
    clock.now = 60.0
    lim.set_view(ShareView(rate=100, writers=1, sent_at=60.0))
    assert lim._capacity(60.0 + WINDOW + MAX_AGE - 0.1, 10.0) == 2.0
    assert lim._capacity(60.0 + WINDOW + MAX_AGE, 10.0) == 10.0


def test_a_stale_view_pauses_writes() -> None:
    """A server that stops answering stops the writes after MAX_AGE, never speeds them up."""
    clock = Clock()
    lim = WindowedLimiter(max_age=MAX_AGE, clock=clock, sleep=lambda s: None)
    assert lim.wait_time() > 0  # no view yet: no write
    lim.set_view(ShareView(rate=10, writers=1, sent_at=0.0))
    assert lim.wait_time() == 0
    clock.now = MAX_AGE + 0.01
    assert lim.wait_time() > 0
    lim.set_view(ShareView(rate=10, writers=1, sent_at=clock.now))
    assert lim.wait_time() == 0


def test_an_older_view_never_replaces_a_newer_one() -> None:
    lim = WindowedLimiter(max_age=MAX_AGE, clock=Clock(), sleep=lambda s: None)
    lim.set_view(ShareView(rate=10, writers=3, sent_at=2.0))
    lim.set_view(ShareView(rate=10, writers=1, sent_at=1.0))  # a slow read that started earlier
    assert lim.quota == share_quota(10, 3)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="rate"):
        share_quota(0, 1)
    with pytest.raises(ValueError, match="max_age"):
        WindowedLimiter(max_age=0)
