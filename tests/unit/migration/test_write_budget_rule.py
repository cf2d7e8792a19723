"""The write budget's rule (storage_migrator.migration.write_budget), as tables.

Issue 37: "Each writing run holds a `coordination.k8s.io/v1` Lease in the install's
namespace ... Its share is the budget divided by the live Leases. An expired Lease counts
for nothing, and whoever sees it deletes it"; "A run takes over a request only when its
holder is gone: that holder's Lease has expired ... Otherwise the new run says who holds
the request, and until when, and ends without writing." Seed 002: "less than 10 qps".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from storage_migrator.migration.write_budget import (
    LEASE_SECONDS,
    OWN_LEASE_SAFE_SECONDS,
    REFRESH_SECONDS,
    RENEW_SECONDS,
    WriterLease,
    count_writers,
    decide_claim,
    holder_run,
    holders,
    is_live,
    own_lease_fresh,
    writer_pace,
)
from storage_migrator.migration.write_share import WINDOW_SECONDS

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
OWN = "storage-migrator-writer-mine"
ME = "run-me/aaaa0001"


def lease(request: str, *, age: float = 1.0, rate: float | None = 10.0, holder: str | None = None,
          duration: float | None = LEASE_SECONDS, name: str | None = None) -> WriterLease:  # fmt: skip
    """A writer Lease last renewed `age` seconds before NOW (None: never), saying `rate` (None: not writing)."""
    return WriterLease(name=name or f"storage-migrator-writer-{request}", resource_version="7", request=request,
                       holder=holder or f"run-{request}/0000beef", renewed=NOW - timedelta(seconds=age),
                       duration_seconds=duration, writes_per_second=rate)  # fmt: skip


def mine(*, rate: float | None = 10.0, holder: str = ME, age: float = 1.0) -> WriterLease:
    return lease("mine", rate=rate, holder=holder, age=age, name=OWN)


@dataclass(frozen=True)
class Row:
    rule: str
    leases: list[WriterLease]
    writers: int
    rate: float | None
    expired: tuple[str, ...] = ()
    lost: bool = False


ROWS = [
    Row("alone: one writer, its own rate", [mine()], writers=1, rate=10.0),
    Row("issue 37: the share is the budget divided by the live Leases", [mine(), lease("b"), lease("c")],
        writers=3, rate=10.0),
    Row("a Lease renewed just now and one renewed 14.9 s ago are both live", [mine(), lease("b", age=0.0),
                                                                             lease("c", age=14.9)],
        writers=3, rate=10.0),
    Row("issue 37: an expired Lease counts for nothing, and whoever sees it deletes it",
        [mine(), lease("b", age=LEASE_SECONDS + 0.1)], writers=1, rate=10.0, expired=("b",)),
    Row("expired at renewTime + leaseDurationSeconds exactly (client-go: valid while that is after now)",
        [mine(), lease("b", age=LEASE_SECONDS)], writers=1, rate=10.0, expired=("b",)),
    Row("each Lease's own duration counts: one of 60 s renewed 30 s ago is live",
        [mine(), lease("b", age=30, duration=60)], writers=2, rate=10.0),
    Row("a Lease without renewTime or duration is never live", [mine(), lease("b", duration=None)],
        writers=1, rate=10.0, expired=("b",)),
    Row("an expired Lease that did not write is deleted too", [mine(), lease("b", age=99, rate=None)],
        writers=1, rate=10.0, expired=("b",)),
    Row("a live Lease that holds its request without writing (a gate, a verdict) is no writer",
        [mine(), lease("b", rate=None)], writers=1, rate=10.0),
    Row("the smallest rate of the live writers: nobody's promise is broken by another's higher setting",
        [mine(rate=50.0), lease("b", rate=10.0), lease("c", rate=200.0)], writers=3, rate=10.0),
    Row("an expired writer's smaller rate no longer counts", [mine(rate=50.0), lease("b", rate=5.0, age=20)],
        writers=1, rate=50.0, expired=("b",)),
    Row("not writing itself: the others' count and rate (a run between two passes)",
        [mine(rate=None), lease("b", rate=20.0)], writers=1, rate=20.0),
    Row("its own Lease counts by its holder, whatever its age by this clock (it renews it)",
        [mine(age=LEASE_SECONDS + 5), lease("b")], writers=2, rate=10.0),
    Row("its own Lease held by another run: taken over, stop writing", [mine(holder="run-other/1"), lease("b")],
        writers=1, rate=10.0, lost=True),
    Row("its own Lease held by another process of the same flow run: taken over too",
        [mine(holder="run-me/aaaa0002")], writers=0, rate=None, lost=True),
    Row("its own Lease gone (deleted as expired by another): stop writing", [lease("b")], writers=1, rate=10.0,
        lost=True),
    Row("nobody writes", [mine(rate=None)], writers=0, rate=None),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[r.rule for r in ROWS])
def test_who_writes_and_at_what_rate(row: Row) -> None:
    view = count_writers(row.leases, now=NOW, own=OWN, holder=ME)
    assert (view.writers, view.rate, view.lost) == (row.writers, row.rate, row.lost), row.rule
    assert tuple(e.request for e in view.expired) == row.expired, row.rule


# Seed 002's budget over 1, 2, 4 and 8 writers: each writer's writes per second, and the most the
# writers together may make in any 10 s window (each writer's window holds its pace plus one write).
PACE_ROWS = [(10.0, 1, 9.8), (10.0, 2, 4.85), (10.0, 4, 2.375), (10.0, 8, 1.1375), (50.0, 1, 49.4),
             (50.0, 8, 6.0875), (200.0, 3, 65.9)]  # fmt: skip


@pytest.mark.parametrize(("rate", "writers", "pace"), PACE_ROWS)
def test_each_writer_paces_at_its_share_and_the_window_holds_the_budget(rate: float, writers: int,
                                                                        pace: float) -> None:  # fmt: skip
    assert writer_pace(rate, writers) == pytest.approx(pace)
    assert writers * (writer_pace(rate, writers) * WINDOW_SECONDS + 1) <= rate * WINDOW_SECONDS


def test_a_view_paces_at_the_smallest_rate_over_the_writers() -> None:
    view = count_writers([mine(rate=50.0), lease("b", rate=10.0)], now=NOW, own=OWN, holder=ME)
    assert view.pace(own_rate=50.0) == pytest.approx(writer_pace(10.0, 2))
    alone = count_writers([mine(rate=None)], now=NOW, own=OWN, holder=ME)
    assert alone.pace(own_rate=20.0) == pytest.approx(writer_pace(20.0, 1))


CLAIM_ROWS = [
    ("no Lease: create it", None, "create"),
    ("issue 37: a live holder refuses whoever asks", lease("req"), "refuse"),
    ("renewed 14.9 s ago: still live, refused", lease("req", age=14.9), "refuse"),
    ("expired: taken over (an update with the resourceVersion read)", lease("req", age=LEASE_SECONDS), "take_over"),
    ("long expired, its holder never came back", lease("req", age=3600), "take_over"),
    ("a Lease with no renewTime or duration holds nothing", lease("req", duration=None), "take_over"),
    ("a live Lease that holds without writing holds the request all the same", lease("req", rate=None), "refuse"),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "current", "action"), CLAIM_ROWS, ids=[r[0] for r in CLAIM_ROWS])
def test_who_may_take_a_request(rule: str, current: WriterLease | None, action: str) -> None:
    claim = decide_claim(current, now=NOW)
    assert claim.action == action, rule


def test_a_refusal_names_the_holder_and_until_when() -> None:
    """Issue 37: "the new run says who holds the request, and until when"."""
    claim = decide_claim(lease("secrets-abc", age=5, holder="0b1c2d3e-flow-run/1a2b3c4d"), now=NOW)
    assert claim.holder == "0b1c2d3e-flow-run/1a2b3c4d"
    assert claim.until == NOW + timedelta(seconds=LEASE_SECONDS - 5)
    assert "flow run 0b1c2d3e-flow-run" in claim.message and "2026-11-29T12:00:10.000000Z" in claim.message
    assert "writes nothing" in claim.message


def test_the_dispatcher_sees_the_holders_of_live_leases_only() -> None:
    leases = [lease("a"), lease("b", age=99), lease("c", rate=None)]
    assert holders(leases, now=NOW) == {"a": "run-a/0000beef", "c": "run-c/0000beef"}
    assert holder_run("0b1c/1a2b") == "0b1c" and holder_run(None) == "(unknown)"


@pytest.mark.parametrize(("since", "fresh"), [(None, False), (0.0, True), (RENEW_SECONDS, True),
                                              (OWN_LEASE_SAFE_SECONDS - 0.01, True), (OWN_LEASE_SAFE_SECONDS, False),
                                              (-1.0, False)])  # fmt: skip
def test_a_holder_writes_only_while_nobody_may_take_its_lease_yet(since: float | None, fresh: bool) -> None:
    assert own_lease_fresh(since) is fresh


def test_the_numbers_leave_room_for_a_live_holder() -> None:
    """A live holder renews every RENEW_SECONDS and is seen within a LIST: never taken for dead
    unless clocks are more than the rest of the Lease apart; it stops writing well before."""
    assert LEASE_SECONDS - RENEW_SECONDS - REFRESH_SECONDS >= 10
    assert RENEW_SECONDS < OWN_LEASE_SAFE_SECONDS < LEASE_SECONDS
    assert is_live(lease("x", age=RENEW_SECONDS + REFRESH_SECONDS), now=NOW)
