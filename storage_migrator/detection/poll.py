"""Everything one detection poll decides, from what it observed: one function.

Design decision (DESIGN 4.3; issues 11 and 12): the poll's decisions are
``plan_detection`` (seed 000) over the tracked resources, plus the retention
deletions of ``plan_retention`` (issue 11) that detection did not already
plan. The detection flow (flows/polling.py) applies this plan and
``storage-migrator plan`` prints it: one function, so the preview cannot drift
from what the poll does. Pure.
"""

from __future__ import annotations

from datetime import datetime

from storage_migrator.detection.observation import Observations
from storage_migrator.detection.planner import DeleteMigration, DetectionPlan, DetectionSettings, plan_detection
from storage_migrator.detection.retention import plan_retention
from storage_migrator.detection.tracking import select_resources
from storage_migrator.settings import Settings

__all__ = ["detection_settings", "plan_poll"]


def detection_settings(settings: Settings) -> DetectionSettings:
    """The planner's settings, from the migrator's (DESIGN 5)."""
    return DetectionSettings(
        settle_seconds=settings.settle_seconds,
        stale_after_seconds=settings.stale_after,
        retry_base_seconds=settings.retry_base_seconds,
        retry_max_seconds=settings.retry_max_seconds,
        poll_seconds=settings.poll_seconds,
    )


def plan_poll(seen: Observations, settings: Settings, *, now: datetime) -> DetectionPlan:
    """Seed 000's decisions for the tracked resources (include/exclude settings), then the
    finished requests older than ``request_retention_seconds`` (a Failed one only once a
    person annotates it ``migration.k8s.io/acknowledged: "true"``)."""
    discovered = select_resources(seen.discovered, include=settings.include_resources,
                                  exclude=settings.exclude_resources)  # fmt: skip
    plan = plan_detection(
        discovered=discovered, states=seen.states, migrations=seen.migrations, crds=seen.crds,
        reporters=seen.reporters, in_tree=seen.in_tree, now=now, settings=detection_settings(settings),
    )  # fmt: skip
    # Issue 11: finished requests past their retention go with the poll's other deletions.
    planned = {a.name for a in plan.of_kind(DeleteMigration)}
    expired = [a for a in plan_retention(seen.migrations, now=now, retention_seconds=settings.request_retention_seconds)
               if a.name not in planned]  # fmt: skip
    return plan.model_copy(update={"actions": [*plan.actions, *expired]})
