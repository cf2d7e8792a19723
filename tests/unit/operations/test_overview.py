"""What `storage-migrator status` shows per resource (issue 12 item 2; DESIGN 4.10), as a table.

Issue 12: "`status`: one row per resource — current hash, persisted hashes, the
last migration's phase, progress, rate and ETA — like `kubectl get`".
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from storage_migrator.cli.status import duration
from storage_migrator.conditions import set_condition
from storage_migrator.models import (
    MigrationProgress,
    StorageState,
    StorageVersionMigration,
    new_storage_state,
    new_storage_version_migration,
)
from storage_migrator.operations.overview import overview

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


def state(resource: str = "secrets", group: str = "", *, current: str = "h2", persisted: tuple[str, ...] = ("h1", "h2")
          ) -> StorageState:  # fmt: skip
    s = new_storage_state(group=group, resource=resource)
    s.status.current_storage_version_hash = current
    s.status.persisted_storage_version_hashes = list(persisted)
    return s


def svm(name: str, resource: str = "secrets", group: str = "", *, phase: str = "Running", created_ago: float = 600,
        started_ago: float | None = 100, finished_ago: float | None = None, listed: int | None = 300,
        remaining: int | None = 700) -> StorageVersionMigration:  # fmt: skip
    m = new_storage_version_migration(group=group, version="v1", resource=resource, name=name)
    m.metadata.creation_timestamp = NOW - timedelta(seconds=created_ago)
    c = m.status.conditions
    if phase != "Pending":
        c = set_condition(c, condition_type="Running", status=str(phase == "Running"), now=NOW)  # type: ignore[arg-type]
    if phase in ("Succeeded", "Failed"):
        c = set_condition(c, condition_type=phase, status="True", now=NOW)
    m.status.conditions = c
    m.status.phase = None if phase == "Pending" else phase  # type: ignore[assignment]
    m.status.target_storage_version_hash = "h2"
    m.status.started_at = NOW - timedelta(seconds=started_ago) if started_ago is not None else None
    m.status.finished_at = NOW - timedelta(seconds=finished_ago) if finished_ago is not None else None
    if listed is not None:
        m.status.progress = MigrationProgress(listed=listed, remaining_item_count=remaining)
    return m


def test_running_migration_rate_and_eta() -> None:
    """300 objects in 100 s: 3 objects/s; 700 left: 234 s (rounded up)."""
    (row,) = overview([state()], [svm("secrets-a")], now=NOW)
    assert row.model_dump(mode="json") == {
        "resource": "secrets", "group": "", "current_hash": "h2", "persisted_hashes": ["h1", "h2"],
        "migration": "secrets-a", "phase": "Running", "target_hash": "h2", "listed": 300, "remaining": 700,
        "started_at": "2026-11-22T11:58:20Z", "finished_at": None, "rate": 3.0, "eta_seconds": 234,
        "engine": "client",
    }  # fmt: skip


def test_the_engine_is_what_the_request_says_ran_it() -> None:
    """Issue 36: status shows the engine; a request started before there were engines ran on the client one."""
    in_tree = svm("secrets-a")
    in_tree.metadata.annotations = {"migration.k8s.io/engine": "in-tree"}
    assert overview([state()], [in_tree], now=NOW)[0].engine == "in-tree"
    assert overview([state()], [svm("secrets-a", phase="Pending", started_ago=None)], now=NOW)[0].engine is None
    assert overview([state()], [], now=NOW)[0].engine is None


CASES = [
    # (rule, states, migrations, expected (migration, phase, rate, eta_seconds) of the one row)
    ("the newest migration by creationTimestamp is the last one",
     [state()], [svm("old", created_ago=900, phase="Succeeded", finished_ago=500), svm("new", created_ago=60)],
     ("new", "Running", 3.0, 234)),
    ("finished: the rate runs until finishedAt, no ETA",
     [state()], [svm("done", phase="Succeeded", started_ago=100, finished_ago=50, listed=1000, remaining=None)],
     ("done", "Succeeded", 20.0, None)),
    ("failed: a rate, no ETA", [state()], [svm("f", phase="Failed", finished_ago=0, remaining=5)], ("f", "Failed", 3.0, None)),
    ("pending (no status yet): no rate, no ETA",
     [state()], [svm("p", phase="Pending", started_ago=None, listed=None)], ("p", "Pending", None, None)),
    ("running, remainingItemCount unknown (last chunk): no ETA, never 0",
     [state()], [svm("r", remaining=None)], ("r", "Running", 3.0, None)),
    ("running, nothing listed yet: rate 0, no ETA", [state()], [svm("r", listed=0)], ("r", "Running", 0.0, None)),
    ("no migration: the state alone", [state()], [], (None, None, None, None)),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "states", "migrations", "expected"), CASES, ids=[c[0] for c in CASES])
def test_rules(
    rule: str, states: list[StorageState], migrations: list[StorageVersionMigration], expected: tuple[object, ...]
) -> None:
    (row,) = overview(states, migrations, now=NOW)
    assert (row.migration, row.phase, row.rate, row.eta_seconds) == expected, rule


def test_one_row_per_resource_sorted_by_group_then_resource() -> None:
    """A request made by hand for a resource detection has not seen yet still shows."""
    rows = overview(
        [state("widgets", "example.com"), state("secrets"), state("configmaps")],
        [svm("secrets-a"), svm("secrets-b", created_ago=5), svm("jobs-a", "jobs", "batch")],
        now=NOW,
    )
    assert [(r.group, r.resource, r.migration) for r in rows] == [
        ("", "configmaps", None),
        ("", "secrets", "secrets-b"),
        ("batch", "jobs", "jobs-a"),
        ("example.com", "widgets", None),
    ]
    jobs = rows[2]
    assert (jobs.current_hash, jobs.persisted_hashes) == (None, [])


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (59, "59s"), (60, "1m"), (200, "3m20s"), (3600, "1h"), (7500, "2h5m")]
)
def test_eta_is_written_like_a_kubectl_age(seconds: int, text: str) -> None:
    assert duration(seconds) == text
