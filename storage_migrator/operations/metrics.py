"""Prometheus metrics, computed at scrape time from the ledger and the cluster's objects.

Design decision (issue 12, item 3): no process keeps counters in memory. Flow
runs come and go on many workers; the ledger has every chunk each of them
recorded, and the StorageVersionMigration objects have every request's phase
and progress. So `storage-migrator metrics --port N` is one small server whose
custom collector reads both on each scrape: whichever worker did the work, it
is counted, and a restart of the metrics server loses nothing. A source that
cannot be read leaves its metrics out of that scrape and sets
`storage_migrator_up{source=...}` to 0.

Upstream (kube-storage-version-migrator) declared `remaining_objects` and never
set it; here it is the API server's `remainingItemCount` estimate stored in a
running request's `status.progress`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from storage_migrator.conditions import phase_from_conditions
from storage_migrator.ledger import queries
from storage_migrator.ledger.database import ledger_engine
from storage_migrator.models import StorageVersionMigration, storage_state_name

__all__ = ["DURATION_BUCKETS", "PHASES", "MigratorCollector"]

logger = logging.getLogger("storage_migrator.operations.metrics")

PHASES: Final = ("Pending", "Running", "Succeeded", "Failed")
#: Seconds: a small resource takes seconds, 100,000 Secrets at 10 writes/s close to three hours.
DURATION_BUCKETS: Final = (1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0)

ListRequests = Callable[[], list[StorageVersionMigration]]


def _histogram(durations: Iterable[float]) -> tuple[list[tuple[str, float]], float]:
    values = sorted(durations)
    buckets = [(repr(le), float(sum(1 for v in values if v <= le))) for le in DURATION_BUCKETS]
    buckets.append(("+Inf", float(len(values))))
    return buckets, sum(values)


class MigratorCollector(Collector):
    """Reads the ledger at `database_url` and, if given, the cluster's requests, on every scrape."""

    def __init__(self, database_url: str, list_requests: ListRequests | None = None) -> None:
        self.database_url = database_url
        self.list_requests = list_requests

    def describe(self) -> Iterable[Metric]:
        return []  # nothing is read when the collector is registered, only when scraped

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("storage_migrator_up", "Whether a source of these metrics was read (1) in this scrape.",
                               labels=["source"])  # fmt: skip
        try:
            ledger = list(self._ledger())
        except Exception as exc:  # noqa: BLE001 - a scrape reports the outage, it does not fail
            logger.warning("metrics: the ledger could not be read: %s", type(exc).__name__)
            ledger = []
        up.add_metric(["ledger"], 1.0 if ledger else 0.0)
        yield from ledger
        if self.list_requests is not None:
            try:
                cluster = list(self._cluster(self.list_requests()))
            except Exception as exc:  # noqa: BLE001 - same: report, do not fail
                logger.warning("metrics: the StorageVersionMigrations could not be listed: %s", exc)
                cluster = []
            up.add_metric(["cluster"], 1.0 if cluster else 0.0)
            yield from cluster
        yield up

    def _ledger(self) -> Iterator[Metric]:
        engine = ledger_engine(self.database_url)
        objects = CounterMetricFamily(
            "storage_migrator_objects",
            "Objects handled by migrations, per resource and outcome (rewritten, unchanged, gone, conflicted, "
            "failed), summed over every chunk every worker recorded in the ledger.",
            labels=["resource", "outcome"],
        )
        for row in queries.object_counts(engine):
            objects.add_metric([row.resource, row.outcome], float(row.objects))
        yield objects
        buckets, total = _histogram(queries.finished_durations(engine))
        yield HistogramMetricFamily(
            "storage_migrator_migration_duration_seconds",
            "Duration of finished migration runs (start to outcome), from the ledger.",
            buckets=buckets,
            sum_value=total,
        )
        poll = queries.last_poll(engine)
        if poll is not None:
            yield GaugeMetricFamily("storage_migrator_last_poll_timestamp_seconds",
                                    "Unix time at which the last detection poll ended.",
                                    value=poll.finished_at.timestamp())  # fmt: skip
            yield GaugeMetricFamily("storage_migrator_poll_duration_seconds",
                                    "Duration of the last detection poll.", value=poll.duration_seconds)  # fmt: skip

    def _cluster(self, requests: list[StorageVersionMigration]) -> Iterator[Metric]:
        phases: Counter[tuple[str, str]] = Counter()
        resources: set[str] = set()
        remaining = GaugeMetricFamily(
            "storage_migrator_remaining_objects",
            "Objects left to migrate in running migrations (the API server's remainingItemCount estimate "
            "at the last checkpoint).",
            labels=["resource"],
        )
        left: Counter[str] = Counter()
        for request in requests:
            r = request.spec.resource
            resource = storage_state_name(r.group, r.resource)
            phase = phase_from_conditions(request.status.conditions)
            resources.add(resource)
            phases[(resource, phase)] += 1
            progress = request.status.progress
            if phase == "Running" and progress is not None and progress.remaining_item_count is not None:
                left[resource] += progress.remaining_item_count
        migrations = GaugeMetricFamily("storage_migrator_migrations",
                                       "StorageVersionMigration objects per resource and phase.",
                                       labels=["resource", "phase"])  # fmt: skip
        for resource in sorted(resources):
            for phase in PHASES:  # every phase of a known resource, zeros included, so alerts see 0
                migrations.add_metric([resource, phase], float(phases[(resource, phase)]))
        for resource, count in sorted(left.items()):
            remaining.add_metric([resource], float(count))
        yield migrations
        yield remaining
