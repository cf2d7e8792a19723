"""Tasks of the dispatcher and the initializer: read what there is, create requests.

They read and create StorageVersionMigration objects (our own, holding no data
of migrated objects) and read discovery and APIServices; the decisions are the
pure planners of `storage_migrator.migration.dispatch` and `storage_migrator.detection.initializer`
(whose plan the detection poll's task applies, tasks/detecting.py).
"""

from __future__ import annotations

import contextlib

from prefect import task

from storage_migrator.detection.initializer import ApiServiceInfo
from storage_migrator.kube.discovery import discover
from storage_migrator.kube.errors import AlreadyExists
from storage_migrator.kube.listing import iterate_items
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.migration.requests import create_migration, list_migrations
from storage_migrator.migration.targets import MigrationTarget, resolve_target
from storage_migrator.migration.write_budget import WriterLease
from storage_migrator.migration.writer_leases import list_writer_leases
from storage_migrator.models import StorageVersionMigration, new_storage_version_migration
from storage_migrator.settings import Settings
from tasks.common import PRIVATE, connected

APISERVICES = ResourceRef(group="apiregistration.k8s.io", version="v1", resource="apiservices")


@task(name="read-migrations", **PRIVATE)
def read_migrations(settings: Settings) -> list[StorageVersionMigration]:
    with connected(settings) as api:
        return list_migrations(api)


@task(name="read-writer-leases", **PRIVATE)
def read_writer_leases(settings: Settings) -> list[WriterLease]:
    """Issue 37: the runs' request Leases in the install's namespace: which requests a live run holds."""
    with connected(settings) as api:
        return list_writer_leases(api, namespace=settings.namespace)


@task(name="read-apiservices", **PRIVATE)
def read_apiservices(settings: Settings) -> list[ApiServiceInfo]:
    """Which group versions an aggregated API server serves (seed 002): the origin `initialize` reports."""
    with connected(settings) as api:
        return [ApiServiceInfo.from_object(o) for o in iterate_items(api, APISERVICES, limit=500)]


@task(name="resolve-targets", **PRIVATE)
def resolve_targets(settings: Settings, resources: list[str]) -> list[MigrationTarget]:
    """Each resource as discovery serves it now; `UnknownResource` names the first one not served."""
    with connected(settings) as api:
        found = discover(api, timeout=settings.request_timeout_seconds)
    return [resolve_target(found.resources, resource=r) for r in resources]


@task(name="create-named-requests", **PRIVATE)
def create_named_requests(
    settings: Settings, requests: list[tuple[str, MigrationTarget]], *, labels: dict[str, str],
    annotations: dict[str, str],
) -> list[str]:  # fmt: skip
    """One StorageVersionMigration per `(name, target)`, with our labels and annotations.

    A name created meanwhile by someone else is left as it is (409): the caller reads
    the requests again and judges what it finds.
    """
    names = []
    with connected(settings) as api:
        for name, target in requests:
            request = new_storage_version_migration(group=target.ref.group, version=target.ref.version,
                                                    resource=target.ref.resource, name=name, labels=labels)  # fmt: skip
            request.metadata.annotations = dict(annotations)
            with contextlib.suppress(AlreadyExists):
                names.append(create_migration(api, request).metadata.name or name)
    return names
