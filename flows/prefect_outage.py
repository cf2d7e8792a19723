"""What a migration does while the Prefect server is down (issue 31; the rules in
`storage_migrator.migration.outage`, the operator's view in docs/operator-guide.md).
"""

from __future__ import annotations

from prefect import get_run_logger

from flows.best_effort import best_effort
from storage_migrator.migration.chunk_terms import BudgetUnreachable
from storage_migrator.migration.outage import (
    HOLD_SECONDS,
    PREFECT_UNREACHABLE,
    WAITING_FOR_PREFECT,
    MigrationSuspended,
    decide_outage,
    gave_up_message,
    waiting_message,
)
from storage_migrator.settings import Settings
from tasks.migrating import MigrationHandle, hold_migration
from tasks.write_budget import SILENCE_SHARE_OF_LEASE, RateLimitInfo, wait_for_budget
from tasks.writers_count import heal_writers_count


def heal_budget(settings: Settings, *, joining: str | None = None) -> None:
    """Issue 31: the writers' slots a restarted Prefect server lost the leases of, released
    before this run takes its share (`joining`: its request) and by each dispatcher: best effort."""
    if settings.shared_write_budget:
        with best_effort("the writers' count of the write budget"):
            heal_writers_count(settings, joining=joining)


def wait_for_prefect(settings: Settings, handle: MigrationHandle, budget: RateLimitInfo,
                      cause: BudgetUnreachable) -> None:  # fmt: skip
    """Issue 31: the budget's server is down. Nothing is written; the request keeps its checkpoint
    and its lease (refreshed every HOLD_SECONDS) until the server answers, or the run gives up
    (`MigrationSuspended`) after settings.prefect_outage_seconds."""
    logger = get_run_logger()
    logger.warning("%s: %s", handle.name, cause.message)
    limit = settings.prefect_outage_seconds
    silent = wait_for_budget(budget, 0)
    while (action := decide_outage(silent, give_up_after=limit)) == "wait":
        hold_migration(settings, handle, reason=WAITING_FOR_PREFECT, message=waiting_message(silent, limit))
        hold = min(HOLD_SECONDS, settings.lease_seconds * SILENCE_SHARE_OF_LEASE)  # well inside the lease
        silent = wait_for_budget(budget, min(hold, max(0.0, limit - silent)))
    if action == "give_up":
        raise MigrationSuspended(PREFECT_UNREACHABLE, gave_up_message(silent))
    logger.warning("%s: the Prefect server answers again; the migration goes on from its checkpoint", handle.name)
