"""``storage-migrator fleet add|list|remove NAME``: a cluster's deployments on the shared Prefect server (issue 20).

Issue 20 item 3: "Adding a cluster means one block plus one command"; issue 30: in pull
mode (the default when there is no block) no block at all, the copies on a pool of the
cluster's own that only its worker serves. The
templates are the project's deployments (`prefect deploy --all`: `flow/flow`);
``fleet add`` copies each to `flow/NAME` (storage_migrator/fleet/deployments.py
says what a copy is) through the Prefect client, whose upsert makes it safe to
run again, after each upgrade of the templates. Prefect is imported inside the
functions: it takes seconds to import, and the other commands never need it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, NoReturn
from uuid import UUID

import typer

from storage_migrator.cli.options import EngineOption
from storage_migrator.cli.output import Output, OutputFormat, emit, render_table
from storage_migrator.cli.prefect_api import prefect_client
from storage_migrator.fleet.deployments import (
    FLEET_FLOWS,
    DeploymentSpec,
    ScheduleSpec,
    cluster_of,
    default_pool,
    engine_of,
    for_cluster,
    keeping_pauses,
    mode_of,
)
from storage_migrator.fleet.names import DEFAULT_CLUSTER, cluster_tag, deployment_name, identity_variable

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.responses import DeploymentResponse

__all__ = ["app"]

#: prefect-kubernetes' KubernetesClusterConfig, as the Prefect API names its block type.
BLOCK_TYPE = "kubernetes-cluster-config"

app = typer.Typer(
    name="fleet",
    help="A cluster's deployments on a shared Prefect server: a worker of its own (pull mode), or its KubernetesClusterConfig block (push mode).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

Cluster = Annotated[str, typer.Argument(metavar="NAME", help="the cluster's name (push mode: its KubernetesClusterConfig block's)")]  # fmt: skip
Pool = Annotated[str | None, typer.Option("--pool", help="pull mode: the work pool of the cluster's own worker (default, with no block NAME: storage-migrator-NAME)")]  # fmt: skip
Queue = Annotated[str | None, typer.Option("--queue", help="pull mode: a queue of the pool (default: the pool's default queue)")]  # fmt: skip
Uid = Annotated[str | None, typer.Option("--uid", metavar="UID", help="the cluster's identity, read by you from the cluster (kubectl get namespace kube-system -o jsonpath='{.metadata.uid}'): recorded now, so that its first run cannot record another cluster's")]  # fmt: skip
Engine = Annotated[EngineOption | None, typer.Option("--engine", help="issue 36: the engine of the cluster's migrations (client, in-tree, auto); push mode: its migrate-resource copy runs with it; pull mode: the cluster's install decides (STORAGE_MIGRATOR_ENGINE in its ConfigMap storage-migrator-cluster) and runs refuse another; default: the one given before, else the workers' setting")]  # fmt: skip


def _fail(message: str) -> NoReturn:
    print(f"storage-migrator: {message}", file=sys.stderr)
    raise typer.Exit(1)


def _checked(name: str) -> str:
    """A usage error (exit 2) for `default` (its deployments are the templates) or a name no block can have."""
    try:
        deployment_name(FLEET_FLOWS[0], name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="NAME") from exc
    if name == DEFAULT_CLUSTER:
        raise typer.BadParameter(f"{DEFAULT_CLUSTER!r} is the environment's cluster: its deployments are the "
                                 "templates themselves (flow/flow)", param_hint="NAME")  # fmt: skip
    return name


def _api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    return str(PREFECT_API_URL.value() or "")


@contextmanager
def _prefect() -> Iterator[SyncPrefectClient]:
    """A client of the server PREFECT_API_URL names; an unreachable or failing server is exit 1, named.

    Never Prefect's ephemeral server (what the client starts with no URL): a fleet lives on a shared one.
    """
    import httpx

    if not _api_url():
        _fail("PREFECT_API_URL is not set: point it at the Prefect server the workers use "
              "(export PREFECT_API_URL=http://HOST:4200/api)")  # fmt: skip
    try:
        with prefect_client() as client:  # a 401: PrefectApiError, which names the setting (issue 30)
            yield client
    except httpx.HTTPError as exc:
        _fail(f"the Prefect API at {_api_url()} failed: {exc}")


def _block_exists(client: SyncPrefectClient, name: str) -> bool:
    from prefect.exceptions import ObjectNotFound

    try:
        client.read_block_document_by_name(name, block_type_slug=BLOCK_TYPE, include_secrets=False)
    except ObjectNotFound:  # no such block, or prefect-kubernetes' block type was never registered here
        return False
    return True


def _block_names(client: SyncPrefectClient) -> set[str]:
    """Every KubernetesClusterConfig block's name; none when prefect-kubernetes' block type was never registered."""
    import httpx

    try:
        return {b.name for b in client.read_block_documents_by_type(BLOCK_TYPE, include_secrets=False) if b.name}
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code == 404:
            return set()
        raise


def _spec(deployment: DeploymentResponse, flow_name: str) -> DeploymentSpec:
    limit, options = deployment.global_concurrency_limit, deployment.concurrency_options
    return DeploymentSpec(
        flow_id=str(deployment.flow_id), flow_name=flow_name, name=deployment.name,
        description=deployment.description, version=deployment.version,
        version_info=deployment.version_info.model_dump(mode="json") if deployment.version_info else None,
        entrypoint=deployment.entrypoint, path=deployment.path, pull_steps=deployment.pull_steps,
        storage_document_id=str(deployment.storage_document_id) if deployment.storage_document_id else None,
        infrastructure_document_id=(str(deployment.infrastructure_document_id)
                                    if deployment.infrastructure_document_id else None),
        work_pool_name=deployment.work_pool_name, work_queue_name=deployment.work_queue_name,
        job_variables=deployment.job_variables, parameters=deployment.parameters,
        parameter_openapi_schema=deployment.parameter_openapi_schema,
        enforce_parameter_schema=deployment.enforce_parameter_schema, tags=deployment.tags,
        concurrency_limit=limit.limit if limit else None,
        collision_strategy=options.collision_strategy.value if options else None,
        grace_period_seconds=options.grace_period_seconds if options else None,
        schedules=[ScheduleSpec(schedule=s.schedule.model_dump(mode="json"), active=s.active,
                                max_scheduled_runs=s.max_scheduled_runs, parameters=s.parameters, slug=s.slug)
                   for s in deployment.schedules],
    )  # fmt: skip


def _templates(client: SyncPrefectClient) -> tuple[list[DeploymentSpec], list[str]]:
    """The project's deployments `flow/flow`, and the names of those missing."""
    from prefect.exceptions import ObjectNotFound

    found, missing = [], []
    for flow in FLEET_FLOWS:
        name = deployment_name(flow, None)
        try:
            found.append(_spec(client.read_deployment_by_name(name), flow))
        except ObjectNotFound:
            missing.append(name)
    return found, missing


def _upsert(client: SyncPrefectClient, spec: DeploymentSpec) -> tuple[DeploymentSpec, str]:
    """Create or update the deployment `spec` names (Prefect upserts by flow and name): what was written, and
    'created' or 'updated'."""
    from uuid import UUID

    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.objects import ConcurrencyLimitStrategy, ConcurrencyOptions, VersionInfo
    from prefect.exceptions import ObjectNotFound

    try:
        existing = client.read_deployment_by_name(spec.full_name)
    except ObjectNotFound:
        existing = None
    if existing is not None:
        spec = keeping_pauses(spec, [ScheduleSpec(schedule=s.schedule.model_dump(mode="json"), active=s.active,
                                                  slug=s.slug) for s in existing.schedules])  # fmt: skip
    options = (ConcurrencyOptions(collision_strategy=ConcurrencyLimitStrategy(spec.collision_strategy),
                                  grace_period_seconds=spec.grace_period_seconds)
               if spec.collision_strategy else None)  # fmt: skip
    deployment_id = client.create_deployment(
        flow_id=UUID(spec.flow_id), name=spec.name, version=spec.version,
        version_info=VersionInfo.model_validate(spec.version_info) if spec.version_info else None,
        schedules=[DeploymentScheduleCreate.model_validate(s.model_dump()) for s in spec.schedules],
        concurrency_limit=spec.concurrency_limit, concurrency_options=options,
        parameters=spec.parameters, description=spec.description, work_queue_name=spec.work_queue_name,
        work_pool_name=spec.work_pool_name, tags=spec.tags,
        storage_document_id=UUID(spec.storage_document_id) if spec.storage_document_id else None,
        infrastructure_document_id=(UUID(spec.infrastructure_document_id)
                                    if spec.infrastructure_document_id else None),
        path=spec.path, entrypoint=spec.entrypoint, parameter_openapi_schema=spec.parameter_openapi_schema,
        # No `paused`: a new copy runs, an existing one keeps its own pause, and pausing a template
        # (the default cluster's deployment) pauses no other cluster.
        pull_steps=spec.pull_steps, enforce_parameter_schema=spec.enforce_parameter_schema,
        job_variables=spec.job_variables,
    )  # fmt: skip
    # The queue the server chose (a pull-mode pool's default queue, when --queue was not given).
    spec = spec.model_copy(update={"work_queue_name": client.read_deployment(deployment_id).work_queue_name})
    return spec, "created" if existing is None else "updated"


def _schedule_text(schedules: list[dict[str, Any]]) -> str:
    def one(s: dict[str, Any]) -> str:
        rule = s["schedule"]
        when = (f"every {rule['interval']:g}s" if "interval" in rule else f"cron {rule['cron']}" if "cron" in rule
                else f"rrule {rule.get('rrule')}")  # fmt: skip
        return when if s["active"] else f"{when} (paused)"

    return ", ".join(one(s) for s in schedules) or "-"


def _ensure_pool(client: SyncPrefectClient, pool: str, like: str | None) -> str:
    """The pull-mode pool, created like the templates' pool (its type and job template) when it does not exist:
    'exists' or 'created'. Its worker, in the cluster, is the only one to serve it."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    try:
        client.read_work_pool(pool)
        return "exists"
    except ObjectNotFound:
        pass
    template = client.read_work_pool(like) if like else None
    client.create_work_pool(WorkPoolCreate(
        name=pool, type=template.type if template else "process",
        base_job_template=template.base_job_template if template else {},
        description="storage-migrator: one cluster's pool (pull mode); only a worker in that cluster serves it",
    ))  # fmt: skip
    return "created"


def _pull_pool(client: SyncPrefectClient, cluster: str) -> tuple[str, str | None] | None:
    """The pool and queue of the cluster's existing pull-mode copies (None: none yet)."""
    from prefect.exceptions import ObjectNotFound

    try:
        existing = client.read_deployment_by_name(deployment_name(FLEET_FLOWS[0], cluster))
    except ObjectNotFound:
        return None
    if mode_of(existing.tags or []) != "pull" or not existing.work_pool_name:
        return None
    return existing.work_pool_name, existing.work_queue_name


def _checked_uid(uid: str | None) -> str | None:
    if uid is None:
        return None
    try:
        return str(UUID(uid))
    except ValueError as exc:
        raise typer.BadParameter(f"{uid!r} is not a uid: read it from the cluster with kubectl get namespace "
                                 "kube-system -o jsonpath='{.metadata.uid}'", param_hint="--uid") from exc  # fmt: skip


def _pin_problem(cluster: str, *, recorded: str | None, given: str) -> str | None:
    """Issue 35: a uid given at `fleet add` is the identity every run is checked against; a different one
    recorded already is refused (nothing written), since it would silently re-point the name."""
    if recorded is None or recorded == given:
        return None
    return (f"cluster {cluster!r} is recorded as kube-system uid {recorded}, and --uid says {given}: nothing was "
            f"written. If the cluster was reinstalled on purpose, delete the record (prefect variable delete "
            f"{identity_variable(cluster)}) and run this again; else check which cluster you read the uid from")  # fmt: skip


def _given_engine(client: SyncPrefectClient, cluster: str) -> str | None:
    """The engine an earlier `fleet add --engine` gave the cluster (kept by an upgrade's `fleet add NAME`)."""
    from prefect.exceptions import ObjectNotFound

    try:
        existing = client.read_deployment_by_name(deployment_name(FLEET_FLOWS[0], cluster))
    except ObjectNotFound:
        return None
    return engine_of(existing.tags or [])


def add(name: Cluster, pool: Pool = None, queue: Queue = None, uid: Uid = None, engine: Engine = None,
        output: Output = OutputFormat.table) -> None:  # fmt: skip
    """Create or update the cluster's deployments flow/NAME, one per deployment of prefect.yaml (the templates, flow/flow).

    Pull mode (--pool, or no KubernetesClusterConfig block NAME: the pool its copies have, else storage-migrator-NAME): the copies' runs go to a work pool of the cluster's own (created like the templates' pool if it does not exist), which only the cluster's own worker serves, with its own credentials (the kustomize install with STORAGE_MIGRATOR_CLUSTER=NAME, its ServiceAccount): the Prefect server holds no credential of the cluster. Push mode (a block NAME exists, no --pool): the copies keep the templates' pool, whose workers reach the cluster through the block. Each copies its template (flow, entrypoint, pull steps, job variables, parameter schema, schedules and whether they are paused, concurrency limit and collision strategy) with cluster=NAME among its parameters and the tags cluster:NAME and mode:pull or mode:push; the detection schedule and the one-at-a-time limits are then the cluster's own. A new copy's schedules are active or paused as the template's; run it again after deploying the templates again (an upgrade): it updates the copies and keeps what was paused on each (prefect deployment schedule pause FLOW/NAME ID, or the deployment's own pause in the UI). --uid UID records the cluster's identity (the uid of its kube-system namespace, read by you from the cluster) now, instead of its first run recording whatever cluster it reaches (issue 35); a different uid recorded already is refused. Needs the six templates on the Prefect server PREFECT_API_URL names. Exit codes: 0 done; 1 a template is missing, another uid is recorded, or the Prefect API failed; 2 a usage error.
    """
    cluster = _checked(name)
    pinned = _checked_uid(uid)
    if queue and not pool:
        raise typer.BadParameter("--queue is a queue of the cluster's own pool: give --pool too", param_hint="--queue")
    with _prefect() as client:
        has_block = _block_exists(client, cluster)
        if pool is None and not has_block:  # pull mode: the pool it has (an upgrade's loop), else the default
            pool, queue = _pull_pool(client, cluster) or (default_pool(cluster), None)
        templates, missing = _templates(client)
        if missing:
            _fail(f"the template deployments {', '.join(missing)} are not on the Prefect server at {_api_url()}: "
                  "deploy the project first (prefect --no-prompt deploy --all, from the repository root, or the "
                  "kubernetes pool's loop in prefect.yaml), then run this again")  # fmt: skip
        for template in templates:
            if not template.takes_cluster:
                print(f"warning: {template.full_name} was deployed from a flow that takes no 'cluster' parameter: "
                      f"runs of {deployment_name(template.flow_name, cluster)} will fail until the templates are "
                      "deployed again from a release whose flows take it, and this command run again", file=sys.stderr)  # fmt: skip
        recorded = _identity_uid(client, cluster) if pinned else None
        if pinned and (problem := _pin_problem(cluster, recorded=recorded, given=pinned)):
            _fail(problem)
        pool_action = _ensure_pool(client, pool, templates[0].work_pool_name) if pool else None
        chosen = engine.value if engine is not None else _given_engine(client, cluster)
        written = [_upsert(client, for_cluster(t, cluster, pool=pool, queue=queue, engine=chosen)) for t in templates]
        if pinned and recorded is None:
            from prefect.client.schemas.actions import VariableCreate

            client.create_variable(VariableCreate(name=identity_variable(cluster), value={"uid": pinned}))
    _report_mode(cluster, pool, pool_action, has_block)
    if pinned:
        print(f"identity: cluster {cluster!r} is kube-system uid {pinned} ({'already recorded' if recorded else 'recorded'}"
              f"): every run for it checks its cluster is that one before any write", file=sys.stderr)  # fmt: skip
    else:
        print(f"note: the identity of cluster {cluster!r} is recorded by its first run, whatever cluster that run "
              f"reaches (trust on first use): give --uid to record it now (docs/operator-guide.md, 'A cluster's "
              f"identity')", file=sys.stderr)  # fmt: skip
    if chosen and pool:
        print(f"note: pull mode: the cluster's install decides which engine writes; its runs refuse engine {chosen} "
              f"unless it runs it too: STORAGE_MIGRATOR_ENGINE={chosen} in its ConfigMap storage-migrator-cluster"
              + (" (the kustomize component deployments/rbac/in-tree/ sets it, with the role that patches nothing)"
                 if chosen == "in-tree" else ""), file=sys.stderr)  # fmt: skip
    rows: list[dict[str, Any]] = [
        {"deployment": c.full_name, "action": action, "mode": mode_of(c.tags), "engine": engine_of(c.tags),
         "work_pool": c.work_pool_name,
         "work_queue": c.work_queue_name, "parameters": c.parameters, "tags": c.tags,
         "schedules": [s.model_dump(include={"schedule", "active"}) for s in c.schedules],
         "concurrency_limit": c.concurrency_limit, "collision_strategy": c.collision_strategy}
        for c, action in written
    ]  # fmt: skip
    emit(output, rows, lambda: render_table(
        ["DEPLOYMENT", "ACTION", "MODE", "ENGINE", "WORK POOL", "SCHEDULE", "CONCURRENCY"],
        [[r["deployment"], r["action"], r["mode"], r["engine"] or "-", r["work_pool"] or "-", _schedule_text(r["schedules"]),
          f"{r['concurrency_limit']} {r['collision_strategy'] or ''}".strip() if r["concurrency_limit"] else "-"]
         for r in rows]))  # fmt: skip


def _report_mode(cluster: str, pool: str | None, pool_action: str | None, has_block: bool) -> None:
    """What the operator does next, on stderr (the table or json on stdout stays the data)."""
    if pool is None:
        print(f"note: push mode: cluster {cluster!r} is reached through its KubernetesClusterConfig block, whose "
              "credentials the Prefect database holds; --pool for pull mode (docs/operator-guide.md, "
              "'Pull mode and push mode')", file=sys.stderr)  # fmt: skip
        return
    print(f"pull mode: work pool {pool!r} {pool_action}; start the cluster's own worker on it, in the cluster: "
          f"the kustomize install with STORAGE_MIGRATOR_CLUSTER={cluster} and PREFECT_WORK_POOL={pool} "
          f"(docs/operator-guide.md, 'Pull mode and push mode'), or off-cluster with only that cluster's "
          f"kubeconfig: STORAGE_MIGRATOR_CLUSTER={cluster} STORAGE_MIGRATOR_KUBECONFIG=PATH uv run storage-migrator "
          f"worker --pool {pool}", file=sys.stderr)  # fmt: skip
    if has_block:
        print(f"warning: a KubernetesClusterConfig block named {cluster!r} is on the Prefect server, and pull mode "
              f"does not use it: delete it (prefect block delete {BLOCK_TYPE}/{cluster}) so that the server holds "
              "no credential of the cluster", file=sys.stderr)  # fmt: skip


def _cluster_deployments(client: SyncPrefectClient) -> dict[str, list[Any]]:
    """Cluster → its deployments, from the `cluster:` tag (templates have none), each with `full_name` set."""
    flows: dict[Any, str] = {}
    by_cluster: dict[str, list[Any]] = {}
    offset, page = 0, 200
    while batch := client.read_deployments(limit=page, offset=offset):
        for deployment in batch:
            cluster = cluster_of(deployment.tags)
            if cluster is None:
                continue
            if deployment.flow_id not in flows:
                flows[deployment.flow_id] = client.read_flow(deployment.flow_id).name
            by_cluster.setdefault(cluster, []).append((f"{flows[deployment.flow_id]}/{deployment.name}", deployment))
        offset += page
    return {c: sorted(found, key=lambda d: d[0]) for c, found in sorted(by_cluster.items())}


def _identity_uid(client: SyncPrefectClient, cluster: str) -> str | None:
    try:
        variable = client.read_variable_by_name(identity_variable(cluster))
    except ValueError:  # a tag naming no block a flow could run for
        return None
    value = variable.value if variable else None
    return str(value["uid"]) if isinstance(value, dict) and value.get("uid") else None


def list_clusters(output: Output = OutputFormat.table) -> None:
    """One row per cluster that has deployments (tagged cluster:NAME): pull or push mode, the engine fleet add --engine gave it (-: the workers' setting), its work pools, its deployments, those of prefect.yaml it lacks, whether its KubernetesClusterConfig block exists (push mode needs it; in pull mode one left there is credentials to delete), and its recorded identity (the uid of kube-system, Prefect Variable storage-migrator-cluster-NAME; none before its first run).

    Exit codes: 0 done (no cluster included: the table says so on stderr, json prints []); 1 the Prefect API failed.
    """
    with _prefect() as client:
        clusters = _cluster_deployments(client)
        blocks = _block_names(client)
        rows: list[dict[str, Any]] = []
        for cluster, found in clusters.items():
            names = [n for n, _ in found]
            modes = {mode_of(d.tags or []) for _, d in found}
            engines = {engine_of(d.tags or []) for _, d in found}
            rows.append({
                "cluster": cluster, "deployments": names, "mode": "pull" if modes == {"pull"} else
                "push" if modes == {"push"} else "mixed", "work_pools": sorted({d.work_pool_name or "-" for _, d in found}),
                "engine": engines.pop() if len(engines) == 1 else "mixed",
                "missing_deployments": [f for f in FLEET_FLOWS if f"{f}/{cluster}" not in names],
                "block": cluster in blocks, "identity_uid": _identity_uid(client, cluster),
            })  # fmt: skip
    if not rows and output is OutputFormat.table:
        print("No clusters found: no deployment is tagged cluster:NAME (storage-migrator fleet add NAME)",
              file=sys.stderr)  # fmt: skip
        return

    def block(r: dict[str, Any]) -> str:  # pull mode needs none; a block left there is credentials to delete
        return ("yes" if r["block"] else "missing") if r["mode"] != "pull" else ("yes (unused)" if r["block"] else "-")

    emit(output, rows, lambda: render_table(
        ["CLUSTER", "MODE", "ENGINE", "WORK POOL", "DEPLOYMENTS", "MISSING", "BLOCK", "IDENTITY"],
        [[r["cluster"], r["mode"], r["engine"] or "-", ",".join(r["work_pools"]),
          ",".join(n.split("/")[0] for n in r["deployments"]),
          ",".join(r["missing_deployments"]) or "-", block(r), r["identity_uid"] or "-"] for r in rows]))  # fmt: skip


def remove(name: Cluster, output: Output = OutputFormat.table) -> None:
    """Delete the cluster's deployments (those tagged cluster:NAME), and their scheduled runs.

    Its KubernetesClusterConfig block and its recorded identity (Prefect Variable storage-migrator-cluster-NAME) are kept, and so are past flow runs; the command says how to delete them. Exit codes: 0 done; 1 the cluster has no deployments, or the Prefect API failed; 2 a usage error.
    """
    cluster = _checked(name)
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterTags

    with _prefect() as client:
        found = client.read_deployments(deployment_filter=DeploymentFilter(tags=DeploymentFilterTags(all_=[cluster_tag(cluster)])))  # fmt: skip
        found = [d for d in found if d.name == cluster]  # never a template, whatever its tags
        if not found:
            _fail(f"no deployments for cluster {cluster!r} on the Prefect server at {_api_url()} "
                  "(storage-migrator fleet list)")  # fmt: skip
        flows = {d.flow_id: client.read_flow(d.flow_id).name for d in found}
        names = sorted(f"{flows[d.flow_id]}/{d.name}" for d in found)
        for deployment in found:
            client.delete_deployment(deployment.id)
    print(f"note: kept the KubernetesClusterConfig block {cluster!r} (prefect block delete {BLOCK_TYPE}/{cluster}) "
          f"and the recorded identity (prefect variable delete {identity_variable(cluster)})", file=sys.stderr)  # fmt: skip
    rows = [{"deployment": n, "action": "deleted"} for n in names]
    emit(output, rows, lambda: render_table(["DEPLOYMENT", "ACTION"], [[r["deployment"], r["action"]] for r in rows]))


app.command("add")(add)
app.command("list")(list_clusters)
app.command("remove")(remove)
