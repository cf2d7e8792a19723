"""`run-migrations`: run every pending StorageVersionMigration, whoever created it.

Reads like seed 002's controller loop: list the requests, pick what may run now
(a pure plan: resumed ones first, then oldest; one at a time per resource, as
seed 003 asks; at most `max_parallel` resources at once), run each as its own
`migrate-resource` flow run, and when one ends, look again. Deployed, each
migration is a run of the `migrate-resource` deployment, so workers on several
machines share the work; called directly, each is a subflow in this process.

When one of them succeeded, the run ends with one detection poll (issue 10), so
the StorageState of a migrated resource is refined at once instead of at the
next scheduled poll. The poll starts nothing, and its failure is only a warning:
the next scheduled poll does the same.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Collection
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from typing import Any, cast

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.runtime import deployment
from pydantic import BaseModel, Field

from flows.events import delivered_events
from flows.migrate_resource import migrate_resource
from flows.polling import poll
from storage_migrator.dispatch import RUNNING_ELSEWHERE, migration_resource, plan_dispatch
from storage_migrator.settings import Settings
from tasks.dispatching import read_migrations

MIGRATE_DEPLOYMENT = "migrate-resource/migrate-resource"


class DispatchSummary(BaseModel):
    """Which requests this run started, and how each ended (by name)."""

    outcomes: dict[str, str] = Field(default_factory=dict)
    waiting: dict[str, str] = Field(default_factory=dict, description="Pending requests left, with the reason.")
    polled: list[str] | None = Field(
        default=None, description="What the detection poll at the end changed; None when it did not run or failed."
    )


def _run_one(name: str, overrides: dict[str, Any], deployed: bool) -> str:
    if deployed:
        run = cast(FlowRun, run_deployment(MIGRATE_DEPLOYMENT, parameters={"migration": name, **overrides},
                                           timeout=None, as_subflow=True))  # fmt: skip
        return str(run.state.name) if run.state else "Unknown"
    state = migrate_resource(migration=name, return_state=True, **overrides)
    return str(state.name)


def run_overrides(**values: Any) -> dict[str, Any]:
    """The parameters given to a flow that each migrate-resource run it starts takes on
    (None: not given, the worker's settings apply)."""
    return {k: v for k, v in values.items() if v is not None}


def _refine(settings: Settings) -> list[str] | None:
    """One detection poll, so migrations that just succeeded refine their StorageState now."""
    logger = get_run_logger()
    try:
        polled = poll(settings)
    except Exception as exc:  # noqa: BLE001 - the migrations are done; the next scheduled poll refines them
        logger.warning("the detection poll after the migrations failed (%s: %s): the next scheduled poll "
                       "refines their StorageStates", type(exc).__name__, exc)  # fmt: skip
        return None
    for error in polled.applied.errors:
        logger.warning("detection poll after the migrations: %s", error)
    logger.info("detection poll after the migrations: %s", "; ".join(polled.applied.done) or "nothing to change")
    return polled.applied.done


def dispatch_requests(
    settings: Settings,
    overrides: dict[str, Any],
    *,
    deployed: bool,
    only: Collection[str] | None = None,
    wait_seconds: float = 5.0,
) -> DispatchSummary:
    """Run pending requests as `plan_dispatch` orders them, each as a `migrate-resource` run.

    `only` restricts the runs to the requests named (rotate-encryption-key); a
    request of another resource's live run still holds its resource, and the
    named ones it holds are waited for (every `wait_seconds`) rather than left.
    """
    logger = get_run_logger()
    summary = DispatchSummary()
    attempted: set[str] = set()
    running: dict[Future[str], tuple[str, str]] = {}
    with ThreadPoolExecutor(max_workers=settings.max_parallel_migrations, thread_name_prefix="migration") as pool:
        while True:
            # A request is started at most once per dispatcher run: one that is still
            # pending after its run (crashed, cancelled) waits for the next dispatcher.
            pending = [m for m in read_migrations(settings) if m.metadata.name not in attempted]
            now = datetime.now(UTC)
            active = {res for _, res in running.values()}
            if only is not None:
                # Others' live runs keep their resources busy; others' pending requests are not ours to run.
                live = {w.name for w in plan_dispatch(pending, now=now, max_parallel=settings.max_parallel_migrations,
                                                      lease_seconds=settings.lease_seconds).waiting
                        if w.reason == RUNNING_ELSEWHERE}  # fmt: skip
                pending = [m for m in pending if m.metadata.name in only or m.metadata.name in live]
            plan = plan_dispatch(
                pending, now=now, max_parallel=settings.max_parallel_migrations,
                lease_seconds=settings.lease_seconds, active=active,
            )  # fmt: skip
            by_name = {m.metadata.name: m for m in pending}
            for name in plan.start:
                attempted.add(name)
                resource = migration_resource(by_name[name])
                logger.info("starting %s (%s)", name, resource)
                ctx = contextvars.copy_context()  # keeps the subflow under this flow run
                running[pool.submit(ctx.run, _run_one, name, overrides, deployed)] = (name, resource)
            summary.waiting = {w.name: w.reason for w in plan.waiting}
            if not running:
                blocked = [n for n in summary.waiting if only is not None and n in only]
                if not blocked:
                    break
                logger.info("waiting for %s: %s", ", ".join(blocked), summary.waiting[blocked[0]])
                time.sleep(wait_seconds)
                continue
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in done:
                name, resource = running.pop(future)
                try:
                    summary.outcomes[name] = future.result()
                except Exception as exc:  # noqa: BLE001 - one migration's crash must not stop the others
                    summary.outcomes[name] = f"Crashed: {type(exc).__name__}: {exc}"
                logger.info("%s (%s): %s", name, resource, summary.outcomes[name])
    return summary


@flow(name="run-migrations", persist_result=False, log_prints=False)
def run_migrations(
    max_parallel: int | None = None,
    lease_seconds: float | None = None,
    chunk_size: int | None = None,
    write_rate_per_second: float | None = None,
    write_concurrency: int | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
) -> DispatchSummary:
    overrides = run_overrides(chunk_size=chunk_size, write_rate_per_second=write_rate_per_second,
                              write_concurrency=write_concurrency, kubeconfig=kubeconfig, context=context)  # fmt: skip
    settings = Settings.with_overrides(max_parallel_migrations=max_parallel, lease_seconds=lease_seconds, **overrides)
    with delivered_events():  # issue 12 item 5: an ephemeral run ends once its events are stored
        summary = dispatch_requests(settings, overrides, deployed=deployment.id is not None)
        if "Completed" in summary.outcomes.values():
            summary.polled = _refine(settings)
    rows = [{"migration": n, "outcome": o} for n, o in summary.outcomes.items()]
    rows += [{"migration": n, "outcome": f"waiting: {r}"} for n, r in summary.waiting.items()]
    if rows:
        create_table_artifact(table=rows, key="run-migrations", description="Migrations started by this run")
    return summary
