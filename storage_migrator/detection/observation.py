"""What one detection poll reads of the cluster, read in one place.

Design decision (DESIGN 4.3, issue 12): the observation half of a poll is a
plain function over an API client, so the detection task wraps it
(tasks/detecting.py) and ``storage-migrator plan`` calls it without Prefect:
both see exactly the same thing. Only reads; the result holds our own objects,
discovery and CRD names, never the data of a migrated object.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from kubernetes.client import ApiClient
from pydantic import BaseModel, Field

from storage_migrator.agreement.apiservers import observe_agreement
from storage_migrator.agreement.reporters import ReporterHash
from storage_migrator.agreement.storage_versions import AgreementSource
from storage_migrator.detection.states import list_states
from storage_migrator.kube.crds import CrdObservation, read_crds
from storage_migrator.kube.discovery import DiscoveredResource, GroupVersionFailure, discover
from storage_migrator.kube.errors import NotFound
from storage_migrator.kube.in_tree import InTreeMigration, in_tree_version, list_in_tree
from storage_migrator.migration.in_tree_runs import MANAGED_BY, MANAGED_BY_LABEL
from storage_migrator.migration.requests import list_migrations
from storage_migrator.models import StorageState, StorageVersionMigration
from storage_migrator.settings import Settings

__all__ = ["Observations", "observe_cluster"]


class Observations(BaseModel):
    """What one poll saw: discovery, StorageStates, migrations (ours and in-tree) and CRDs (no object data)."""

    discovered: list[DiscoveredResource]
    discovery_failures: list[GroupVersionFailure] = Field(
        default_factory=list,
        description="Group versions discovery could not read (an aggregated API down answers 503): code and message.",
    )
    states: list[StorageState]
    migrations: list[StorageVersionMigration]
    crds: list[CrdObservation]
    reporters: list[ReporterHash] = Field(default_factory=list, description="What each API server encodes in.")
    agreement_source: AgreementSource = "discovery"
    api_servers: list[str] = Field(default_factory=list, description="The reporters heard (IDs or URLs).")
    unheard: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "API server -> why it was not heard. Its entry ages, which blocks new migrations "
            "until it reports again or is collected after 3 periods (seed 000)."
        ),
    )

    in_tree: list[InTreeMigration] = Field(
        default_factory=list,
        description=(
            "Issue 36: the storagemigration.k8s.io migrations anyone made (kubectl, Gardener, a "
            "provider's tooling), read in in_tree_version; empty where the API is not served."
        ),
    )
    in_tree_version: str | None = Field(
        default=None, description="The version of storagemigration.k8s.io read (v1 where served, else v1beta1)."
    )

    @property
    def failed_group_versions(self) -> list[str]:
        """The group versions discovery could not read: their resources are left for the next poll."""
        return [f.group_version for f in self.discovery_failures]


def ours(migration: InTreeMigration) -> bool:
    """An in-tree migration one of our requests made (the in-tree engine, issue 36): our request is its
    record (ledger, events, refinement), so detection does not count it a second time as someone else's."""
    return migration.labels.get(MANAGED_BY_LABEL) == MANAGED_BY


def observe_cluster(
    api: ApiClient, settings: Settings, *, connect: Callable[[str], ApiClient] | None = None
) -> Observations:
    """Discovery, CRDs, what each API server encodes, StorageStates, migrations (ours and in-tree ones).

    ``connect(server)`` gives a client of one API server with ``api``'s credentials
    (see ``observe_agreement``; tasks pass one that honours a Prefect block)."""
    found = discover(api, timeout=settings.request_timeout_seconds)
    crds = read_crds(api)
    agreement = observe_agreement(api, settings, found.resources, connect=connect)
    version = in_tree_version(found.resources)
    in_tree: list[InTreeMigration] = []
    if version is not None:
        # Served since discovery read it, else nothing: a group that is not served is no error.
        with contextlib.suppress(NotFound):
            in_tree = [m for m in list_in_tree(api, version, timeout=settings.request_timeout_seconds) if not ours(m)]
    return Observations(
        discovered=found.resources,
        discovery_failures=list(found.failed),
        states=list_states(api),
        migrations=list_migrations(api),
        crds=crds,
        reporters=agreement.reporters,
        agreement_source=agreement.source,
        api_servers=agreement.servers,
        unheard=agreement.unheard,
        in_tree=in_tree,
        in_tree_version=version,
    )
