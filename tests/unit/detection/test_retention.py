"""Which finished requests the detection poll deletes (issue 11 item 1; seed 003), as a table.

Issue 11: "Finished requests older than a retention period (a setting, default
7 days) are deleted by the detection poll; running, failed-and-unacknowledged
and the newest finished request per resource are never deleted."
Seed 003: "Do The StorageVersionMigration resources get cleaned up after a
while? After a new write key has been activated, the corresponding
StorageVersionMigration resources for that key can be cleaned up."
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from storage_migrator.conditions import set_condition
from storage_migrator.detection.actions import DeleteMigration
from storage_migrator.detection.retention import ACKNOWLEDGED_ANNOTATION, plan_retention
from storage_migrator.models import StorageVersionMigration, new_storage_version_migration
from storage_migrator.settings import Settings

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
WEEK = 7 * 86400.0


def svm(name: str, resource: str = "secrets", *, state: str = "succeeded", days: float = 10,
        acknowledged: str | None = None, finished_at: bool = True) -> StorageVersionMigration:  # fmt: skip
    """A request that reached `state` `days` days before NOW (finishedAt, or only the condition's time)."""
    m = new_storage_version_migration(group="", version="v1", resource=resource, name=name)
    m.metadata.uid = f"uid-{name}"
    when = NOW - timedelta(days=days)
    m.metadata.creation_timestamp = when - timedelta(hours=1)
    if acknowledged is not None:
        m.metadata.annotations = {ACKNOWLEDGED_ANNOTATION: acknowledged}
    c = m.status.conditions
    if state == "running":
        c = set_condition(c, condition_type="Running", status="True", now=when)
    elif state in ("succeeded", "failed"):
        c = set_condition(c, condition_type="Running", status="False", now=when)
        c = set_condition(c, condition_type=state.capitalize(), status="True", now=when)
        if finished_at:
            m.status.finished_at = when
    m.status.conditions = c
    return m


NEWER = svm("secrets-newer", days=1)  # the newest finished request of secrets: the record

CASES = [
    # (rule of the sentence, requests, deleted)
    ("finished (Succeeded) and older than the period: deleted", [svm("old"), NEWER], ["old"]),
    ("finished within the period: kept", [svm("recent", days=6), NEWER], []),
    ("the period is by finish time, not creation: finished 6.9 days ago is kept", [svm("edge", days=6.9), NEWER], []),
    ("no finishedAt: the finishing condition's time counts", [svm("cond", finished_at=False), NEWER], ["cond"]),
    ("running: never deleted", [svm("run", state="running", days=30), NEWER], []),
    ("pending (no status): never deleted", [svm("pending", state="new", days=30), NEWER], []),
    ("failed and not acknowledged: kept", [svm("failed", state="failed"), NEWER], []),
    ("failed, annotation not 'true': kept", [svm("failed", state="failed", acknowledged="no"), NEWER], []),
    ("failed and acknowledged: deleted", [svm("failed", state="failed", acknowledged="true"), NEWER], ["failed"]),
    ("the newest finished per resource: kept however old", [svm("only", days=400)], []),
    (
        "newest per resource, not overall: each resource keeps its own",
        [svm("s-old", days=30), svm("s-new", days=20), svm("c-only", "configmaps", days=30)],
        ["s-old"],
    ),
    (
        "the newest finished is kept even when Failed and acknowledged",
        [svm("s-old", days=30), svm("s-failed", state="failed", days=20, acknowledged="true")],
        ["s-old"],
    ),
    ("several old ones: oldest first", [svm("b", days=20), svm("a", days=30), NEWER], ["a", "b"]),
]


@pytest.mark.parametrize(("rule", "requests", "deleted"), CASES, ids=[c[0] for c in CASES])
def test_retention(rule: str, requests: list[StorageVersionMigration], deleted: list[str]) -> None:
    actions = plan_retention(requests, now=NOW, retention_seconds=WEEK)
    assert [a.name for a in actions] == deleted, rule
    for action in actions:
        assert isinstance(action, DeleteMigration)
        assert action.uid == f"uid-{action.name}"  # precondition: a same-named successor survives
        assert "retention" in action.reason


def test_the_default_period_is_seven_days() -> None:
    """Issue 11: "a retention period (a setting, default 7 days)"."""
    assert Settings().request_retention_seconds == 604800
    assert Settings.model_fields["request_retention_seconds"].description
    assert ACKNOWLEDGED_ANNOTATION in (Settings.model_fields["request_retention_seconds"].description or "")


def test_a_period_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="retention_seconds"):
        plan_retention([], now=NOW, retention_seconds=0)
