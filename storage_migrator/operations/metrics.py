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

Issue 20: every series carries `cluster` (a KubernetesClusterConfig block's
name, or `default`): one metrics server next to a shared ledger serves one
cluster, or the whole fleet, and a cluster that cannot be read says so in its
own `storage_migrator_up{source="cluster"}` while the others are served.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.engine import Engine

from storage_migrator.conditions import phase_from_conditions
from storage_migrator.fleet.names import DEFAULT_CLUSTER
from storage_migrator.ledger import queries
from storage_migrator.ledger.database import ledger_engine
from storage_migrator.models import StorageVersionMigration, storage_state_name

__all__ = ["DURATION_BUCKETS", "PHASES", "MigratorCollector"]

logger = logging.getLogger("storage_migrator.operations.metrics")

PHASES: Final = ("Pending", "Running", "Succeeded", "Failed")
#: Seconds: a small resource takes seconds, 100,000 Secrets at 10 writes/s close to three hours.
DURATION_BUCKETS: Final = (1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0)

#: A cluster's StorageVersionMigrations, by the cluster's name.
ListRequests = Callable[[str], list[StorageVersionMigration]]


def _histogram(durations: Iterable[float]) -> tuple[list[tuple[str, float]], float]:
    values = sorted(durations)
    buckets = [(repr(le), float(sum(1 for v in values if v <= le))) for le in DURATION_BUCKETS]
    buckets.append(("+Inf", float(len(values))))
    return buckets, sum(values)


class MigratorCollector(Collector):
    """Reads the ledger at `database_url` and, if given, each cluster's requests, on every scrape.

    `clusters`: the clusters whose series are served; None: every cluster the
    ledger has rows of, read at each scrape (a cluster's first run adds it).
    """

    def __init__(
        self,
        database_url: str,
        list_requests: ListRequests | None = None,
        *,
        clusters: Sequence[str] | None = (DEFAULT_CLUSTER,),
    ) -> None:
        self.database_url = database_url
        self.list_requests = list_requests
        self.clusters = None if clusters is None else list(clusters)
        #: The clusters of the last scrape that read the ledger: whose `up` says 0 when it cannot be read.
        self._known: list[str] = list(clusters or [DEFAULT_CLUSTER])

    def describe(self) -> Iterable[Metric]:
        return []  # nothing is read when the collector is registered, only when scraped

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("storage_migrator_up", "Whether a source of these metrics was read (1) in this scrape.",
                               labels=["cluster", "source"])  # fmt: skip
        try:
            engine = ledger_engine(self.database_url)
            names = self.clusters if self.clusters is not None else queries.clusters(engine) or [DEFAULT_CLUSTER]
            ledger = list(self._ledger(engine, names))
        except Exception as exc:  # noqa: BLE001 - a scrape reports the outage, it does not fail
            logger.warning("metrics: the ledger could not be read: %s", type(exc).__name__)
            names, ledger = self._known, []
        self._known = names
        for name in names:
            up.add_metric([name, "ledger"], 1.0 if ledger else 0.0)
        yield from ledger
        if self.list_requests is not None:
            yield from self._clusters(self.list_requests, names, up)
        yield up

    def _ledger(self, engine: Engine, names: list[str]) -> Iterator[Metric]:
        objects = CounterMetricFamily(
            "storage_migrator_objects",
            "Objects handled by migrations, per cluster, resource and outcome (rewritten, unchanged, gone, "
            "conflicted, failed), summed over every chunk every worker recorded in the ledger.",
            labels=["cluster", "resource", "outcome"],
        )
        durations = HistogramMetricFamily(
            "storage_migrator_migration_duration_seconds",
            "Duration of finished migration runs (start to outcome), per cluster, from the ledger.",
            labels=["cluster"],
        )
        last = GaugeMetricFamily("storage_migrator_last_poll_timestamp_seconds",
                                 "Unix time at which the cluster's last detection poll ended.", labels=["cluster"])  # fmt: skip
        took = GaugeMetricFamily("storage_migrator_poll_duration_seconds",
                                 "Duration of the cluster's last detection poll.", labels=["cluster"])  # fmt: skip
        for name in names:
            for row in queries.object_counts(engine, cluster=name):
                objects.add_metric([name, row.resource, row.outcome], float(row.objects))
            buckets, total = _histogram(queries.finished_durations(engine, cluster=name))
            durations.add_metric([name], buckets, total)
            poll = queries.last_poll(engine, cluster=name)
            if poll is not None:
                last.add_metric([name], poll.finished_at.timestamp())
                took.add_metric([name], poll.duration_seconds)
        yield objects
        yield durations
        if last.samples:
            yield last
            yield took

    def _clusters(self, list_requests: ListRequests, names: list[str], up: GaugeMetricFamily) -> Iterator[Metric]:
        """Each cluster's requests: one that cannot be read says 0 in `up`, the others are served."""
        migrations = GaugeMetricFamily("storage_migrator_migrations",
                                       "StorageVersionMigration objects per cluster, resource and phase.",
                                       labels=["cluster", "resource", "phase"])  # fmt: skip
        remaining = GaugeMetricFamily(
            "storage_migrator_remaining_objects",
            "Objects left to migrate in running migrations (the API server's remainingItemCount estimate "
            "at the last checkpoint).",
            labels=["cluster", "resource"],
        )
        for name in names:
            try:
                requests = list_requests(name)
            except Exception as exc:  # noqa: BLE001 - same: report, do not fail
                logger.warning("metrics: cluster %r: the StorageVersionMigrations could not be listed: %s", name, exc)
                up.add_metric([name, "cluster"], 0.0)
                continue
            up.add_metric([name, "cluster"], 1.0)
            _count(name, requests, migrations, remaining)
        yield migrations
        yield remaining


def _count(
    cluster: str, requests: list[StorageVersionMigration], migrations: GaugeMetricFamily, remaining: GaugeMetricFamily
) -> None:
    """One cluster's requests per resource and phase (every phase of a known resource, zeros included, so
    alerts see 0), and the objects left in its running ones."""
    phases: Counter[tuple[str, str]] = Counter()
    resources: set[str] = set()
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
    for resource in sorted(resources):
        for phase in PHASES:
            migrations.add_metric([cluster, resource, phase], float(phases[(resource, phase)]))
    for resource, count in sorted(left.items()):
        remaining.add_metric([cluster, resource], float(count))
