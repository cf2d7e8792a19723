"""A Prefect outage as a run sees it (issue 31): "How long it waits before it gives up is a
setting, 30 minutes by default. When it gives up, it ends with a state that the dispatcher
resumes at once, not after a lease." """

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta

import pytest

from storage_migrator.migration.chunk_terms import BudgetUnreachable
from storage_migrator.migration.dispatch import RUNNING_ELSEWHERE, plan_dispatch
from storage_migrator.migration.outage import PREFECT_UNREACHABLE, MigrationSuspended, decide_outage
from storage_migrator.migration.write_share import ShareView, WindowedLimiter
from storage_migrator.models import MigrationCondition, StorageVersionMigration
from storage_migrator.settings import Settings

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def test_the_default_wait_is_thirty_minutes() -> None:
    assert Settings().prefect_outage_seconds == 1800


@pytest.mark.parametrize(
    ("silent", "action"), [(0.0, "go"), (0.5, "wait"), (1799.0, "wait"), (1800.0, "give_up"), (4000.0, "give_up")]
)
def test_a_run_waits_until_the_setting_then_gives_up(silent: float, action: str) -> None:
    assert decide_outage(silent, give_up_after=1800) == action


def request(running: str, reason: str, updated: datetime) -> StorageVersionMigration:
    return StorageVersionMigration.model_validate({
        "metadata": {"name": "secrets-abc", "uid": "u1"},
        "spec": {"resource": {"group": "", "version": "v1", "resource": "secrets"}, "continueToken": "tok"},
        "status": {"conditions": [MigrationCondition(type="Running", status=running, reason=reason,  # type: ignore[arg-type]
                                                     last_update_time=updated).model_dump(by_alias=True, mode="json")]},
    })  # fmt: skip


def test_a_request_left_by_a_run_that_gave_up_is_resumed_at_once() -> None:
    gave_up = request("False", PREFECT_UNREACHABLE, NOW - timedelta(seconds=5))
    assert plan_dispatch([gave_up], now=NOW, max_parallel=2, lease_seconds=600).start == ["secrets-abc"]


def test_a_request_held_while_its_run_waits_is_left_alone() -> None:
    held = request("True", "WaitingForPrefect", NOW - timedelta(seconds=20))
    plan = plan_dispatch([held], now=NOW, max_parallel=2, lease_seconds=600)
    assert plan.start == [] and [w.reason for w in plan.waiting] == [RUNNING_ELSEWHERE]


def test_the_outage_exceptions_cross_a_process_boundary() -> None:
    """Task states carry exceptions pickled (Prefect's result serializer)."""
    assert pickle.loads(pickle.dumps(BudgetUnreachable("m"))).message == "m"
    again = pickle.loads(pickle.dumps(MigrationSuspended(PREFECT_UNREACHABLE, "m")))
    assert (again.reason, again.message) == (PREFECT_UNREACHABLE, "m")


def test_a_write_waiting_on_a_silent_budget_raises_what_give_up_returns() -> None:
    """write_share: a stale view's pace is 0; `give_up` ends the wait (the budget's server is down)."""
    clock = [0.0]
    limiter = WindowedLimiter(max_age=2.5, clock=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    limiter.set_view(ShareView(rate=10.0, writers=1, sent_at=0.0))
    limiter.acquire(give_up=lambda: None)  # a fresh view: the write goes
    clock[0] = 10.0  # the view is stale now
    error = BudgetUnreachable("silent")
    with pytest.raises(BudgetUnreachable):
        limiter.acquire(give_up=lambda: error if clock[0] >= 20.0 else None)
    assert clock[0] >= 20.0, "it waited while give_up returned nothing"
