"""The dispatch order of pending migrations (DESIGN 4.6; seeds 002 and 003), as a table."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage_migrator.conditions import get_condition, set_condition
from storage_migrator.migration.dispatch import (
    OVER_PARALLEL_LIMIT,
    PRESUMED_DEAD,
    RUNNING_ELSEWHERE,
    DispatchPlan,
    Waiting,
    is_finished,
    migration_resource,
    plan_dispatch,
    presumed_dead,
    queued_reason,
    was_presumed_dead,
)
from storage_migrator.models import (
    StorageVersionMigration,
    StorageVersionMigrationStatus,
    new_storage_version_migration,
)

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
LEASE = 300.0
FRESH = NOW - timedelta(seconds=60)  # Running, refreshed within the lease: a live run
STALE = NOW - timedelta(seconds=3600)  # Running, not refreshed for an hour: its run died


def svm(
    name: str | None,
    resource: str,
    *,
    group: str = "",
    version: str = "v1",
    age: int | None = 0,
    state: str = "new",
    updated: datetime = STALE,
) -> StorageVersionMigration:
    """A migration created `age` minutes before NOW (None: no timestamp yet) in a state.

    state: new (no conditions), running, stopped (Running False only), succeeded, failed.
    """
    migration = new_storage_version_migration(group=group, version=version, resource=resource, name=name)
    migration.metadata.generate_name = None
    migration.metadata.creation_timestamp = None if age is None else NOW - timedelta(minutes=age)
    conditions = migration.status.conditions
    if state == "running":
        conditions = set_condition(conditions, condition_type="Running", status="True", now=updated)
    elif state in ("succeeded", "failed"):
        conditions = set_condition(conditions, condition_type="Running", status="False", now=updated)
        kind = "Succeeded" if state == "succeeded" else "Failed"
        conditions = set_condition(conditions, condition_type=kind, status="True", now=updated)
    elif state == "stopped":
        conditions = set_condition(conditions, condition_type="Running", status="False", now=updated)
    migration.status = StorageVersionMigrationStatus(conditions=conditions)
    return migration


@dataclass(frozen=True)
class Row:
    rule: str
    migrations: list[StorageVersionMigration]
    start: list[str]
    waiting: dict[str, str]
    max_parallel: int = 10
    active: tuple[str, ...] = ()
    #: Issue 37: the requests whose writer Lease is live (None: the Leases were not read).
    held: tuple[str, ...] | None = None


ROWS = [
    Row(
        'seed 002: "if migration.status is nil ... it creates a migration worker"',
        [svm("a", "secrets")],
        start=["a"],
        waiting={},
    ),
    Row(
        'seed 002: "or migration.status.conditions shows Running": a Running one whose run died is resumed',
        [svm("a", "secrets", state="running", updated=STALE)],
        start=["a"],
        waiting={},
    ),
    Row(
        "a Running condition set to False without Succeeded/Failed is still pending (not finished)",
        [svm("a", "secrets", state="stopped")],
        start=["a"],
        waiting={},
    ),
    Row(
        "finished (Succeeded or Failed True) is a record: never started, not listed",
        [svm("ok", "secrets", state="succeeded"), svm("ko", "configmaps", state="failed")],
        start=[],
        waiting={},
    ),
    Row(
        "a finished migration does not hold its resource",
        [svm("old", "secrets", age=90, state="succeeded"), svm("new", "secrets", age=1)],
        start=["new"],
        waiting={},
    ),
    Row(
        "seed 003: requests for the same resource are executed serially: the oldest first, the next queued",
        [svm("b", "secrets", age=5), svm("a", "secrets", age=10)],
        start=["a"],
        waiting={"b": "queued behind a"},
    ),
    Row(
        "same creationTimestamp: the name breaks the tie",
        [svm("y", "secrets", age=5), svm("x", "secrets", age=5)],
        start=["x"],
        waiting={"y": "queued behind x"},
    ),
    Row(
        "one resource whatever the version: deployments.apps v1 and v1beta1 run one after the other",
        [
            svm("d1", "deployments", group="apps", version="v1", age=10),
            svm("d2", "deployments", group="apps", version="v1beta1", age=5),
        ],
        start=["d1"],
        waiting={"d2": "queued behind d1"},
    ),
    Row(
        "same plural in another group is another resource: both start",
        [svm("e1", "events", age=10), svm("e2", "events", group="events.k8s.io", age=5)],
        start=["e1", "e2"],
        waiting={},
    ),
    Row(
        "per resource, Running ones first (resume) even when a newer request is older in the queue",
        [svm("new", "secrets", age=60), svm("run", "secrets", age=1, state="running", updated=STALE)],
        start=["run"],
        waiting={"new": "queued behind run"},
    ),
    Row(
        "several dead Running ones of a resource: the oldest is resumed",
        [
            svm("r2", "secrets", age=5, state="running", updated=STALE),
            svm("r1", "secrets", age=9, state="running", updated=STALE),
        ],
        start=["r1"],
        waiting={"r2": "queued behind r1"},
    ),
    Row(
        "a live lease owns its resource: not started again, nothing else of that resource starts",
        [svm("live", "secrets", age=9, state="running", updated=FRESH), svm("next", "secrets", age=1)],
        start=[],
        waiting={"live": RUNNING_ELSEWHERE, "next": "resource busy with live"},
    ),
    Row(
        "a lease exactly lease_seconds old is still live (within)",
        [svm("edge", "secrets", state="running", updated=NOW - timedelta(seconds=LEASE))],
        start=[],
        waiting={"edge": RUNNING_ELSEWHERE},
    ),
    Row(
        "a lease one second past lease_seconds has expired: resumed",
        [svm("edge", "secrets", state="running", updated=NOW - timedelta(seconds=LEASE + 1))],
        start=["edge"],
        waiting={},
    ),
    Row(
        "`active` group-resources are busy too (a flow run in progress)",
        [svm("s", "secrets"), svm("d", "deployments", group="apps")],
        active=("deployments.apps",),
        start=["s"],
        waiting={"d": "resource busy with another flow run"},
    ),
    Row(
        "DESIGN 4.6: Running ones first (resume) across resources, then oldest first",
        [
            svm("old", "configmaps", age=100),
            svm("young", "secrets", age=1),
            svm("resume", "pods", age=2, state="running", updated=STALE),
        ],
        start=["resume", "old", "young"],
        waiting={},
    ),
    Row(
        "at most max_parallel: picks beyond it wait, the queue behind them too",
        [
            svm("c1", "configmaps", age=30),
            svm("s1", "secrets", age=20),
            svm("s2", "secrets", age=10),
            svm("p1", "pods", age=5),
        ],
        max_parallel=1,
        start=["c1"],
        waiting={"s1": OVER_PARALLEL_LIMIT, "s2": "queued behind s1", "p1": OVER_PARALLEL_LIMIT},
    ),
    Row(
        "busy resources use up parallel slots: max_parallel - busy",
        [
            svm("live", "secrets", state="running", updated=FRESH),
            svm("c", "configmaps", age=9),
            svm("p", "pods", age=1),
        ],
        max_parallel=2,
        active=("nodes",),
        start=[],
        waiting={"live": RUNNING_ELSEWHERE, "c": OVER_PARALLEL_LIMIT, "p": OVER_PARALLEL_LIMIT},
    ),
    Row(
        "one live lease and one active run: 3 - 2 = 1 slot",
        [
            svm("live", "secrets", state="running", updated=FRESH),
            svm("c", "configmaps", age=9),
            svm("p", "pods", age=1),
        ],
        max_parallel=3,
        active=("nodes",),
        start=["c"],
        waiting={"live": RUNNING_ELSEWHERE, "p": OVER_PARALLEL_LIMIT},
    ),
    Row(
        "more busy than max_parallel: nothing starts (never a negative slot count)",
        [svm("c", "configmaps")],
        max_parallel=1,
        active=("nodes", "pods"),
        start=[],
        waiting={"c": OVER_PARALLEL_LIMIT},
    ),
    Row(
        "max_parallel 0 starts nothing",
        [svm("c", "configmaps")],
        max_parallel=0,
        start=[],
        waiting={"c": OVER_PARALLEL_LIMIT},
    ),
    Row(
        "migrations without a name are ignored (cannot be started by name)",
        [svm(None, "secrets", age=99), svm("named", "secrets", age=1)],
        start=["named"],
        waiting={},
    ),
    Row(
        "no creationTimestamp (not created yet) sorts after every created one",
        [svm("created", "secrets", age=1), svm("draft", "secrets", age=None)],
        start=["created"],
        waiting={"draft": "queued behind created"},
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[row.rule for row in ROWS])
def test_dispatch_rules(row: Row) -> None:
    plan = plan_dispatch(row.migrations, now=NOW, max_parallel=row.max_parallel, lease_seconds=LEASE, active=row.active)
    assert plan.start == row.start
    assert {w.name: w.reason for w in plan.waiting} == row.waiting
    assert len(plan.waiting) == len(row.waiting)


def test_nil_status_from_the_wire_is_pending() -> None:
    """Seed 002: "if migration.status is nil" — an object applied with kubectl has no status at all."""
    obj = StorageVersionMigration.model_validate(
        {
            "apiVersion": "migration.k8s.io/v1alpha1",
            "kind": "StorageVersionMigration",
            "metadata": {"name": "secrets.v1-key.1", "creationTimestamp": "2026-11-22T11:00:00Z"},
            "spec": {"resource": {"resource": "secrets", "version": "v1"}},
        }
    )
    assert not is_finished(obj)
    assert migration_resource(obj) == "secrets"
    assert plan_dispatch([obj], now=NOW, max_parallel=1, lease_seconds=LEASE).start == ["secrets.v1-key.1"]


def test_naive_now_is_utc() -> None:
    live = svm("live", "secrets", state="running", updated=FRESH)
    plan = plan_dispatch([live], now=NOW.replace(tzinfo=None), max_parallel=1, lease_seconds=LEASE)
    assert plan == DispatchPlan(start=[], waiting=[Waiting(name="live", reason=RUNNING_ELSEWHERE)])


@pytest.mark.parametrize(("max_parallel", "lease"), [(-1, LEASE), (1, -1.0)])
def test_negative_limits_are_rejected(max_parallel: int, lease: float) -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        plan_dispatch([svm("a", "secrets")], now=NOW, max_parallel=max_parallel, lease_seconds=lease)


# --- properties -----------------------------------------------------------------

RESOURCES = [("", "secrets"), ("", "configmaps"), ("apps", "deployments"), ("", "events"), ("events.k8s.io", "events")]
STATES = ["new", "running", "succeeded", "failed", "stopped"]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[StorageVersionMigration], int, list[str]]:
    count = draw(st.integers(min_value=0, max_value=12))
    migrations = []
    for index in range(count):
        group, resource = draw(st.sampled_from(RESOURCES))
        migrations.append(
            svm(
                f"m{index}",
                resource,
                group=group,
                age=draw(st.integers(min_value=0, max_value=5)),
                state=draw(st.sampled_from(STATES)),
                updated=NOW - timedelta(seconds=draw(st.integers(min_value=0, max_value=900))),
            )
        )
    max_parallel = draw(st.integers(min_value=0, max_value=6))
    active = draw(st.lists(st.sampled_from(["secrets", "deployments.apps", "nodes", "pods"]), unique=True))
    return migrations, max_parallel, active


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_dispatch_invariants(scenario: tuple[list[StorageVersionMigration], int, list[str]]) -> None:
    migrations, max_parallel, active = scenario
    plan = plan_dispatch(migrations, now=NOW, max_parallel=max_parallel, lease_seconds=LEASE, active=active)
    by_name = {m.metadata.name: m for m in migrations}
    running = {m.metadata.name: get_condition(m.status.conditions, "Running") for m in migrations}
    live = {
        name
        for name, cond in running.items()
        if cond is not None
        and cond.status == "True"
        and cond.last_update_time is not None
        and (NOW - cond.last_update_time).total_seconds() <= LEASE
        and not is_finished(by_name[name])
    }
    busy = {migration_resource(by_name[n]) for n in live} | set(active)
    started = [by_name[n] for n in plan.start]

    # Never two of one resource, and never one of a busy resource.
    started_resources = Counter(migration_resource(m) for m in started)
    assert all(count == 1 for count in started_resources.values())
    assert not set(started_resources) & busy
    # Never more than max_parallel busy + started (nothing starts when busy already exceeds it).
    assert len(started) <= max(0, max_parallel - len(busy))
    # Finished ones are never started nor listed; live leases are never started again.
    assert not any(is_finished(m) for m in started)
    assert not live & set(plan.start)
    # Every pending migration is either started or waiting, exactly once.
    pending = sorted(n for n, m in by_name.items() if n and not is_finished(m))
    listed = plan.start + [w.name for w in plan.waiting]
    assert sorted(listed) == pending
    # Work-conserving: while slots are left, every free resource with a pending migration starts one.
    if len(started) < max_parallel - len(busy):
        free = {migration_resource(by_name[n]) for n in pending} - busy
        assert set(started_resources) == free


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_dispatch_does_not_depend_on_input_order(
    scenario: tuple[list[StorageVersionMigration], int, list[str]],
) -> None:
    migrations, max_parallel, active = scenario
    forward = plan_dispatch(migrations, now=NOW, max_parallel=max_parallel, lease_seconds=LEASE, active=active)
    backward = plan_dispatch(
        list(reversed(migrations)), now=NOW, max_parallel=max_parallel, lease_seconds=LEASE, active=active
    )
    assert forward == backward


# Issue 14: a worker killed with its flow runs leaves them Running in Prefect for ever;
# the lease says when the dispatcher may mark one Crashed and resume its request.
LONG_AGO = NOW - timedelta(seconds=LEASE + 1)
DEAD_ROWS = [
    ("no checkpoint for a lease, run Running for longer: dead", svm("a", "secrets", state="running"), LONG_AGO, True),
    ("a checkpoint within the lease: alive", svm("a", "secrets", state="running", updated=FRESH), LONG_AGO, False),
    ("run taken within the lease (not yet marked Running): alive", svm("a", "secrets", state="running"),
     NOW - timedelta(seconds=10), False),
    ("run not taken by a worker (waits for one)", svm("a", "secrets", state="running"), None, False),
    ("never marked Running for a whole lease: dead", svm("a", "secrets"), LONG_AGO, True),
    ("request succeeded within the lease: the run is wrapping up",
     svm("a", "secrets", state="succeeded", updated=FRESH), LONG_AGO, False),
    ("request failed within the lease: the run is wrapping up",
     svm("a", "secrets", state="failed", updated=FRESH), LONG_AGO, False),
    ("request succeeded a lease ago, its run still shown: killed while wrapping up",
     svm("a", "secrets", state="succeeded"), LONG_AGO, True),
    ("request failed a lease ago, its run still shown: killed while wrapping up",
     svm("a", "secrets", state="failed"), LONG_AGO, True),
    ("request finished a lease ago, run taken within the lease (a late resume): alive",
     svm("a", "secrets", state="succeeded"), NOW - timedelta(seconds=10), False),
    ("request deleted: the run cancels itself", None, LONG_AGO, False),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "migration", "started", "dead"), DEAD_ROWS, ids=[r[0] for r in DEAD_ROWS])
def test_presumed_dead(rule: str, migration: StorageVersionMigration | None, started: datetime | None,
                       dead: bool) -> None:  # fmt: skip
    assert presumed_dead(migration, claimed_at=started, now=NOW, lease_seconds=LEASE) is dead, rule


@pytest.mark.parametrize(
    ("history", "dead"),
    [
        ([("SCHEDULED", ""), ("PENDING", ""), ("RUNNING", "")], False),
        ([("SCHEDULED", ""), ("CRASHED", "the worker's process exited")], False),
        ([("PENDING", ""), ("CRASHED", f"x had no checkpoint ...: {PRESUMED_DEAD} (...)"), ("RUNNING", "")], True),
        ([("RUNNING", f"quoted: {PRESUMED_DEAD}")], False),
        ([], False),
    ],
)
def test_a_run_the_dispatcher_presumed_dead_must_not_start_after_all(
    history: list[tuple[str, str | None]], dead: bool
) -> None:
    """Seed 003: migrations of one resource run one at a time. A run marked dead and resumed
    elsewhere that starts late (Prefect lets Crashed move to Running) would be the second."""
    assert was_presumed_dead(history) is dead


# Issue 37: where the writer Leases were read, they say which requests a live run holds: a run
# takes its request's Lease before it marks the request Running and holds it past its verdict.
LEASE_ROWS = [
    Row("a Running request whose writer Lease is live is held, whatever its condition's age",
        [svm("a", "secrets", state="running", updated=STALE), svm("b", "secrets", age=1)], held=("a",),
        start=[], waiting={"a": RUNNING_ELSEWHERE, "b": "resource busy with a"}),
    Row("a Running request without a live writer Lease has no writer: resumed at once, its condition fresh or not",
        [svm("a", "secrets", state="running", updated=FRESH)], held=(), start=["a"], waiting={}),
    Row("its resource is free for it, not for another request of the resource (seed 003: one at a time)",
        [svm("later", "secrets", age=-1), svm("a", "secrets", state="running", updated=FRESH)], held=(),
        start=["a"], waiting={"later": queued_reason("a")}),
    Row("a request not yet Running whose Lease is live (its run is starting) is held too",
        [svm("a", "secrets")], held=("a",), start=[], waiting={"a": RUNNING_ELSEWHERE}),
    Row("a held request uses up a parallel slot", [svm("a", "secrets"), svm("c", "configmaps")], max_parallel=1,
        held=("a",), start=[], waiting={"a": RUNNING_ELSEWHERE, "c": OVER_PARALLEL_LIMIT}),
]  # fmt: skip


@pytest.mark.parametrize("row", LEASE_ROWS, ids=[row.rule for row in LEASE_ROWS])
def test_the_writer_leases_say_which_requests_are_held(row: Row) -> None:
    held = {name: f"flow-run-{name}/0a1b2c3d" for name in row.held or ()}
    plan = plan_dispatch(row.migrations, now=NOW, max_parallel=row.max_parallel, lease_seconds=LEASE,
                         active=row.active, held=held)  # fmt: skip
    assert plan.start == row.start
    assert {w.name: w.reason for w in plan.waiting} == row.waiting


HELD_DEAD_ROWS = [
    ("taken a lease ago, its request's Lease not live: dead", svm("a", "secrets", state="running", updated=FRESH),
     False, True),
    ("taken a lease ago, its request's Lease live (the condition stale): alive", svm("a", "secrets",
                                                                                      state="running"), True, False),
    ("a finished request: judged by its verdict's time, not the Lease", svm("a", "secrets", state="succeeded",
                                                                              updated=FRESH), False, False),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "migration", "held", "dead"), HELD_DEAD_ROWS, ids=[r[0] for r in HELD_DEAD_ROWS])
def test_presumed_dead_by_the_writer_lease(rule: str, migration: StorageVersionMigration, held: bool,
                                           dead: bool) -> None:  # fmt: skip
    assert presumed_dead(migration, claimed_at=LONG_AGO, now=NOW, lease_seconds=LEASE, held=held) is dead, rule
