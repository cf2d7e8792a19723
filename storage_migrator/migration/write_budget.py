"""The write budget's rule, in one place: who writes, at what share, and who holds a request.

Design decision (issue 37; DESIGN 4.5; seed 002 "less than 10 qps"): the budget is the
cluster's, so the cluster counts its writers. Every run that takes a request holds one
`coordination.k8s.io/v1` Lease in the install's namespace, named for the request
(`writer_leases.py` reads and writes them). The Lease is two things:

- **the request's lock** (one writer per request): a run takes a request only when its
  Lease is absent, or expired (`decide_claim`); otherwise it names the holder and until
  when, and ends without writing. A take-over is an update of the expired Lease with the
  resourceVersion read, so two runs can never both win;
- **a writer of the budget**, while it carries the annotation of its rate (the run is
  writing; a run that holds its request but does not write, waiting at a gate or wrapping
  up, counts for nothing).

The share: every writer paces at `min(rates of the live writers) / live writers`
(`count_writers`), through `write_share.WindowedLimiter` (the pace, the join wait, the
holds and the window count, unchanged). The smallest rate wins so that no writer's
promise is broken by another's higher setting. An expired Lease counts for nothing and
whoever sees it deletes it (conditionally, on its resourceVersion).

Liveness is the holder's `renewTime + leaseDurationSeconds` against the reader's clock. A
live holder renews every RENEW_SECONDS, so its Lease is never more than that (and a LIST)
old: clocks may be up to LEASE_SECONDS - RENEW_SECONDS - REFRESH_SECONDS (12.75 s) apart
before a live holder is taken for dead. Only dead Leases' expiry moves with the skew.
A holder writes only while its own last renewal is younger than OWN_LEASE_SAFE_SECONDS
(`own_lease_fresh`): past that, another run may soon take the request.

The overshoot bound while writers join and leave (docs/migrations.md): a joiner waits
`write_share.join_wait(MAX_VIEW_AGE_SECONDS)` (3.5 s) after its Lease says it writes;
every other writer's view is then either read after that (it counts the joiner) or older
than MAX_VIEW_AGE_SECONDS (its pace is 0). A leaver stops writing before its Lease stops
saying so. What is left is write_share's: each writer's window holds at most its pace
over the window plus one write, and JITTER_SECONDS of every window is kept back.

Pure: observations in, decisions out (tests/unit/migration/test_write_budget_rule.py, a table).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.migration.write_share import share_pace

__all__ = [
    "LEASE_SECONDS",
    "MAX_VIEW_AGE_SECONDS",
    "OWN_LEASE_SAFE_SECONDS",
    "REFRESH_SECONDS",
    "RENEW_SECONDS",
    "Claim",
    "WriterLease",
    "WritersView",
    "count_writers",
    "decide_claim",
    "expires_at",
    "holder_run",
    "holders",
    "is_live",
    "own_lease_fresh",
    "writer_pace",
]

#: leaseDurationSeconds of every writer Lease (issue 37: "a killed writer's share is back to the
#: others within one lease duration"); kube-controller-manager's leader election uses 15 s too.
LEASE_SECONDS = 15
#: A holder renews its Lease this often (leader election's retry period: 2 s).
RENEW_SECONDS = 2.0
#: A writer LISTs the writers' Leases this often (one LIST of a few small objects). What a join or a
#: leave costs the others is about half of it, of the joiner's or leaver's share (the others learn of
#: them at their next LIST): 0.25 s used 0.7% more of the budget than 0.5 s with a writer joining and
#: one leaving every 6.5 s (tests/unit/migration/test_write_share.py's simulator), for twice the LISTs.
REFRESH_SECONDS = 0.25
#: A view of the writers older than this (from its LIST's sending) pauses writes (write_share).
MAX_VIEW_AGE_SECONDS = 2.5
#: A holder writes only while its last renewal was sent less than this long ago: a third of the
#: Lease is kept for clocks apart and for writes already on their way when it stops.
OWN_LEASE_SAFE_SECONDS = LEASE_SECONDS * 2 / 3


class WriterLease(BaseModel):
    """One writer Lease as read from the cluster (`writer_leases.parse_lease`)."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="metadata.name of the Lease.")
    resource_version: str = Field(default="", description="What a take-over or a delete is conditional on.")
    request: str = Field(description="The StorageVersionMigration the Lease locks.")
    holder: str | None = Field(default=None, description="spec.holderIdentity: the holding run's flow run id.")
    renewed: datetime | None = Field(default=None, description="spec.renewTime (the holder's clock).")
    duration_seconds: float | None = Field(default=None, description="spec.leaseDurationSeconds.")
    writes_per_second: float | None = Field(
        default=None, description="The holder's rate while it writes; None: it holds the request without writing."
    )
    transitions: int = Field(default=0, description="spec.leaseTransitions: how often the request changed hands.")


def _utc(now: datetime) -> datetime:
    return now if now.tzinfo is not None else now.replace(tzinfo=UTC)


def expires_at(lease: WriterLease) -> datetime | None:
    """renewTime + leaseDurationSeconds; None: a Lease without them (never live)."""
    if lease.renewed is None or not lease.duration_seconds:
        return None
    return _utc(lease.renewed) + timedelta(seconds=lease.duration_seconds)


def is_live(lease: WriterLease, *, now: datetime) -> bool:
    """Held until renewTime + leaseDurationSeconds, exclusive (client-go: valid while that is after now)."""
    end = expires_at(lease)
    return end is not None and _utc(now) < end


class WritersView(BaseModel):
    """What one LIST of the writer Leases means for the writer `own` (the thread's view)."""

    model_config = ConfigDict(frozen=True)

    writers: int = Field(description="Live Leases that say they write (the own one included, if it writes).")
    members: frozenset[str] = Field(default=frozenset(), description="Those Leases, as `<name>/<holder>`.")
    rate: float | None = Field(description="The smallest rate among them; None: nobody writes.")
    expired: tuple[WriterLease, ...] = Field(default=(), description="Expired Leases to delete (never the own one).")
    lost: bool = Field(default=False, description="The own Lease is gone or another run holds it: stop writing.")

    def pace(self, own_rate: float) -> float:
        """Writes per second the own writer may make (`writer_pace`)."""
        return writer_pace(self.rate if self.rate is not None else own_rate, max(1, self.writers))


def count_writers(leases: Iterable[WriterLease], *, now: datetime, own: str, holder: str) -> WritersView:
    """The writers as `holder`, holding Lease `own`, counts them: live Leases that carry a rate."""
    live, expired, lost = [], [], True
    for lease in leases:
        if lease.name == own:
            lost = lease.holder != holder
            if not lost and lease.writes_per_second:
                live.append(lease)  # its own: counted whatever its clock says (it renews it)
            continue
        if not is_live(lease, now=now):
            expired.append(lease)
        elif lease.writes_per_second:
            live.append(lease)
    rate = min((lease.writes_per_second or 0.0 for lease in live), default=None)
    members = frozenset(f"{lease.name}/{lease.holder}" for lease in live)
    return WritersView(writers=len(live), members=members, rate=rate, expired=tuple(expired), lost=lost)


def writer_pace(rate: float, writers: int) -> float:
    """One of `writers` writers' writes per second at a budget of `rate` (write_share.share_pace)."""
    return share_pace(rate, writers)


class Claim(BaseModel):
    """What a run that wants a request does with its Lease."""

    model_config = ConfigDict(frozen=True)

    action: Literal["create", "take_over", "refuse"]
    holder: str | None = Field(default=None, description="The holder refused for, or taken over from.")
    until: datetime | None = Field(default=None, description="When the holder's Lease expires (refuse).")
    message: str = ""


def decide_claim(current: WriterLease | None, *, now: datetime) -> Claim:
    """Issue 37: "A run takes over a request only when its holder is gone: that holder's Lease has
    expired. Otherwise the new run says who holds the request, and until when, and ends without
    writing." A live Lease refuses whoever asks, its own holder's id included (a second process of
    one flow run is not the process that renews it)."""
    if current is None:
        return Claim(action="create")
    end = expires_at(current)
    if is_live(current, now=now):
        return Claim(action="refuse", holder=current.holder, until=end,
                     message=f"{current.request} is held by flow run {holder_run(current.holder)} (holder "
                             f"{current.holder or '(unknown)'}), whose Lease "
                             f"{current.name} was renewed at {_stamp(current.renewed)} and holds it until "
                             f"{_stamp(end)}: this run writes nothing (a run takes a request over only once its "
                             "holder's Lease has expired)")  # fmt: skip
    ran_out = f"expired at {_stamp(end)}" if end is not None else "has no renewTime or duration"
    return Claim(action="take_over", holder=current.holder,
                 message=f"{current.request}: the Lease of flow run {holder_run(current.holder)} {ran_out}: "
                         "taken over")  # fmt: skip


def holder_run(holder: str | None) -> str:
    """The flow run of a holder identity `<flow run id>/<process>` (request_lease.py makes them so
    that two processes of one flow run never pass for one holder)."""
    return (holder or "(unknown)").split("/", 1)[0]


def _stamp(moment: datetime | None) -> str:
    return "(never)" if moment is None else _utc(moment).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def own_lease_fresh(since_renewal_sent: float | None) -> bool:
    """Whether a holder may write: its last successful renewal was sent less than
    OWN_LEASE_SAFE_SECONDS ago (seconds of its monotonic clock; None: never renewed)."""
    return since_renewal_sent is not None and 0 <= since_renewal_sent < OWN_LEASE_SAFE_SECONDS


def holders(leases: Sequence[WriterLease], *, now: datetime) -> dict[str, str]:
    """Request name -> the holder of its live Lease: the requests a dispatcher leaves alone."""
    return {lease.request: lease.holder or "(unknown)" for lease in leases if is_live(lease, now=now)}
