"""How long a transient failure waits (storage_migrator.migration.backoff.retry_delay).

STYLE "Do this" 3: "Server hints win: `Retry-After` header first,
`details.retryAfterSeconds` second, our backoff last." DESIGN 4.5: transient
answers are "retried with exponential backoff and jitter, honouring
Retry-After, up to a bounded number of attempts".
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage_migrator.kube.errors import KubeError, ServerError, TooManyRequests, TransportError
from storage_migrator.migration.backoff import MAX_SERVER_HINT_SECONDS, retry_delay


def throttled(retry_after: float | None) -> TooManyRequests:
    return TooManyRequests(code=429, reason="TooManyRequests", message="slow down", what="PATCH secrets ns/a",
                           retry_after=retry_after)  # fmt: skip


def unavailable() -> ServerError:
    return ServerError(code=503, reason="ServiceUnavailable", message="try later", what="LIST secrets")


attempts = st.integers(min_value=0, max_value=10_000)
bases = st.floats(min_value=0.001, max_value=10.0)
caps = st.floats(min_value=0.001, max_value=600.0)


@given(hint=st.floats(min_value=0, max_value=MAX_SERVER_HINT_SECONDS), attempt=attempts, base=bases, cap=caps)
def test_a_server_hint_is_obeyed_as_is(hint: float, attempt: int, base: float, cap: float) -> None:
    """The server's Retry-After wins over our backoff, whatever the attempt and our cap."""
    assert retry_delay(throttled(hint), attempt=attempt, base=base, cap=cap) == hint


@pytest.mark.parametrize("code", [429, 500, 503, 504])
def test_a_hint_on_any_transient_answer_is_obeyed(code: int) -> None:
    error = KubeError(code=code, reason="x", message="y", what="PATCH secrets ns/a", retry_after=7)
    assert retry_delay(error, attempt=0, base=0.5, cap=1.0) == 7.0


@given(hint=st.floats(min_value=MAX_SERVER_HINT_SECONDS, max_value=1e9))
def test_a_huge_hint_is_capped(hint: float) -> None:
    """A run must not stall for hours on one answer."""
    assert retry_delay(throttled(hint), attempt=0, base=0.5, cap=30) == MAX_SERVER_HINT_SECONDS


def test_a_zero_hint_means_now() -> None:
    assert retry_delay(throttled(0), attempt=5, base=0.5, cap=30) == 0.0


@given(attempt=attempts, base=bases, cap=caps, seed=st.integers())
def test_without_a_hint_the_wait_is_jittered_within_half_and_all_of_the_ceiling(
    attempt: int, base: float, cap: float, seed: int
) -> None:
    """Exponential (base * 2**attempt) up to the cap, jittered within [ceiling/2, ceiling]."""
    ceiling = min(cap, base * 2.0 ** min(attempt, 1000))
    for error in (unavailable(), throttled(None), TransportError(code=0, reason="Reset", message="x", what="y")):
        delay = retry_delay(error, attempt=attempt, base=base, cap=cap, rng=random.Random(seed))
        assert ceiling / 2 <= delay <= ceiling


def test_a_negative_hint_is_ignored() -> None:
    delay = retry_delay(throttled(-1), attempt=0, base=0.5, cap=30, rng=random.Random(1))
    assert 0.25 <= delay <= 0.5


def test_the_ceiling_doubles_per_attempt_until_the_cap() -> None:
    rng = random.Random(42)
    for attempt, ceiling in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (6, 30.0), (20, 30.0)]:
        delays = [retry_delay(unavailable(), attempt=attempt, base=0.5, cap=30.0, rng=rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.9  # the whole range is used: real jitter
        assert min(delays) < ceiling * 0.6


def test_the_same_seed_gives_the_same_waits_and_workers_do_not_come_back_in_step() -> None:
    def waits(seed: int) -> list[float]:
        rng = random.Random(seed)
        return [retry_delay(unavailable(), attempt=a, base=0.5, cap=30, rng=rng) for a in range(6)]

    assert waits(7) == waits(7)
    assert waits(7) != waits(8)


def test_an_error_that_is_no_kube_error_gets_our_backoff() -> None:
    delay = retry_delay(OSError("reset"), attempt=2, base=1.0, cap=30, rng=random.Random(0))
    assert 2.0 <= delay <= 4.0
