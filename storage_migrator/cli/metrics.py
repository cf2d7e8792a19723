"""``storage-migrator metrics --port N``: Prometheus metrics from the ledger and the cluster.

Issue 12, item 3: every value is computed at scrape time by
`storage_migrator.operations.metrics.MigratorCollector`, so one metrics server counts the
work of every worker. It serves until interrupted (Ctrl-C, SIGTERM). Issue 20:
one cluster's series (each labelled `cluster`), or with `--all-clusters` those of
every cluster in the ledger, each cluster's requests read through its own credentials.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Annotated

import typer

from storage_migrator.cli.clusters import AllClustersOption, ClusterOption, connect, scope_of
from storage_migrator.cli.options import settings_of
from storage_migrator.migration.requests import list_migrations
from storage_migrator.models import StorageVersionMigration

__all__ = ["command"]


def command(
    ctx: typer.Context,
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port to serve /metrics on")] = 9309,
    address: Annotated[str, typer.Option(help="address to listen on (0.0.0.0: every interface)")] = "0.0.0.0",
    requests: Annotated[bool, typer.Option(help="also read the clusters' StorageVersionMigrations")] = True,
    cluster: ClusterOption = None,
    all_clusters: AllClustersOption = False,
) -> None:
    """Serve Prometheus metrics on http://ADDRESS:PORT/metrics, computed from the ledger and the cluster at each scrape.

    Every series is labelled with its cluster: the default cluster's, --cluster NAME's (a KubernetesClusterConfig block), or --all-clusters (every cluster in the ledger, read again at each scrape). See docs/observability.md for the metrics and example PromQL. Runs until interrupted; exit code 0.
    """
    # The ledger's SQLAlchemy and the exporter only in this command: the others start without them (issue 29).
    from prometheus_client import CollectorRegistry, start_http_server

    from storage_migrator.operations.metrics import MigratorCollector

    scope = scope_of(ctx, cluster, all_clusters)
    settings = settings_of(ctx)

    def list_requests(name: str) -> list[StorageVersionMigration]:
        with connect(ctx, name) as api:
            return list_migrations(api)

    registry = CollectorRegistry(auto_describe=False)
    clusters = None if scope.cluster is None else [scope.cluster]
    registry.register(MigratorCollector(settings.database_url, list_requests if requests else None, clusters=clusters))
    server, thread = start_http_server(port, addr=address, registry=registry)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"serving metrics on http://{address}:{port}/metrics", file=sys.stderr, flush=True)
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        thread.join(timeout=5)
