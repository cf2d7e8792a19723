"""Who reports which storage version hash: ``status.currentStorageVersionHashes`` (seed 000, HA).

Design decision: seed 000's "Extended API proposal for HA cluster" keeps one
entry per reporter (one per API server) in the StorageState, each with its own
heartbeat, and decides from that list whether the API servers agree. This
module holds the bookkeeping of that list as pure functions, so the rules are
table- and property-tested apart from the detection plan that uses them
(:mod:`storage_migrator.detection.planner`).

Seed 000, "Extending the work flow of the triggering controller": every poll,
each reporter "updates (or creates) the element in status.storageVersionhashes
with the matching reporterID, recording the latest currentStorageVersionHash and
lastHeartbeatTime" and "removes storageVersionHashes whose lastHeartbeatTime are
more than 3 polling periods (30 mins) old". The leader starts a migration only
when "the lastHeartbeatTime in all items of the CurrentStorageVersionHashes are
no older than 1 polling period" and the hashes are identical:
:attr:`ReporterRound.agreed`.

Where reports come from is the caller's choice (the StorageVersion API's
``status.storageVersions[]`` by ``apiServerID``, one discovery poll per API
server, or a single discovery document). The single-server case is one
reporter, :data:`DISCOVERY_REPORTER`, through the same rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.kube.discovery import DiscoveredResource
from storage_migrator.models import StorageVersionHash, as_utc, storage_state_name

__all__ = [
    "DISCOVERY_REPORTER",
    "GC_PERIODS",
    "ReporterHash",
    "ReporterRound",
    "record_reports",
    "reporters_from_discoveries",
]

#: The reporter ID of the single discovery document (the non-HA, one-reporter case).
DISCOVERY_REPORTER: Final = "discovery"
#: Seed 000: entries "more than 3 polling periods (30 mins) old" are removed.
GC_PERIODS: Final = 3


class ReporterHash(BaseModel):
    """The storage version hash one reporter (one API server) shows for one resource, in this poll."""

    model_config = ConfigDict(frozen=True)

    reporter_id: str = Field(
        min_length=1,
        description=(
            "Who reports: the API server's ID (StorageVersion apiServerID, or the "
            "reporting controller's lease identity, seed 000)."
        ),
    )
    group: str = Field(description="API group of the resource; empty for core.")
    resource: str = Field(description="Plural resource name.")
    hash: str = Field(min_length=1, description="The storageVersionHash this reporter shows for the resource.")

    @property
    def group_resource(self) -> str:
        """``<resource>.<group>`` or ``<resource>`` for core (the StorageState name)."""
        return storage_state_name(self.group, self.resource)


class ReporterRound(BaseModel):
    """The reporter list after one poll, and what it says."""

    model_config = ConfigDict(frozen=True)

    entries: list[StorageVersionHash] = Field(
        description="The new status.currentStorageVersionHashes: merged, garbage collected, in a stable order."
    )
    seen: list[str] = Field(description="The distinct hashes reported in this poll, in report order.")
    agreed: str | None = Field(
        description=(
            "The common hash when every entry was heard within one poll period and all "
            "hashes are identical; None otherwise (no agreement)."
        )
    )
    collected: list[str] = Field(description="Reporter IDs removed: silent for more than 3 poll periods.")
    late: list[str] = Field(description="Reporter IDs kept but not heard within one poll period.")

    @property
    def disagree(self) -> bool:
        """Whether the entries show more than one hash (seed 000: they "stop being identical")."""
        return len(self.hashes) > 1

    @property
    def hashes(self) -> list[str]:
        """The distinct hashes of all entries, in entry order."""
        return list(dict.fromkeys(e.current_storage_version_hash for e in self.entries))


def record_reports(
    previous: Sequence[StorageVersionHash],
    reports: Sequence[tuple[str, str]],
    *,
    now: datetime,
    poll_seconds: float,
) -> ReporterRound:
    """Merge this poll's ``(reporter_id, hash)`` reports into ``previous``; collect and judge.

    The entry of a reporter that reports is updated in place (hash, heartbeat
    ``now``); a new reporter is appended; an entry older than
    :data:`GC_PERIODS` periods is dropped. A reporter that reports twice keeps
    its first report. ``previous`` is not mutated.
    """
    now = as_utc(now)
    reported: dict[str, str] = {}
    for reporter_id, hash_ in reports:
        reported.setdefault(reporter_id, hash_)
    fresh = {
        reporter_id: StorageVersionHash(
            reporterID=reporter_id, current_storage_version_hash=hash_, last_heartbeat_time=now
        )
        for reporter_id, hash_ in reported.items()
    }
    # Updated entries stay where they were; new reporters go at the end, in report order.
    # A reporter listed twice in a (hand-edited) status keeps its latest heartbeat.
    known: dict[str, StorageVersionHash] = {}
    for entry in previous:
        kept = known.get(entry.reporter_id)
        if kept is None or _heard(entry) > _heard(kept):
            known[entry.reporter_id] = fresh.get(entry.reporter_id, entry)
    merged = [*known.values(), *(entry for reporter_id, entry in fresh.items() if reporter_id not in known)]
    entries, collected, late = _collect(merged, now=now, poll_seconds=poll_seconds)
    return ReporterRound(
        entries=entries,
        seen=list(dict.fromkeys(reported.values())),
        agreed=_agreed(entries, late),
        collected=collected,
        late=late,
    )


def _heard(entry: StorageVersionHash) -> datetime:
    return entry.last_heartbeat_time or datetime.min.replace(tzinfo=UTC)


def _age_seconds(entry: StorageVersionHash, now: datetime) -> float | None:
    if entry.last_heartbeat_time is None:
        return None
    return (now - entry.last_heartbeat_time).total_seconds()


def _collect(
    entries: list[StorageVersionHash], *, now: datetime, poll_seconds: float
) -> tuple[list[StorageVersionHash], list[str], list[str]]:
    """Drop entries silent for more than GC_PERIODS periods; name those not heard within one."""
    gc_after = GC_PERIODS * poll_seconds
    kept: list[StorageVersionHash] = []
    collected: list[str] = []
    late: list[str] = []
    for entry in entries:
        age = _age_seconds(entry, now)
        # An entry without a heartbeat cannot be dated: it is collected (a reporter
        # that is alive reports again and is re-added with a heartbeat).
        if age is None or age > gc_after:
            collected.append(entry.reporter_id)
            continue
        kept.append(entry)
        if age > poll_seconds:
            late.append(entry.reporter_id)
    return kept, collected, late


def _agreed(entries: list[StorageVersionHash], late: list[str]) -> str | None:
    """Seed 000: all heard within one period AND all hashes identical; None otherwise."""
    hashes = {e.current_storage_version_hash for e in entries}
    if late or len(hashes) != 1:
        return None
    (agreed,) = hashes
    return agreed


def reporters_from_discoveries(per_server: Mapping[str, Sequence[DiscoveredResource]]) -> list[ReporterHash]:
    """One reporter per API server (its URL) and persisted resource: DESIGN 4.4's second source.

    Each server's own discovery document says what that server encodes in; a
    server in the middle of a rolling upgrade shows another hash than the rest.
    """
    out: list[ReporterHash] = []
    for server, found in sorted(per_server.items()):
        for entry in found:
            if entry.storage_version_hash and "/" not in entry.resource:
                reporter = ReporterHash(
                    reporter_id=server, group=entry.group, resource=entry.resource, hash=entry.storage_version_hash
                )
                out.append(reporter)
    return out
