"""The write budget every worker shares: a Prefect global concurrency limit used
as a rate limit (slots decay instead of being released).

Design decision (DESIGN 4.5, PREFECT.md): the limit is created once, with
`slot_decay_per_second` = writes per second, and then belongs to the operator:
an existing limit is never overwritten, its decay rate is the rate every run
uses (`prefect gcl update storage-migrator-writes --slot-decay-per-second 50
--limit 50` raises it for everyone). Slots are taken `batch` writes at a time
with `strict=True` (a missing limit is an error, not a silent "unlimited"); the
local limiter of `storage_migrator.pacing` paces the writes inside a batch.
When no Prefect API answers, the local limiter alone keeps the rate.
"""

from __future__ import annotations

import logging
import math

from prefect import task
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
from prefect.concurrency.sync import rate_limit
from prefect.exceptions import ObjectNotFound
from pydantic import BaseModel, ConfigDict, Field

from tasks.common import PRIVATE

log = logging.getLogger(__name__)


class RateLimitInfo(BaseModel):
    """The budget a run uses."""

    model_config = ConfigDict(frozen=True)

    name: str | None = Field(description="The global concurrency limit; None: local pacing only.")
    writes_per_second: float = Field(gt=0)
    batch: int = Field(ge=1, description="Slots taken per acquisition.")


def batch_for(rate: float) -> int:
    """About one acquisition per second of writes: one round trip per `rate` writes."""
    return max(1, math.floor(rate))


@task(name="ensure-write-rate-limit", **PRIVATE)
def ensure_write_rate_limit(name: str, writes_per_second: float, *, explicit: bool = False) -> RateLimitInfo:
    """The shared budget: created at `writes_per_second` if missing; an existing one
    keeps its rate unless this run was given one explicitly (then it is set for everyone)."""
    local = RateLimitInfo(name=None, writes_per_second=writes_per_second, batch=batch_for(writes_per_second))
    try:
        with get_client(sync_client=True) as client:
            try:
                existing = client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(
                        name=name, limit=local.batch, slot_decay_per_second=writes_per_second, active=True
                    )
                )
                return local.model_copy(update={"name": name})
            if explicit and existing.slot_decay_per_second != writes_per_second:
                client.update_global_concurrency_limit(
                    name,
                    GlobalConcurrencyLimitUpdate(limit=local.batch, slot_decay_per_second=writes_per_second),
                )
                return local.model_copy(update={"name": name})
    except Exception as exc:  # noqa: BLE001 - no reachable Prefect API: pace locally
        log.warning("write budget %s unavailable (%s): pacing writes locally at %s/s", name, exc, writes_per_second)
        return local
    if not existing.active or not existing.slot_decay_per_second:
        log.warning("global concurrency limit %s is inactive or has no slot decay: pacing writes locally", name)
        return local
    rate = existing.slot_decay_per_second
    return RateLimitInfo(name=name, writes_per_second=rate, batch=max(1, min(existing.limit, batch_for(rate))))


class PrefectWriteBudget:
    """`WriteBudget` over the global concurrency limit (falls back to local pacing on API errors)."""

    def __init__(self, info: RateLimitInfo) -> None:
        self.info = info
        self._broken = info.name is None

    def take(self, n: int) -> None:
        if self._broken or self.info.name is None:
            return
        try:
            rate_limit(self.info.name, occupy=n, strict=True)
        except Exception as exc:  # noqa: BLE001 - the local limiter still paces
            self._broken = True
            log.warning("write budget %s failed (%s): pacing writes locally from now on", self.info.name, exc)
