"""The conditions of a StorageVersionMigration: reading them, setting one, the phase they make.

Seed 002: a migration's progress is its conditions (Running, Succeeded, Failed),
which other components read (seed 003); the display phase is derived from them.
"""

from __future__ import annotations

from datetime import datetime

from storage_migrator.models import (
    CONDITION_FAILED,
    CONDITION_RUNNING,
    CONDITION_SUCCEEDED,
    ConditionStatus,
    MigrationCondition,
    MigrationPhase,
)

__all__ = ["get_condition", "is_condition_true", "phase_from_conditions", "set_condition"]


def get_condition(conditions: list[MigrationCondition], condition_type: str) -> MigrationCondition | None:
    """The condition of that type, if present."""
    for condition in conditions:
        if condition.type == condition_type:
            return condition
    return None


def is_condition_true(conditions: list[MigrationCondition], condition_type: str) -> bool:
    """Whether the condition of that type is present with status True."""
    condition = get_condition(conditions, condition_type)
    return condition is not None and condition.status == "True"


def set_condition(
    conditions: list[MigrationCondition],
    *,
    condition_type: str,
    status: ConditionStatus,
    now: datetime,
    reason: str | None = None,
    message: str | None = None,
) -> list[MigrationCondition]:
    """A new list with the condition of that type replaced (or appended), order kept."""
    updated = MigrationCondition(
        type=condition_type,
        status=status,
        last_update_time=now,
        reason=reason,
        message=message,
    )
    result: list[MigrationCondition] = []
    replaced = False
    for condition in conditions:
        if condition.type == condition_type:
            result.append(updated)
            replaced = True
        else:
            result.append(condition)
    if not replaced:
        result.append(updated)
    return result


def phase_from_conditions(conditions: list[MigrationCondition]) -> MigrationPhase:
    """The display phase: a terminal condition wins, then Running, else Pending."""
    if is_condition_true(conditions, CONDITION_SUCCEEDED):
        return "Succeeded"
    if is_condition_true(conditions, CONDITION_FAILED):
        return "Failed"
    if is_condition_true(conditions, CONDITION_RUNNING):
        return "Running"
    return "Pending"
