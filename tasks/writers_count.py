"""The writers' count of the write budget, healed after a restart of the Prefect server (issue 31).

Prefect 3.9 keeps concurrency leases in memory by default: a restarted server forgets them,
and the slots they held stay counted in `<budget>-writers`, with no lease to expire them.
Each later run would pace itself at a smaller share, for good ("a ghost writer that halves
every later budget"). The count is rebuilt from what the cluster shows: a run holds a
writer's slot only while its request is Running (`dispatch.possible_writers`).
"""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime
from typing import Any

import httpx
from prefect import task
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from storage_migrator.fleet.names import budget_limit_name, writers_limit_name
from storage_migrator.migration.dispatch import possible_writers
from storage_migrator.migration.requests import list_migrations
from storage_migrator.settings import Settings
from tasks.common import PRIVATE, connected
from tasks.run_owners import ended_owners

log = logging.getLogger(__name__)

#: One healer at a time per budget (two would each take the same ghosts away): a limit of one
#: slot that decays in HEALER_SECONDS, so that a healer that died (or a server restart) never
#: holds it for good, as a lease lost in a restart would. A healing takes a few reads.
HEALER_SECONDS = 10.0


def healer_limit_name(name: str) -> str:
    return f"{writers_limit_name(name)}-healer"


def _take_healer(client: object, name: str) -> bool:
    healer = healer_limit_name(name)
    try:
        client.read_global_concurrency_limit_by_name(healer)  # type: ignore[attr-defined]
    except ObjectNotFound:
        with contextlib.suppress(ObjectAlreadyExists):
            client.create_global_concurrency_limit(  # type: ignore[attr-defined]
                GlobalConcurrencyLimitCreate(
                    name=healer, limit=1, slot_decay_per_second=1 / HEALER_SECONDS, active=True
                )
            )
    try:
        client.increment_concurrency_slots(names=[healer], slots=1, mode="rate_limit")  # type: ignore[attr-defined]
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code == 423:  # another healer within HEALER_SECONDS
            return False
        raise
    return True


def _transient(task: object, task_run: object, state: Any) -> bool:
    """A 5xx (SQLite's "database is locked" answers 503) or no answer: tried again."""
    try:
        state.result()
    except httpx.HTTPStatusError as exc:
        return exc.response.status_code >= 500
    except httpx.TransportError:
        return True
    except Exception:  # noqa: BLE001 - anything else is final
        return False
    return False


@task(name="heal-writers-count", retries=2, retry_delay_seconds=2, retry_condition_fn=_transient, **PRIVATE)
def heal_writers_count(settings: Settings, *, joining: str | None = None) -> int | None:
    """Issue 31: "The writers' count must be right after any server restart." A Prefect server
    keeping its leases in memory (3.9's default) forgets them when it restarts, and the slots
    they held stay counted: each later run would pace at a smaller share for good. The slots
    counted beyond the runs that may hold one (`possible_writers`, read from the cluster after
    the count) are released. It only ever releases slots no live run holds: a run that joins
    meanwhile is counted as possible and not as a slot; one that leaves, as possible still.
    `joining`: the request of the run that heals before it takes its own slot (counted as
    possible, it holds none yet). The slots released; None when another healer had the turn
    (nothing done here)."""
    name = budget_limit_name(settings.rate_limit_name, settings.cluster)
    with get_client(sync_client=True) as client:
        if not _take_healer(client, name):
            return None
        read_at = datetime.now(UTC)
        try:
            slots = int(client.read_global_concurrency_limit_by_name(writers_limit_name(name)).active_slots)
        except ObjectNotFound:
            return 0
        if slots == 0:
            return 0
        with connected(settings) as api:
            requests = list_migrations(api)
        # A request whose claiming run Prefect shows ended has no writer (it is resumed at once).
        no_slot = {
            *ended_owners(client, requests, lease_seconds=settings.lease_seconds),
            *([joining] if joining else []),
        }
        ghosts = slots - possible_writers(requests, now=datetime.now(UTC), lease_seconds=settings.lease_seconds,
                                          slots_read_at=read_at, ended=no_slot)  # fmt: skip
        if ghosts <= 0:
            return 0
        client.release_concurrency_slots(names=[writers_limit_name(name)], slots=ghosts, occupancy_seconds=1.0)
    log.warning("write budget %s: %d of its %d writers' slots had no run (their leases were lost, e.g. in a restart "
                "of the Prefect server): released", name, ghosts, slots)  # fmt: skip
    return ghosts
