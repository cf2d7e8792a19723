"""Tasks of the dispatcher and the initializer: read what there is, create requests.

They read and create StorageVersionMigration objects (our own, holding no data
of migrated objects) and read discovery, CRDs and APIServices; the decisions
are the pure planners of `storage_migrator.dispatch` and
`storage_migrator.initializer`.
"""

from __future__ import annotations

import contextlib

from prefect import task

from storage_migrator.crds import read_crds
from storage_migrator.initializer import ApiServiceInfo, InitialRequest, InitPlan, plan_initialization
from storage_migrator.kube.discovery import discover
from storage_migrator.kube.errors import AlreadyExists
from storage_migrator.kube.listing import iterate_items
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.migrations import create_migration, list_migrations
from storage_migrator.models import StorageVersionMigration, new_storage_version_migration
from storage_migrator.settings import Settings
from storage_migrator.targets import MigrationTarget, resolve_target
from tasks.common import PRIVATE, connected

APISERVICES = ResourceRef(group="apiregistration.k8s.io", version="v1", resource="apiservices")


@task(name="read-migrations", **PRIVATE)
def read_migrations(settings: Settings) -> list[StorageVersionMigration]:
    with connected(settings) as api:
        return list_migrations(api)


@task(name="plan-initialization", **PRIVATE)
def plan_initial_requests(settings: Settings, *, include: list[str], exclude: list[str]) -> InitPlan:
    """Discovery, CRDs, APIServices and requests, then the plan (which names what discovery missed)."""
    with connected(settings) as api:
        found = discover(api, timeout=settings.request_timeout_seconds)
        crds = read_crds(api)
        apiservices = [ApiServiceInfo.from_object(o) for o in iterate_items(api, APISERVICES, limit=500)]
        existing = list_migrations(api)
    return plan_initialization(found.resources, crds=crds, apiservices=apiservices, existing=existing,
                               include=include, exclude=exclude, unreachable=found.failed)  # fmt: skip


@task(name="create-requests", **PRIVATE)
def create_requests(settings: Settings, requests: list[InitialRequest]) -> list[str]:
    """One StorageVersionMigration per request, named `<resource>.<group>-xxxxx` by the server."""
    names = []
    with connected(settings) as api:
        for request in requests:
            created = create_migration(
                api,
                new_storage_version_migration(group=request.group, version=request.version,
                                              resource=request.resource,
                                              labels={"migration.k8s.io/requested-by": "initialize"}),
            )  # fmt: skip
            names.append(created.metadata.name or "")
    return names


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
