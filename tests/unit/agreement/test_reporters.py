"""The reporter list, status.currentStorageVersionHashes (seed 000, "Extending the work flow of the triggering controller").

Table tests quote the seed's rules; hypothesis checks the merge, the garbage
collection and the agreement verdict over random lists and reports.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage_migrator.agreement.reporters import GC_PERIODS, ReporterHash, ReporterRound, record_reports
from storage_migrator.models import StorageVersionHash

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)
PERIOD = 600.0


def entry(reporter: str, hash_: str, heard: datetime | None) -> StorageVersionHash:
    return StorageVersionHash(reporterID=reporter, current_storage_version_hash=hash_, last_heartbeat_time=heard)


def view(r: ReporterRound) -> dict[str, tuple[str, datetime | None]]:
    return {e.reporter_id: (e.current_storage_version_hash, e.last_heartbeat_time) for e in r.entries}


def record(previous: list[StorageVersionHash], reports: list[tuple[str, str]], now: datetime) -> ReporterRound:
    return record_reports(previous, reports, now=now, poll_seconds=PERIOD)


def test_updates_the_entry_with_the_matching_reporter_id() -> None:
    # Seed 000: "updates (or creates) the element in status.storageVersionhashes with
    # the matching reporterID, recording the latest currentStorageVersionHash and
    # lastHeartbeatTime."
    now = T0 + 10 * MIN
    previous = [entry("api-1", "v1", T0), entry("api-2", "v1", T0)]
    r = record(previous, [("api-2", "v2"), ("api-3", "v2")], now)
    assert [e.reporter_id for e in r.entries] == ["api-1", "api-2", "api-3"], "updated in place, new at the end"
    assert view(r) == {"api-1": ("v1", T0), "api-2": ("v2", now), "api-3": ("v2", now)}
    assert r.seen == ["v2"]
    assert r.agreed is None
    assert r.disagree
    assert previous == [entry("api-1", "v1", T0), entry("api-2", "v1", T0)], "not mutated"


@pytest.mark.parametrize(
    ("silent_for", "kept", "late"),
    [
        (10 * MIN, True, False),
        # Seed 000: the leader needs every "lastHeartbeatTime ... no older than 1
        # polling period (10 mins)".
        (10 * MIN + timedelta(seconds=1), True, True),
        (30 * MIN, True, True),
        # Seed 000: "removes storageVersionHashes whose lastHeartbeatTime are more than
        # 3 polling periods (30 mins) old."
        (30 * MIN + timedelta(seconds=1), False, False),
        (24 * 60 * MIN, False, False),
    ],
)
def test_garbage_collection_after_three_periods(silent_for: timedelta, kept: bool, late: bool) -> None:
    now = T0 + 60 * MIN
    r = record([entry("gone", "v1", now - silent_for), entry("api-1", "v1", now - MIN)], [("api-1", "v1")], now)
    assert ("gone" in view(r)) == kept
    assert r.collected == ([] if kept else ["gone"])
    assert r.late == (["gone"] if late else [])
    # Same hash everywhere: agreement only when everyone was heard within one period.
    assert r.agreed == (None if late else "v1")
    assert not r.disagree


def test_entry_without_heartbeat_is_collected() -> None:
    r = record([entry("undated", "v1", None)], [("api-1", "v1")], T0)
    assert r.collected == ["undated"]
    assert r.agreed == "v1"


@pytest.mark.parametrize(
    ("reports", "agreed"),
    [
        ([("a", "v1"), ("b", "v1"), ("c", "v1")], "v1"),
        ([("a", "v2"), ("b", "v1"), ("c", "v1")], None),
        ([("a", "v2")], "v2"),
        # A reporter that reports twice keeps its first report.
        ([("a", "v2"), ("a", "v1")], "v2"),
    ],
)
def test_agreement(reports: list[tuple[str, str]], agreed: str | None) -> None:
    r = record([], reports, T0)
    assert r.agreed == agreed
    assert r.disagree == (agreed is None)


def test_reporter_hash_names_the_storage_state() -> None:
    assert ReporterHash(reporter_id="api-1", group="batch", resource="cronjobs", hash="h").group_resource == (
        "cronjobs.batch"
    )
    assert ReporterHash(reporter_id="api-1", group="", resource="pods", hash="h").group_resource == "pods"


# --- properties ------------------------------------------------------------------------

IDS = ["api-1", "api-2", "api-3", "api-4"]
HASHES = ["v1", "v2", "v3"]
previous_lists = st.lists(
    st.builds(
        entry,
        st.sampled_from(IDS),
        st.sampled_from(HASHES),
        st.one_of(st.none(), st.integers(0, 50).map(lambda m: T0 - m * MIN)),
    ),
    max_size=5,
)
report_lists = st.lists(st.tuples(st.sampled_from(IDS), st.sampled_from(HASHES)), max_size=5)


@settings(max_examples=300, deadline=None)
@given(previous=previous_lists, reports=report_lists)
def test_record_reports_properties(previous: list[StorageVersionHash], reports: list[tuple[str, str]]) -> None:
    r = record(previous, reports, T0)
    ids = [e.reporter_id for e in r.entries]
    assert len(ids) == len(set(ids)), "one entry per reporter"
    first = dict(reversed(reports))  # the first report of each reporter
    for reporter, hash_ in first.items():
        assert view(r)[reporter] == (hash_, T0), "a reporter's latest report, heard now"
    assert set(r.seen) == set(first.values())
    for e in r.entries:
        assert e.last_heartbeat_time is not None
        age = (T0 - e.last_heartbeat_time).total_seconds()
        assert age <= GC_PERIODS * PERIOD, "nothing silent for more than 3 periods survives"
        assert (e.reporter_id in r.late) == (age > PERIOD)
    # Entries of the previous list that are young enough are never lost.
    for e in previous:
        if e.last_heartbeat_time is not None and T0 - e.last_heartbeat_time <= timedelta(seconds=GC_PERIODS * PERIOD):
            assert e.reporter_id in ids
    hashes = {e.current_storage_version_hash for e in r.entries}
    assert r.agreed == (next(iter(hashes)) if len(hashes) == 1 and not r.late else None)
    assert r.disagree == (len(hashes) > 1)
    # Recording the same reports again at the same time changes nothing.
    assert record(r.entries, reports, T0).entries == r.entries
