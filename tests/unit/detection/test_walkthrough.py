"""Seed 000's "Case walkthrough" (HA, three API servers), replayed row by row with test-driven time.

The table: a rolling upgrade v1 -> v2 of three API servers, apiserver 3 rolled
back at minute 22, upgraded again at 34, the migration completed at 45. The
triggering controller polls at minutes 0, 10, 20, 30 and 40; each poll reads
the three servers' hashes (three reporters) and the plan is applied to
in-memory objects, as tasks/detecting.py applies it, including
status.currentStorageVersionHashes. Rows between polls only change the
servers: the stored state must still be the table's. The 45 row is fed as the
migration requested at 40 succeeding (started 41, finished 44), then a poll.

The seed's "identical in the past two polls" is read as "every reporter has
reported since the change" (see storage_migrator/detection/planner.py's docstring): the
table starts migrations at 20 and 40, right after polls that disagreed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

import pytest
from conftest import migration_requested_by_detection

from storage_migrator.conditions import set_condition
from storage_migrator.detection.planner import (
    SINCE_ANNOTATION,
    CreateMigration,
    CreateState,
    DeleteMigration,
    DetectionPlan,
    DetectionSettings,
    ReporterHash,
    UpdateState,
    format_time,
    plan_detection,
    storage_version_hash,
)
from storage_migrator.kube.discovery import DiscoveredResource
from storage_migrator.models import (
    CONDITION_RUNNING,
    CONDITION_SUCCEEDED,
    GroupResource,
    ObjectMeta,
    StorageState,
    StorageStateSpec,
    StorageStateStatus,
    StorageVersionHash,
    StorageVersionMigration,
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)
V1 = storage_version_hash("batch", "v1", "CronJob")
V2 = storage_version_hash("batch", "v2", "CronJob")
SERVERS = ("apiserver-1", "apiserver-2", "apiserver-3")
NAME = "cronjobs.batch"
NO_SETTLE = DetectionSettings(settle_seconds=0, stale_after_seconds=1200, poll_seconds=600)
DEFAULT_SETTLE = DetectionSettings(settle_seconds=60, stale_after_seconds=1200, poll_seconds=600)

Expect = Literal["none", "create", "delete", "refine"]


@dataclass(frozen=True)
class Row:
    minute: int
    events: str
    servers: tuple[str, str, str]  # apiserver 1, 2, 3 sv
    current: tuple[str, str, str]  # CurrentSV
    persisted: list[str]  # PersistedSV
    poll: bool
    expect: Expect = "none"


# Seed 000, "Case walkthrough", Case 1, verbatim. `poll` and `expect` are what the
# events text says the controllers do.
TABLE = [
    Row(0, "", (V1, V1, V1), (V1, V1, V1), [V1], poll=True),
    Row(3, "The cluster admin starts rolling upgrades from apiserver 1.",
        (V2, V1, V1), (V1, V1, V1), [V1], poll=False),
    Row(10, "Triggering controllers update currentSV. The leader does not start migration because "
            "of the lack of consensus on storage version.",
        (V2, V1, V1), (V2, V1, V1), [V1, V2], poll=True),
    Row(12, "Rolling upgrade continues, apiserver 2 is upgraded.",
        (V2, V2, V1), (V2, V1, V1), [V1, V2], poll=False),
    Row(18, "Rolling upgrade is done, apiserver 3 is upgraded.",
        (V2, V2, V2), (V2, V1, V1), [V1, V2], poll=False),
    Row(20, "Triggering controllers update currentSV. The leader starts migration as apiservers "
            "have the same storage version.",
        (V2, V2, V2), (V2, V2, V2), [V1, V2], poll=True, expect="create"),
    Row(22, "The cluster admin rolls back apiserver 3.",
        (V2, V2, V1), (V2, V2, V2), [V1, V2], poll=False),
    Row(30, "The triggering controller co-locates with apiserver 3 adds v1 to currentSV and "
            "persistedSV. The leader cancels ongoing migration.",
        (V2, V2, V1), (V2, V2, V1), [V1, V2], poll=True, expect="delete"),
    Row(34, "The cluster admin upgrades apiserver 3 again.",
        (V2, V2, V2), (V2, V2, V1), [V1, V2], poll=False),
    Row(40, "The triggering controller co-locates with apiserver 3 sets currentSV to v2. The "
            "leader starts migration as consensus is reached.",
        (V2, V2, V2), (V2, V2, V2), [V1, V2], poll=True, expect="create"),
    Row(45, "The migration has completed. The leader updates persistedSV to v2.",
        (V2, V2, V2), (V2, V2, V2), [V2], poll=True, expect="refine"),
]  # fmt: skip


def at(minute: float) -> datetime:
    return T0 + minute * MIN


@dataclass
class World:
    """The StorageState and the migrations, as a poll would list them; plans applied as tasks/detecting.py does."""

    state: StorageState
    migrations: dict[str, StorageVersionMigration] = field(default_factory=dict)
    serial: itertools.count[int] = field(default_factory=lambda: itertools.count(100))

    def poll(self, servers: tuple[str, ...], now: datetime, s: DetectionSettings) -> DetectionPlan:
        reporters = [
            ReporterHash(reporter_id=server, group="batch", resource="cronjobs", hash=hash_)
            for server, hash_ in zip(SERVERS, servers, strict=True)
        ]
        return plan_detection(
            # The discovery document of whichever server answered; the reporters decide.
            discovered=[discovered(servers[0])],
            reporters=reporters,
            states=[self.state],
            migrations=list(self.migrations.values()),
            crds=[],
            now=now,
            settings=s,
        )

    def apply(self, plan: DetectionPlan, now: datetime) -> None:
        for action in plan.actions:
            if isinstance(action, UpdateState):
                assert action.resource_version == self.state.metadata.resource_version, "CAS"
                self.state = stored_state(
                    current=action.current_hash,
                    persisted=action.persisted,
                    heartbeat=action.heartbeat,
                    reporters=action.current_hashes,
                    annotations=action.annotations,
                    rv=str(next(self.serial)),
                    # Issue 36: the revision when the switch is recorded (tasks/detecting.py reads it).
                    switch_rv=str(next(self.serial)) if action.record_switch else action.switch_resource_version,
                )
            elif isinstance(action, DeleteMigration):
                assert self.migrations[action.name].metadata.uid == action.uid
                del self.migrations[action.name]
            elif isinstance(action, CreateMigration):
                name = f"{action.group_resource}-{next(self.serial)}"
                self.migrations[name] = migration_requested_by_detection(action, name=name, now=now)
            else:
                pytest.fail(f"unexpected {action.kind}")

    def run(self, name: str, *, target: str, started: datetime, finished: datetime | None) -> None:
        """What run-migrations does: Running with the target hash, then Succeeded (if finished)."""
        m = self.migrations[name]
        m.status.target_storage_version_hash = target
        m.status.started_at = started
        m.status.resource_version = str(next(self.serial))  # its first LIST: after every write so far
        m.status.conditions = set_condition(
            m.status.conditions, condition_type=CONDITION_RUNNING, status="True", now=started
        )
        if finished is not None:
            m.status.finished_at = finished
            m.status.conditions = set_condition(
                m.status.conditions, condition_type=CONDITION_RUNNING, status="False", now=finished
            )
            m.status.conditions = set_condition(
                m.status.conditions, condition_type=CONDITION_SUCCEEDED, status="True", now=finished
            )

    def reporters(self) -> tuple[str, ...]:
        by_id = {
            e.reporter_id: e.current_storage_version_hash for e in self.state.status.current_storage_version_hashes
        }
        assert set(by_id) == set(SERVERS)
        return tuple(by_id[server] for server in SERVERS)


def discovered(hash_: str) -> DiscoveredResource:
    return DiscoveredResource(
        group="batch",
        version="v1",
        resource="cronjobs",
        kind="CronJob",
        namespaced=True,
        verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
        storage_version_hash=hash_,
        is_subresource=False,
        preferred=True,
    )


def stored_state(
    *,
    current: str,
    persisted: list[str],
    heartbeat: datetime,
    reporters: list[StorageVersionHash],
    annotations: dict[str, str],
    rv: str,
    switch_rv: str | None = None,
) -> StorageState:
    return StorageState(
        metadata=ObjectMeta(name=NAME, resource_version=rv, annotations=dict(annotations)),
        spec=StorageStateSpec(resource=GroupResource(group="batch", resource="cronjobs")),
        status=StorageStateStatus(
            persisted_storage_version_hashes=list(persisted),
            current_storage_version_hash=current,
            last_heartbeat_time=heartbeat,
            current_storage_version_hashes=list(reporters),
            current_hash_resource_version=switch_rv,
        ),
    )


def before_the_table() -> World:
    """A cluster on v1 for long, migrated: what the poll at minute -10 left."""
    heard = at(-10)
    return World(
        stored_state(
            current=V1,
            persisted=[V1],
            heartbeat=heard,
            reporters=[
                StorageVersionHash(reporterID=s, current_storage_version_hash=V1, last_heartbeat_time=heard)
                for s in SERVERS
            ],
            annotations={SINCE_ANNOTATION: format_time(at(-600))},
            rv="1",
            switch_rv="1",
        )
    )


def replay(s: DetectionSettings) -> tuple[list[tuple[int, list[str], list[str]]], World]:
    """Replay the table; per poll, the migrations created (target hashes) and the ones deleted (names)."""
    world = before_the_table()
    seen: list[tuple[int, list[str], list[str]]] = []
    for row in TABLE:
        if row.minute == 45:
            # "The migration has completed": the one requested at 40 ran from 41 to 44.
            (latest,) = world.migrations
            world.run(latest, target=V2, started=at(41), finished=at(44))
        if not row.poll:
            continue
        p = world.poll(row.servers, at(row.minute), s)
        seen.append(
            (
                row.minute,
                [c.target_hash for c in p.of_kind(CreateMigration)],
                [d.name for d in p.of_kind(DeleteMigration)],
            )
        )
        world.apply(p, at(row.minute))
        if row.minute == 20 and world.migrations:
            # The migration starts running (it is "ongoing" when server 3 is rolled back).
            (started,) = world.migrations
            world.run(started, target=V2, started=at(21), finished=None)
    return seen, world


def test_case_walkthrough_row_by_row() -> None:
    world = before_the_table()
    requested: list[str] = []
    for row in TABLE:
        now = at(row.minute)
        if row.minute == 45:
            # "The migration has completed": the one requested at 40 ran from 41 to 44.
            world.run(requested[-1], target=V2, started=at(41), finished=at(44))
        if row.poll:
            p = world.poll(row.servers, now, NO_SETTLE)
            assert not p.of_kind(CreateState)
            created = [c.target_hash for c in p.of_kind(CreateMigration)]
            deleted = [d.name for d in p.of_kind(DeleteMigration)]
            before = set(world.migrations)
            world.apply(p, now)
            if row.expect == "create":
                assert (created, deleted) == ([V2], []), row.events
                (new,) = set(world.migrations) - before
                requested.append(new)
            elif row.expect == "delete":
                # "The leader cancels ongoing migration": the one requested at 20, running since 21.
                assert (created, deleted) == ([], [requested[-1]]), row.events
                assert world.migrations == {}
            else:
                assert (created, deleted) == ([], []), row.events
            if row.expect == "refine":
                assert "refined" in p.of_kind(UpdateState)[0].reason, row.events
            if row.minute == 20:
                world.run(requested[-1], target=V2, started=at(21), finished=None)
        # Every row, polled or not: CurrentSV per reporter and PersistedSV as the table says.
        assert world.reporters() == row.current, row.events
        assert world.state.status.persisted_storage_version_hashes == row.persisted, row.events
        # The non-HA field keeps the last agreed hash: v1 until consensus on v2 at 20.
        assert world.state.status.current_storage_version_hash == (V1 if row.minute < 20 else V2), row.events
        assert world.state.status.last_heartbeat_time == at(
            max(m.minute for m in TABLE if m.poll and m.minute <= row.minute)
        )
    assert requested and len(requested) == 2


def test_walkthrough_requests_and_cancellations_per_poll() -> None:
    seen, world = replay(NO_SETTLE)
    cancelled = seen[3][2]
    assert len(cancelled) == 1
    assert seen == [(0, [], []), (10, [], []), (20, [V2], []), (30, [], cancelled), (40, [V2], []), (45, [], [])]
    # After 45 a poll of the same servers only beats the heart.
    again = world.poll((V2, V2, V2), at(55), NO_SETTLE)
    assert [a.kind for a in again.actions] == ["UpdateState"]
    assert again.of_kind(UpdateState)[0].persisted == [V2]


def test_walkthrough_with_the_default_settle_delay() -> None:
    # Seed 004's loose guarantee (settle 60 s): a change of the agreed hash waits one
    # settle delay, so the poll at 20 (v1 -> v2 agreed) requests nothing and the next
    # poll, at 30, sees the rollback: nothing to cancel. At 40 the hash agreed on is
    # the same v2 (no change, no settle): the migration starts, and 45 refines.
    seen, world = replay(DEFAULT_SETTLE)
    assert seen == [(0, [], []), (10, [], []), (20, [], []), (30, [], []), (40, [V2], []), (45, [], [])]
    assert world.state.status.persisted_storage_version_hashes == [V2]
