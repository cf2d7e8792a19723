"""`initialize`: the first look at every persisted resource, taken as a detection poll takes it.

Issue 24: one path for the first look at a resource. The run is one detection
poll over every resource the include / exclude lists select (seed 000's rules,
the planner `plan_poll`, applied by the poll's own task): a resource with no
StorageState gets one, with the hashes the API servers report and persisted
`[Unknown]`, and then a migration request (label `requested-by=initialize`),
so that the migration starts after the state recorded its hash and its success
refines the state. A resource the API servers disagree on gets its state and
no request until they agree (seed 000, HA); one already migrated gets nothing.
Requesting migrations without states, as seed 002's alpha initializer does,
made the next poll request every migration again.

The report is seed 002's "Alpha workflow": built-in resources from discovery,
custom ones from CRDs, aggregated ones from APIServices with a service (the
origin of each request); sub-resources, resources with no storageVersionHash,
resources that cannot be listed or rewritten, and the second of each pair
that shares storage are skipped, and the run says which and why. Then it
starts `run-migrations` (unless told not to). A group version that discovery
could not read (an aggregated API server down) does not stop the rest: the
run requests everything else and then ends Failed, naming it.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.client.schemas.objects import State
from prefect.runtime import deployment
from prefect.states import Failed
from pydantic import BaseModel, Field

from flows.cluster_scope import cluster_settings, entered_cluster, run_for_cluster
from flows.events import delivered_events
from flows.polling import PollSummary, carry_out, look
from flows.run_logs import our_logs_in_the_run
from flows.run_migrations import run_migrations
from storage_migrator.detection.actions import INITIALIZE_REQUESTER
from storage_migrator.detection.initializer import InitPlan, SkippedResource, plan_initialization
from storage_migrator.fleet.names import scoped_key
from tasks.dispatching import read_apiservices


class InitializeSummary(BaseModel):
    """What the first look requested, what it left out and why, and what its poll applied."""

    created: list[str] = Field(description="The StorageVersionMigrations requested, by name.")
    skipped: list[SkippedResource] = Field(description="Every group-resource nothing was requested for, and why.")
    poll: PollSummary = Field(description="The detection poll initialize ran: StorageStates written, requests made.")


@flow(name="initialize", persist_result=False, log_prints=False)
def initialize(
    start_migrations: bool = True,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
    cluster: str | None = None,
) -> InitializeSummary | State[Any]:
    """A detection poll over every selected resource that requests what it must, then runs it.

    `include` / `exclude` override STORAGE_MIGRATOR_INCLUDE_RESOURCES / _EXCLUDE_RESOURCES
    for this run only: the scheduled polls follow the settings. `cluster` names a
    KubernetesClusterConfig block (issue 20; left out: the environment's cluster)."""
    settings = cluster_settings(cluster, include_resources=include, exclude_resources=exclude,
                                kubeconfig=kubeconfig, context=context)  # fmt: skip
    # Issue 12: an ephemeral run ends once its events are stored; our threads' warnings reach its log.
    with delivered_events(), our_logs_in_the_run(), entered_cluster(settings):
        began, clock = datetime.now(UTC), time.monotonic()
        seen = look(settings)
        first = plan_initialization(seen, settings=settings, apiservices=read_apiservices(settings),
                                    now=datetime.now(UTC))  # fmt: skip
        # The detection poll's apply: each StorageState is written before its request (seed 000).
        polled = carry_out(settings, seen, first.plan, began=began, clock=clock, requested_by=INITIALIZE_REQUESTER)
        created = _report(first, polled, cluster)
        if start_migrations and polled.runnable:
            if deployment.id is not None:
                run_for_cluster("run-migrations", cluster, {}, timeout=0, as_subflow=False)
            else:
                run_migrations(kubeconfig=kubeconfig, context=context, cluster=cluster)
    if polled.applied.denied:
        # Issue 14: a permission RBAC denies is no race a later run wins: fail, naming it and the fix.
        return Failed(message="; ".join(polled.applied.denied))
    if not first.complete:
        return Failed(
            message=f"requested {len(created)} migrations, but discovery missed: " + "; ".join(first.unreachable)
        )
    return InitializeSummary(created=created, skipped=first.skipped, poll=polled)


def _report(first: InitPlan, polled: PollSummary, cluster: str | None) -> list[str]:
    """Log and tabulate, per group-resource, what was requested or why not; the names requested."""
    logger = get_run_logger()
    names = {r.group_resource: r.migration for r in polled.applied.changes.requested}
    created = [names[r.group_resource] for r in first.requests if r.group_resource in names]
    rows = []
    for request in first.requests:
        name = names.get(request.group_resource)
        decision = f"requested {name}" if name else "request failed: see the detect-storage-changes table"
        logger.info("%s (%s, %s): %s", request.group_resource, request.version, request.origin, decision)
        rows.append({"resource": request.group_resource, "version": request.version, "origin": request.origin,
                     "decision": decision})  # fmt: skip
    for skipped in first.skipped:
        logger.info("no request for %s: %s", skipped.group_resource, skipped.reason)
        rows.append({"resource": skipped.group_resource, "version": "", "origin": "",
                     "decision": f"no request: {skipped.reason}"})  # fmt: skip
    for missed in first.unreachable:
        logger.error("not seen: %s", missed)
        rows.append({"resource": missed.split(":", 1)[0], "version": "", "origin": "",
                     "decision": f"unreachable: {missed}"})  # fmt: skip
    create_table_artifact(
        table=rows, key=scoped_key("initialize", cluster), description="What initialize requested, and why not"
    )
    return created
