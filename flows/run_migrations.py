"""`run-migrations`: run every pending StorageVersionMigration, whoever created it.

Reads like seed 002's controller loop: list the requests, pick what may run now
(a pure plan: resumed ones first, then oldest; one at a time per resource, as
seed 003 asks; at most `max_parallel` resources at once), run each as its own
`migrate-resource` flow run, and when one ends, look again. Deployed, each
migration is a run of the `migrate-resource` deployment, so workers on several
machines share the work; called directly, each is a subflow in this process.

A worker that dies (killed, its machine gone) leaves its flow runs Running (or
Pending) in Prefect for ever, and a dispatcher waiting on them would wait for
ever (issue 14). So the dispatcher looks again every `check_seconds`: a
migration whose run a worker took longer than the lease ago, without a
checkpoint since (`presumed_dead`), gets that run marked Crashed, with the reason, and is
resumed from its checkpoint by the next round, on whichever worker is alive (a run
still shown a lease after its request finished was killed while wrapping up: it is
only marked);
once per request and dispatcher run, so a run that dies again waits for the
next dispatcher. Before resuming a request it did not start, the dispatcher
marks the dead runs it finds for it (by their `migration:<name>` tag) the same
way, so that the history does not show them Running.

Issue 37: which requests a live run holds is their writer Leases' (`read-writer-leases`,
`write_budget.holders`), read each round with the requests: a Running request whose Lease
has expired (its run died, whatever Prefect shows of it) is resumed at once, one whose Lease
is live is never started beside its holder.

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
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.runtime import deployment
from prefect.states import Crashed
from pydantic import BaseModel, Field

from flows.cluster_scope import cluster_settings, entered_cluster, run_for_cluster
from flows.events import delivered_events
from flows.migrate_resource import migrate_resource
from flows.polling import poll
from flows.run_logs import our_logs_in_the_run
from storage_migrator.conditions import is_condition_true
from storage_migrator.fleet.names import cluster_tag, scoped_key
from storage_migrator.migration.dispatch import (
    PRESUMED_DEAD,
    RUNNING_ELSEWHERE,
    DispatchPlan,
    is_finished,
    migration_resource,
    plan_dispatch,
    presumed_dead,
)
from storage_migrator.migration.write_budget import holders
from storage_migrator.models import CONDITION_RUNNING, MIGRATIONS_KIND_NAME, StorageVersionMigration
from storage_migrator.settings import Settings
from tasks.dispatching import read_migrations, read_writer_leases


class DispatchSummary(BaseModel):
    """Which requests this run started, and how each ended (by name)."""

    outcomes: dict[str, str] = Field(default_factory=dict)
    waiting: dict[str, str] = Field(default_factory=dict, description="Pending requests left, with the reason.")
    polled: list[str] | None = Field(
        default=None, description="What the detection poll at the end changed; None when it did not run or failed."
    )


@dataclass
class _Child:
    """A migration this dispatcher started; `flow_run` once its deployment run exists."""

    name: str
    resource: str
    flow_run: UUID | None = None


def _run_one(child: _Child, overrides: dict[str, Any], cluster: str | None, deployed: bool,
             poll_seconds: float) -> str:  # fmt: skip
    """Run one migration to its end, on the cluster's migrate-resource deployment; the name of its final state."""
    if not deployed:
        return str(migrate_resource(migration=child.name, cluster=cluster, return_state=True, **overrides).name)
    run = run_for_cluster("migrate-resource", cluster, {"migration": child.name, **overrides}, timeout=0,
                          as_subflow=True)  # fmt: skip
    child.flow_run = run.id
    while True:  # what run_deployment(timeout=None) does, but the dispatcher may end it (_reap)
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(run.id).state
        if state is not None and state.is_final():
            return str(state.name)
        time.sleep(poll_seconds)


def _dead_message(migration: StorageVersionMigration, state: str, lease_seconds: float) -> str:
    name = f"{MIGRATIONS_KIND_NAME}/{migration.metadata.name}"
    if is_finished(migration):
        return (f"{name} finished, and this run still showed {state}, longer than lease_seconds ({lease_seconds:g} s) "
                f"ago: {PRESUMED_DEAD} (its worker stopped or was killed while it wrapped up); the "
                "request's verdict stands")  # fmt: skip
    return (f"{name} had no checkpoint, and this run showed {state}, for longer than "
            f"lease_seconds ({lease_seconds:g} s): {PRESUMED_DEAD} (its worker stopped or was "
            "killed); run-migrations resumes the request from its checkpoint")  # fmt: skip


def _crash_dead_runs(
    migrations: dict[str, StorageVersionMigration],
    runs: dict[str, list[FlowRun]],
    *,
    lease_seconds: float,
    held: Collection[str] | None,
) -> list[str]:
    """Mark Crashed every flow run in `runs` (by request name) that `presumed_dead` judges dead;
    the names of the requests whose run was marked."""
    logger = get_run_logger()
    now = datetime.now(UTC)
    crashed = []
    with get_client(sync_client=True) as client:
        for name, candidates in runs.items():
            for run in candidates:
                state = run.state
                claimed = state.timestamp if state is not None and (state.is_running() or state.is_pending()) else None
                migration = migrations.get(name)
                lease = None if held is None else name in held
                if state is None or migration is None or not presumed_dead(migration, claimed_at=claimed, now=now,
                                                                           lease_seconds=lease_seconds,
                                                                           held=lease):  # fmt: skip
                    continue
                message = _dead_message(migration, str(state.name), lease_seconds)
                logger.warning("flow run %s (%s): %s", run.name, run.id, message)
                client.set_flow_run_state(run.id, Crashed(message=message), force=True)
                crashed.append(name)
    return crashed


def _reap(children: list[_Child], migrations: list[StorageVersionMigration], lease_seconds: float,
          held: Collection[str] | None) -> list[str]:  # fmt: skip
    """Our own runs that died (their worker with them): marked Crashed, so their waits end."""
    ids = {c.flow_run: c.name for c in children if c.flow_run is not None}
    if not ids:
        return []
    try:
        with get_client(sync_client=True) as client:
            runs: dict[str, list[FlowRun]] = {}
            for run_id, name in ids.items():
                runs.setdefault(name, []).append(client.read_flow_run(run_id))
        return _crash_dead_runs({m.metadata.name or "": m for m in migrations}, runs, lease_seconds=lease_seconds,
                                held=held)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - judged again next round
        get_run_logger().warning("could not check the migrations' flow runs (%s: %s)", type(exc).__name__, exc)
        return []


def _crash_orphans(migration: StorageVersionMigration, lease_seconds: float, cluster: str | None,
                   held: Collection[str] | None) -> None:  # fmt: skip
    """Before resuming a request someone else started: its dead runs (tags `migration:<name>` and
    `cluster:<cluster>`: two clusters' requests may share a name) marked Crashed."""
    name = migration.metadata.name or ""
    if not is_condition_true(migration.status.conditions, CONDITION_RUNNING):
        return
    try:
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[f"migration:{name}", cluster_tag(cluster)]),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PENDING, StateType.RUNNING])),
            ))  # fmt: skip
        _crash_dead_runs({name: migration}, {name: list(runs)}, lease_seconds=lease_seconds, held=held)
    except Exception as exc:  # noqa: BLE001 - the history only; the resume goes on
        get_run_logger().warning("could not mark the dead runs of %s (%s: %s)", name, type(exc).__name__, exc)


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


def _held(settings: Settings) -> dict[str, str] | None:
    """Issue 37: the requests whose writer Lease is live, and its holder (None: the Leases could not
    be read, and the Running conditions' leases judge as before)."""
    try:
        leases = read_writer_leases(settings)
    except Exception as exc:  # noqa: BLE001 - judged again next round
        get_run_logger().warning("could not read the writer Leases in %s (%s: %s): the requests' Running conditions "
                                 "judge which are held this round", settings.namespace, type(exc).__name__, exc)  # fmt: skip
        return None
    return holders(leases, now=datetime.now(UTC))


def _plan_round(
    settings: Settings,
    pending: list[StorageVersionMigration],
    *,
    active: set[str],
    only: Collection[str] | None,
    held: dict[str, str] | None,
) -> DispatchPlan:
    """`plan_dispatch` over the requests not yet started by this run (`only`: of those named)."""
    now = datetime.now(UTC)
    if only is not None:
        # Others' live runs keep their resources busy; others' pending requests are not ours to run.
        live = {w.name for w in plan_dispatch(pending, now=now, max_parallel=settings.max_parallel_migrations,
                                              lease_seconds=settings.lease_seconds, held=held).waiting
                if w.reason == RUNNING_ELSEWHERE}  # fmt: skip
        pending = [m for m in pending if m.metadata.name in only or m.metadata.name in live]
    return plan_dispatch(pending, now=now, max_parallel=settings.max_parallel_migrations,
                         lease_seconds=settings.lease_seconds, active=active, held=held)  # fmt: skip


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
    While runs go on, the requests are read again every `check_seconds` (a
    quarter of the lease, at least `wait_seconds`): dead runs are reaped and
    resumed, new requests started.
    """
    logger = get_run_logger()
    summary = DispatchSummary()
    attempted: set[str] = set()
    resumed: set[str] = set()
    running: dict[Future[str], _Child] = {}
    check_seconds = max(wait_seconds, settings.lease_seconds / 4)
    with ThreadPoolExecutor(max_workers=settings.max_parallel_migrations, thread_name_prefix="migration") as pool:
        while True:
            migrations = read_migrations(settings)
            held = _held(settings)
            # A request is started at most once per dispatcher run: one that is still
            # pending after its run (crashed, cancelled) waits for the next dispatcher;
            # but a run that died with its worker is resumed once at once.
            for name in _reap(list(running.values()), migrations, settings.lease_seconds, held):
                if name not in resumed:
                    resumed.add(name)
                    attempted.discard(name)
            pending = [m for m in migrations if m.metadata.name not in attempted]
            plan = _plan_round(settings, pending, active={c.resource for c in running.values()}, only=only, held=held)
            by_name = {m.metadata.name: m for m in pending}
            for name in plan.start:
                attempted.add(name)
                child = _Child(name=name, resource=migration_resource(by_name[name]))
                if deployed and name not in resumed:
                    _crash_orphans(by_name[name], settings.lease_seconds, settings.cluster, held)
                logger.info("starting %s (%s)", name, child.resource)
                ctx = contextvars.copy_context()  # keeps the subflow under this flow run
                future = pool.submit(ctx.run, _run_one, child, overrides, settings.cluster, deployed,
                                     wait_seconds)  # fmt: skip
                running[future] = child
            summary.waiting = {w.name: w.reason for w in plan.waiting}
            if not running:
                blocked = [n for n in summary.waiting if only is not None and n in only]
                if not blocked:
                    break
                logger.info("waiting for %s: %s", ", ".join(blocked), summary.waiting[blocked[0]])
                time.sleep(wait_seconds)
                continue
            done, _ = wait(list(running), timeout=check_seconds, return_when=FIRST_COMPLETED)
            for future in done:
                child = running.pop(future)
                try:
                    summary.outcomes[child.name] = future.result()
                except Exception as exc:  # noqa: BLE001 - one migration's crash must not stop the others
                    summary.outcomes[child.name] = f"Crashed: {type(exc).__name__}: {exc}"
                logger.info("%s (%s): %s", child.name, child.resource, summary.outcomes[child.name])
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
    cluster: str | None = None,
) -> DispatchSummary:
    """Run every pending request of `cluster` (a KubernetesClusterConfig block; left out: the
    environment's cluster, issue 20) as a migrate-resource run for the same cluster."""
    overrides = run_overrides(chunk_size=chunk_size, write_rate_per_second=write_rate_per_second,
                              write_concurrency=write_concurrency, kubeconfig=kubeconfig, context=context)  # fmt: skip
    settings = cluster_settings(cluster, max_parallel_migrations=max_parallel, lease_seconds=lease_seconds,
                                **overrides)  # fmt: skip
    # Issue 12: an ephemeral run ends once its events are stored; our threads' warnings reach its log.
    with delivered_events(), our_logs_in_the_run(), entered_cluster(settings):
        summary = dispatch_requests(settings, overrides, deployed=deployment.id is not None)
        if "Completed" in summary.outcomes.values():
            summary.polled = _refine(settings)
    rows = [{"migration": n, "outcome": o} for n, o in summary.outcomes.items()]
    rows += [{"migration": n, "outcome": f"waiting: {r}"} for n, r in summary.waiting.items()]
    if rows:
        create_table_artifact(
            table=rows, key=scoped_key("run-migrations", cluster), description="Migrations started by this run"
        )
    return summary
