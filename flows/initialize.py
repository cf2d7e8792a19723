"""`initialize`: request a migration of every persisted resource (seed 002, "Alpha workflow").

Built-in resources from discovery, custom ones from CRDs, aggregated ones from
APIServices with a service; sub-resources, resources with no
storageVersionHash, resources that cannot be listed or rewritten, and the
second of each pair that shares storage are skipped, and the run says which and
why. Then it starts `run-migrations` (unless told not to). A group version that
discovery could not read (an aggregated API server down) does not stop the
rest: the run requests everything else and then ends Failed, naming it.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.client.schemas.objects import State
from prefect.deployments import run_deployment
from prefect.runtime import deployment
from prefect.states import Failed
from pydantic import BaseModel

from flows.run_migrations import run_migrations
from storage_migrator.initializer import SkippedResource
from storage_migrator.settings import Settings
from tasks.dispatching import create_requests, plan_initial_requests

RUN_MIGRATIONS_DEPLOYMENT = "run-migrations/run-migrations"


class InitializeSummary(BaseModel):
    created: list[str]
    skipped: list[SkippedResource]


@flow(name="initialize", persist_result=False, log_prints=False)
def initialize(
    start_migrations: bool = True,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
) -> InitializeSummary | State[Any]:
    logger = get_run_logger()
    settings = Settings.with_overrides(kubeconfig=kubeconfig, context=context)
    plan = plan_initial_requests(
        settings,
        include=include if include is not None else settings.include_resources,
        exclude=exclude if exclude is not None else settings.exclude_resources,
    )
    created = create_requests(settings, plan.requests)
    for request, name in zip(plan.requests, created, strict=True):
        logger.info("requested %s (%s, %s): %s", request.group_resource, request.version, request.origin, name)
    for skipped in plan.skipped:
        logger.info("skipped %s: %s", skipped.group_resource, skipped.reason)
    for missed in plan.unreachable:
        logger.error("not seen: %s", missed)
    rows = [{"resource": r.group_resource, "version": r.version, "origin": r.origin, "decision": f"requested {n}"}
            for r, n in zip(plan.requests, created, strict=True)]  # fmt: skip
    rows += [{"resource": s.group_resource, "version": "", "origin": "", "decision": f"skipped: {s.reason}"}
             for s in plan.skipped]  # fmt: skip
    rows += [{"resource": m.split(":", 1)[0], "version": "", "origin": "", "decision": f"unreachable: {m}"}
             for m in plan.unreachable]  # fmt: skip
    create_table_artifact(table=rows, key="initialize", description="What initialize requested and skipped")
    if start_migrations and created:
        if deployment.id is not None:
            run_deployment(RUN_MIGRATIONS_DEPLOYMENT, timeout=0, as_subflow=False)
        else:
            run_migrations(kubeconfig=kubeconfig, context=context)
    if not plan.complete:
        return Failed(
            message=f"requested {len(created)} migrations, but discovery missed: " + "; ".join(plan.unreachable)
        )
    return InitializeSummary(created=created, skipped=plan.skipped)
