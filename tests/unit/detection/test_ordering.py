"""Which migration came after a storage switch, by resourceVersion (issue 36, item 5), and which
in-tree migrations are news for the ledger (item 4)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from storage_migrator.detection.in_tree import news
from storage_migrator.detection.ordering import Coverage, covers, revision
from storage_migrator.kube.in_tree import InTreeMigration


@pytest.mark.parametrize(
    ("migrated_from", "switch", "expected"),
    [
        ("41", "40", Coverage(after=True)),
        ("40", "40", Coverage(after=False)),  # one revision: which came first is not known
        ("39", "40", Coverage(after=False)),
        # Integers, not text (kubernetes/kubernetes#126521: compared as integers for this API's GA).
        ("100", "99", Coverage(after=True)),
        ("99", "100", Coverage(after=False)),
        (" 41 ", "40", Coverage(after=True)),
        (None, "40", Coverage(after=False, unknown="it recorded no list resourceVersion (it began before they "
                                                    "were recorded)")),
        ("", "40", Coverage(after=False, unknown="it recorded no list resourceVersion (it began before they "
                                                  "were recorded)")),
        ("4.1", "40", Coverage(after=False, unknown="its list resourceVersion '4.1' is not an integer")),
        ("-41", "40", Coverage(after=False, unknown="its list resourceVersion '-41' is not an integer")),
        ("41", None, Coverage(after=False, unknown="the state recorded no resourceVersion for its current hash")),
        ("41", "abc", Coverage(after=False, unknown="the state's resourceVersion 'abc' is not an integer")),
    ],
)  # fmt: skip
def test_covers(migrated_from: str | None, switch: str | None, expected: Coverage) -> None:
    assert covers(migrated_from, switch) == expected


def test_revision() -> None:
    assert [revision(v) for v in ("0", "18446744073709551615", "", None, "1e3", "0x10")] == [
        0, 18446744073709551615, None, None, None, None,
    ]  # fmt: skip


def seen(uid: str, phase: str) -> InTreeMigration:
    return InTreeMigration(api_version="storagemigration.k8s.io/v1", name=f"n-{uid}", uid=uid, group="",
                           resource="secrets", phase=phase, created_at=datetime(2026, 1, 1, tzinfo=UTC))  # fmt: skip


def test_news_are_the_objects_in_a_phase_the_ledger_has_not_recorded() -> None:
    """Issue 36: "a ledger row and an event each (once per object and outcome, not every poll)":
    the ledger knows (uid, phase)."""
    polled = [seen("a", "Running"), seen("b", "Succeeded"), seen("c", "Pending")]
    recorded = {("a", "Running"), ("b", "Running"), ("c", "Pending")}
    assert [(m.uid, m.phase) for m in news(polled, recorded)] == [("b", "Succeeded")]
    assert news(polled, set()) == polled
    assert news([], recorded) == []
