"""The vocabulary of detection's decisions: its labels and annotations, its knobs, its clock.

Shared by the planner (:mod:`storage_migrator.detection.planner`) and the status
draft (:mod:`storage_migrator.detection.status_draft`): which migrations are
detection's own, which attempts count, and the back-off after failed ones
(10 min, 20, 40 ... capped at a day; a hash change resets it).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.agreement.reporters import ReporterRound
from storage_migrator.conditions import is_condition_true
from storage_migrator.detection.actions import PLANNER_REQUESTERS
from storage_migrator.migration.dispatch import finished_at
from storage_migrator.models import CONDITION_FAILED, StorageVersionMigration

#: Label on the migrations detection creates; its value is :data:`DETECTION_LABEL_VALUE`.
DETECTION_LABEL: Final = "migration.k8s.io/requested-by"
DETECTION_LABEL_VALUE: Final = "detection"
#: StorageState annotation: when status.currentStorageVersionHash was set (RFC 3339).
SINCE_ANNOTATION: Final = "migration.k8s.io/current-hash-since"
#: StorageState annotation: no migration is requested before this time (RFC 3339), after a change.
SETTLE_ANNOTATION: Final = "migration.k8s.io/settle-until"


def parse_time(text: str | None) -> datetime | None:
    """An aware UTC datetime from RFC 3339 text; None when absent or unreadable."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


class DetectionSettings(BaseModel):
    """The knobs of one detection poll (from :class:`storage_migrator.settings.Settings`)."""

    model_config = ConfigDict(frozen=True)

    settle_seconds: float = Field(
        ge=0,
        description=(
            "Seconds after a hash change before a migration is requested (seed 004's "
            "loose guarantee, about a minute); 0 requests it in the same poll."
        ),
    )
    stale_after_seconds: float = Field(
        gt=0,
        description="A heartbeat older than this (seconds) makes a StorageState stale: two poll periods (DESIGN 4.3).",
    )
    poll_seconds: float = Field(
        default=600,
        gt=0,
        description=(
            "Period of the detection poll in seconds. Default 600 (seed 000: every 10 "
            "minutes). A reporter not heard within one period blocks new migrations; one "
            "silent for more than three periods is removed (seed 000, HA)."
        ),
    )
    retry_base_seconds: float = Field(
        default=600,
        gt=0,
        description="Wait after the first failed migration before the next request, in seconds. Default 600.",
    )
    retry_max_seconds: float = Field(
        default=86400,
        gt=0,
        description="Upper bound of the wait between requests after failures, in seconds. Default a day.",
    )


def retry_delay_seconds(failures: int, *, base: float, maximum: float) -> float:
    """Wait after the ``failures``-th failed attempt: base, 2 base, 4 base ... capped at ``maximum``."""
    if failures <= 0:
        return 0.0
    # Cap the exponent: 2**60 base already exceeds any sane maximum.
    return float(min(base * 2 ** min(failures - 1, 60), maximum))


def is_detection_migration(migration: StorageVersionMigration) -> bool:
    return (migration.metadata.labels or {}).get(DETECTION_LABEL) in PLANNER_REQUESTERS


def attempted_since(migration: StorageVersionMigration, *, current: str, since: datetime | None) -> bool:
    """Whether this migration was an attempt at ``current`` that started since ``since`` (by the clock).

    Only the back-off after failed attempts counts by time: a second's doubt there
    moves a retry by a second. What proves a hash is ordered by resourceVersion
    (:mod:`storage_migrator.detection.ordering`, issue 36)."""
    started = migration.status.started_at
    return (
        since is not None
        and started is not None
        and started >= since
        and migration.status.target_storage_version_hash == current
    )


def retry_allowed_at(
    migrations: Sequence[StorageVersionMigration],
    *,
    current: str,
    since: datetime | None,
    settings: DetectionSettings,
) -> tuple[datetime | None, int]:
    """When detection may request again after its failed attempts at ``current`` since ``since``."""
    failed = [
        m
        for m in migrations
        if is_detection_migration(m)
        and is_condition_true(m.status.conditions, CONDITION_FAILED)
        and attempted_since(m, current=current, since=since)
    ]
    if not failed:
        return None, 0
    ends = [t for t in (finished_at(m) or m.status.started_at for m in failed) if t is not None]
    if not ends:
        return None, len(failed)
    delay = retry_delay_seconds(len(failed), base=settings.retry_base_seconds, maximum=settings.retry_max_seconds)
    return max(ends) + timedelta(seconds=delay), len(failed)


def describe(reporters: ReporterRound) -> str:
    """``api-1=hashA, api-2=hashB (late: api-3)`` for a reason text."""
    text = ", ".join(f"{e.reporter_id}={e.current_storage_version_hash}" for e in reporters.entries)
    return text + (f" (late: {', '.join(reporters.late)})" if reporters.late else "")
