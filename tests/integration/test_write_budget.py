"""The shared write budget on a real Prefect server (the session's test server, SQLite).

Issue 13: "The budget is the promise to the API server (seed 002: < 10 writes/s
by default), and it must hold on the default installation too." What the server
must hold for the rules of storage_migrator/migration/write_share.py to work: the rate in
`storage-migrator-writes`, one writer's lease per running migration in
`storage-migrator-writes-writers`, released at the end, and a joiner that sees
another writer waits before its first write.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from conftest import wait_until
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.exceptions import ObjectNotFound

from storage_migrator.fleet.names import writers_limit_name
from tasks.write_budget import (
    MAX_VIEW_AGE_SECONDS,
    WRITERS_LIMIT,
    LeasedPacer,
    RateLimitInfo,
    chunk_pacer,
    ensure_write_rate_limit,
    release_writer,
    writer_lease,
)

pytestmark = pytest.mark.usefixtures("prefect_api")


def writers(name: str) -> int:
    with get_client(sync_client=True) as client:
        return int(client.read_global_concurrency_limit_by_name(writers_limit_name(name)).active_slots)


def budget(name: str, rate: float) -> RateLimitInfo:
    info = ensure_write_rate_limit.fn(name, rate, explicit=True)
    assert info.name == name and info.writes_per_second == rate
    return info


def test_each_running_migration_holds_one_writers_lease_released_at_the_end(request: Any) -> None:
    name = f"budget-{request.node.name[-20:].lower().replace('_', '-')}-{int(time.time())}"
    info = budget(name, 10.0)
    assert writers(name) == 0
    with writer_lease(info.model_copy(update={"holder": "m1"})) as first:
        assert first.name == name  # the shared budget, not the local fallback
        assert writers(name) == 1
        with chunk_pacer(first, write_concurrency=8, chunk_limit=500) as pacer:
            assert isinstance(pacer, LeasedPacer)  # chunks pace at the run's share
            pacer.before_write()  # alone: the first write goes at once
        with writer_lease(info.model_copy(update={"holder": "m2"})) as second:
            assert writers(name) == 2
            release_writer(second)  # its last chunk is done: the share goes back at once
            assert writers(name) == 1
    assert writers(name) == 0


def test_a_joiner_that_sees_another_writer_waits_before_its_first_write(request: Any) -> None:
    """write_share: "a joiner waits `join_wait` = max_age + 2 * CATCH_UP_SECONDS before its
    first write when others hold leases"; a writer alone starts at once."""
    from tasks.write_budget import _HELD

    name = f"budget-joiner-{int(time.time() * 1000)}"
    info = budget(name, 10.0)
    with writer_lease(info.model_copy(update={"holder": "a"})):
        alone = _HELD["a"].limiter
        assert alone.not_before == 0.0
        with writer_lease(info.model_copy(update={"holder": "b"})):
            joiner = _HELD["b"].limiter
            assert joiner.not_before >= time.monotonic() + MAX_VIEW_AGE_SECONDS - 1.0
            assert joiner.pace == pytest.approx(4.85)  # (10 x 9.9 / 2 - 1) / 10 writes/s
            # the first writer's view counts the joiner at its next read (every half second)
            deadline = time.monotonic() + 10
            while alone.pace != joiner.pace and time.monotonic() < deadline:
                time.sleep(0.1)
            assert alone.pace == pytest.approx(4.85)


def test_an_operator_change_of_the_rate_reaches_running_migrations() -> None:
    """`prefect gcl update storage-migrator-writes --slot-decay-per-second 50` is seen by runs."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    from tasks.write_budget import _HELD

    name = f"budget-update-{int(time.time() * 1000)}"
    info = budget(name, 10.0)
    with writer_lease(info.model_copy(update={"holder": "u"})):
        limiter = _HELD["u"].limiter
        assert limiter.pace == pytest.approx(9.8)  # (10 x 9.9 - 1) / 10 writes/s
        with get_client(sync_client=True) as client:
            client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(slot_decay_per_second=50.0))
        deadline = time.monotonic() + 10
        while limiter.pace != pytest.approx(49.4) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert limiter.pace == pytest.approx(49.4)


def test_two_first_runs_of_a_budget_at_once_both_use_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs that find no budget create it at once (a new cluster's first dispatch starts
    two migrations; issue 20): the second create is refused (409). bench/fleet_budget.py saw
    that run pace locally, hold no writer's lease, and the other, counting itself alone,
    write at the whole budget beside it: twice the budget. Here the other run's creates land
    between this run's reads and its creates, on the real server."""
    import tasks.write_budget as write_budget

    name = f"budget-race-{int(time.time() * 1000)}"
    server = write_budget.get_client

    class RivalCreatesFirst:
        """The client of a run whose every read of a missing limit is followed by a rival's create."""

        def __init__(self, client: Any) -> None:
            self._client = client

        def __getattr__(self, attr: str) -> Any:
            return getattr(self._client, attr)

        def read_global_concurrency_limit_by_name(self, limit_name: str) -> Any:
            try:
                return self._client.read_global_concurrency_limit_by_name(limit_name)
            except ObjectNotFound:
                budget = limit_name == name
                with server(sync_client=True) as rival:
                    rival.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(
                        name=limit_name, limit=10 if budget else WRITERS_LIMIT, active=True,
                        slot_decay_per_second=10.0 if budget else 0.0))  # fmt: skip
                raise

    @contextmanager
    def raced(**kwargs: Any) -> Iterator[RivalCreatesFirst]:
        with server(**kwargs) as client:
            yield RivalCreatesFirst(client)

    monkeypatch.setattr(write_budget, "get_client", raced)
    info = ensure_write_rate_limit.fn(name, 10.0)
    assert info.name == name, "the shared budget, not local pacing beside the run that created it"
    assert info.writes_per_second == 10.0


def test_a_lease_the_server_no_longer_knows_is_taken_again(request: Any) -> None:
    """Issue 31: after a restart a Prefect server (3.9, leases in memory) answers a renewal
    with 410 Gone. The writer joins again, instead of failing every read from then on (its
    writes paused for good)."""
    from tasks.write_budget import _HELD, WriterLease

    name = f"budget-gone-{int(time.time() * 1000)}"
    info = budget(name, 10.0)
    with writer_lease(info.model_copy(update={"holder": "g"})):
        lease: WriterLease = _HELD["g"]
        lost = lease._lease
        assert lost is not None
        with get_client(sync_client=True) as client:
            client.release_concurrency_slots_with_lease(lost)  # the server forgets it, as a restart does
        # A renewal is due: the lease's own thread makes it, gets 410, and joins again (the test
        # renewing beside it, as it once did, made two joins under load: a race of the test's).
        lease._renewed = 0.0
        wait_until(lambda: lease._lease not in (None, lost), what="the writer to join again")
        assert writers(name) == 1, "one writer: the new lease, the lost one forgotten"
    assert writers(name) == 0


def test_slots_no_run_holds_are_released_and_the_live_ones_kept(kubesim: Any, clean_slate: Any, request: Any) -> None:
    """Issue 31: "The writers' count must be right after any server restart. [...] the count
    rebuilds itself from runs that are really alive." A restart of a Prefect server that keeps
    its leases in memory leaves the slots they held counted, with no lease: made here as the
    server makes them (`increment` without a lease). One run is alive: its request Running, its
    writer's lease held. The healer releases the two ghosts and keeps its slot; a second
    healer within HEALER_SECONDS does nothing (two would take the same ghosts away)."""
    from datetime import UTC, datetime

    from storage_migrator.migration.requests import MigrationRecord, create_migration
    from storage_migrator.models import new_storage_version_migration
    from storage_migrator.settings import Settings
    from tasks.writers_count import heal_writers_count

    name = f"budget-ghosts-{int(time.time() * 1000)}"
    settings = Settings(kubeconfig=kubesim.kubeconfig, rate_limit_name=name)
    info = budget(name, 10.0)
    api = api_client_for(kubesim)
    live = create_migration(api, new_storage_version_migration(group="", version="v1", resource="configmaps"))
    MigrationRecord(api, live).start(now=datetime.now(UTC), target_hash=None, message="a live run")
    with writer_lease(info.model_copy(update={"holder": "alive"})):
        with get_client(sync_client=True) as client:
            client.increment_concurrency_slots(names=[writers_limit_name(name)], slots=2, mode="concurrency")
        assert writers(name) == 3
        assert heal_writers_count.fn(settings) == 2
        assert writers(name) == 1, "the live run's slot is kept"
        with get_client(sync_client=True) as client:
            client.increment_concurrency_slots(names=[writers_limit_name(name)], slots=1, mode="concurrency")
        assert heal_writers_count.fn(settings) is None, "a second healer at once takes nothing"
        assert writers(name) == 2
    assert writers(name) == 1  # the ghost made after the first healing, for the next one


def api_client_for(kubesim: Any) -> Any:
    from storage_migrator.kube.connection import api_client_from_settings
    from storage_migrator.settings import Settings

    return api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
