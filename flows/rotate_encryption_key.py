"""`rotate-encryption-key`: migrate a list of resources to a new etcd write key, and prove it.

Reads like seed 003's control loop ("for resource := range encryptedResources
{ if migration not found { create } }; if migrationsAreCompleteFor(key) ..."):
resolve every resource (an unknown one fails the run before anything is
created), find or create one request per resource named from it and the key
(`secrets-key2`; DESIGN 4.8), run them, then run a verification request per
resource (`secrets-key2-verify`) that must rewrite nothing, and end with a
table. Every decision is `storage_migrator.rotation.decisions`'s.

Existing requests of the same name: Succeeded is the record that it ran (not
run again, still verified); pending or Running is run or resumed; Failed stops
the run before anything is created or run: a person reads its
`status.failures`, fixes the cause and deletes it to retry. Finished requests
are deleted by the detection poll after `request_retention_seconds` (a Failed
one only once a person annotates it `migration.k8s.io/acknowledged: "true"`).

The run ends Completed only when every resource succeeded and its verification
pass rewrote nothing; otherwise Failed, naming resources and objects, and
saying not to remove the old key yet.

Issue 19: nothing is created or written until every live API server reports the
same encryption configuration on /metrics (flows/server_config_gate.py; a
server without the metric is unknown, never agreeing); each migration checks
again between its chunks; and the verdict holds only if each verification pass
ran under the configuration every server runs at the verdict, which it names.

Issue 39: run again (by a person, on a schedule, or by the runbook after the old
key is removed), the rotation proves again under the configuration the servers
run now, on its own: where the newest verification pass ran under another one,
it reads every object under the new one (what cannot be read is reported as
lost, with its count and names: storage_migrator/rotation/unreadable.py), then
makes a new pass (`secrets-key2-verify-2`, ...; both stay as the record:
storage_migrator/rotation/proofs.py), which writes nothing where nothing is due,
and gives the verdict (storage_migrator/rotation/verdict.py). Nothing has to be
deleted by hand for a rerun.
`skip_server_check=True` is the operator's explicit override: a warning in the
log, `overridden` in the ledger, and the verdict says so.

Issue 20: `cluster` names the KubernetesClusterConfig block of the cluster to
rotate (left out: the environment's). `clusters` rotates several: one run per
cluster (flows/fleet_runs.py), `max_parallel_clusters` at once, each with its
own verdict; the run ends with a table of them and is Completed only when
every cluster's is (storage_migrator/fleet/verdicts.py).

    prefect deployment run 'rotate-encryption-key/rotate-encryption-key' -p key=key2
    prefect deployment run 'rotate-encryption-key/rotate-encryption-key' -p key=key2 --param clusters='["a","b"]'
    rotate_encryption_key(key="key2", resources=["secrets", "routes.route.openshift.io"])
"""

from __future__ import annotations

from typing import Any, Final

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.client.schemas.objects import State
from prefect.runtime import deployment
from prefect.states import Failed
from pydantic import BaseModel, Field

from flows.cluster_scope import cluster_settings, entered_cluster
from flows.events import delivered_events
from flows.fleet_runs import run_per_cluster
from flows.run_logs import our_logs_in_the_run
from flows.run_migrations import dispatch_requests, run_overrides
from flows.server_config_gate import GateOutcome, show_configs, wait_for_one_config
from storage_migrator.agreement.server_configs import ServerConfigs
from storage_migrator.conditions import is_condition_true, phase_from_conditions
from storage_migrator.fleet.names import scoped_key
from storage_migrator.fleet.verdicts import fleet_verdict
from storage_migrator.kube.errors import KubeError
from storage_migrator.migration.targets import MigrationTarget
from storage_migrator.models import CONDITION_SUCCEEDED, StorageVersionMigration
from storage_migrator.rotation.decisions import (
    ENCRYPTION_KEY_ANNOTATION,
    REQUESTED_BY_LABEL,
    ROTATION_REQUESTER,
    SKIP_SERVER_CHECK_ANNOTATION,
    RequestStep,
    check_key_name,
    plan_requests,
)
from storage_migrator.rotation.proofs import VerificationStep, latest_verification, plan_verification, short_hash
from storage_migrator.rotation.unreadable import Unreadable
from storage_migrator.rotation.verdict import ResourceRotation, ServerCheckResult, rotation_verdict, summarize_resource
from storage_migrator.settings import Settings
from tasks.dispatching import create_named_requests, read_migrations, resolve_targets
from tasks.proofs import mark_outdated
from tasks.reading_check import read_every_object
from tasks.server_configs import observe_configs

DEFAULT_RESOURCES: Final = ("secrets", "configmaps")
#: Clusters rotated at once by a fleet rotation, unless `max_parallel_clusters` says otherwise.
DEFAULT_PARALLEL_CLUSTERS: Final = 4


class RotationSummary(BaseModel):
    """The flow's return value: per resource, counters and the proof (names and counters only);
    for a fleet rotation, one row per cluster instead."""

    key: str
    resources: list[ResourceRotation] = Field(default_factory=list)
    clusters: list[dict[str, str]] = Field(default_factory=list, description="A fleet rotation's verdict per cluster.")
    message: str = ""


def _run_steps(settings: Settings, overrides: dict[str, Any], steps: list[RequestStep],
               targets: dict[str, MigrationTarget], key: str, *, skip_server_check: bool) -> None:  # fmt: skip
    """Create the missing requests, then run every one not yet finished (resources in parallel)."""
    missing = [(s.name, targets[s.resource]) for s in steps if s.action == "create"]
    if missing:
        annotations = {ENCRYPTION_KEY_ANNOTATION: key}
        if skip_server_check:
            annotations[SKIP_SERVER_CHECK_ANNOTATION] = "true"
        create_named_requests(settings, missing, labels={REQUESTED_BY_LABEL: ROTATION_REQUESTER},
                              annotations=annotations)  # fmt: skip
    to_run = {s.name for s in steps if s.action in ("create", "run")}
    if to_run:
        dispatch_requests(settings, overrides, deployed=deployment.id is not None, only=to_run)


def _table(resources: list[ResourceRotation]) -> list[dict[str, Any]]:
    return [
        {"resource": r.resource, "request": r.migration, "phase": r.phase, "listed": r.listed,
         "rewritten": r.rewritten, "unchanged": r.unchanged, "failed": r.failed,
         "verification": r.verify_migration, "verify": r.verify_phase, "verify rewritten": r.verify_rewritten,
         "verify config": r.verify_config_hash or "-",
         "previous proof": f"{r.previous_verification} ({r.previous_config_hash})" if r.previous_verification else "-",
         "unreadable": r.unreadable.describe() if r.unreadable else "-", "verified": r.verified, "note": r.note}
        for r in resources
    ]  # fmt: skip


def _losses(
    settings: Settings, checks: list[VerificationStep], targets: dict[str, MigrationTarget]
) -> dict[str, Unreadable]:
    """Issue 39: before proving again under a changed configuration, read every object under it: what the
    servers cannot read any more is a loss to report as one, not a verification pass to fail."""
    changed = [c for c in checks if c.action == "create" and c.configuration_changed]
    if not changed:
        return {}
    logger = get_run_logger()
    try:
        reads = read_every_object(settings, [targets[c.resource] for c in changed])
    except KubeError as exc:  # the code and reason only: a message may quote an object
        logger.warning("could not read %s under the configuration the API servers run now (%s %s): the "
                       "verification passes will tell", ", ".join(c.resource for c in changed), exc.code, exc.reason)  # fmt: skip
        return {}
    lost = {}
    for check, read in zip(changed, reads, strict=True):
        if read.unreadable is not None:
            logger.error("%s: %s cannot be read under the configuration the API servers run now (%s): lost",
                         check.resource, read.unreadable.describe(), read.unreadable.named())  # fmt: skip
            lost[check.request] = read.unreadable
    return lost


def _prove(settings: Settings, overrides: dict[str, Any], steps: list[RequestStep], coords: list[tuple[str, str]],
           targets: dict[str, MigrationTarget], key: str, *, skip_server_check: bool,
           ) -> tuple[dict[str, VerificationStep], dict[str, Unreadable]]:  # fmt: skip
    """The proof (DESIGN 4.5): each resource that succeeded gets a verification pass that must rewrite nothing,
    under the configuration every API server runs now (issue 39: a new pass only where the newest proves
    nothing under it)."""
    existing = read_migrations(settings)
    by_name = {m.metadata.name: m for m in existing}
    now = observe_configs(settings).common_hash
    checks: dict[str, VerificationStep] = {}
    for (group, plural), step in zip(coords, steps, strict=True):
        request = by_name.get(step.name)
        if request is not None and is_condition_true(request.status.conditions, CONDITION_SUCCEEDED):
            checks[step.name] = plan_verification(request=step.name, group=group, plural=plural, key=key,
                                                  existing=existing, config_hash=now)  # fmt: skip
    logger = get_run_logger()
    for check in checks.values():
        logger.info("%s: %s (%s)", check.name, check.action, check.reason)
    lost = _losses(settings, list(checks.values()), targets)
    _run_steps(settings, overrides, [RequestStep(resource=c.resource, name=c.name, action=c.action, reason=c.reason)
                                     for c in checks.values() if c.action != "blocked" and c.request not in lost],
               targets, key, skip_server_check=skip_server_check)  # fmt: skip
    return checks, lost


def _latest(existing: list[StorageVersionMigration], coord: tuple[str, str], request: str, key: str,
            ) -> StorageVersionMigration | None:  # fmt: skip
    return latest_verification(request, existing, group=coord[0], plural=coord[1], key=key)


def _outdate(settings: Settings, passes: list[StorageVersionMigration | None], configs: ServerConfigs) -> None:
    """Issue 39: every API server was heard running a configuration these passes did not run under (or
    servers differing): writes may go under another key, so they never count again (proofs.py). Servers
    not heard are no evidence of a change: nothing is written then."""
    if not configs.servers or any(s.config_hash is None for s in configs.servers):
        return
    common = configs.common_hash
    names = [m.metadata.name for m in passes
             if m is not None and m.metadata.name and m.status.encryption_config_hash != common
             and phase_from_conditions(m.status.conditions) in ("Succeeded", "Failed")]  # fmt: skip
    if names:
        seen = short_hash(common) if common else f"different encryption configurations ({configs.describe()})"
        get_run_logger().warning("%s no longer prove(s) the rotation: the API servers ran %s", ", ".join(names), seen)
        mark_outdated(settings, names, seen=seen)


def _no_verdict(settings: Settings, gate: GateOutcome, steps: list[RequestStep], coords: list[tuple[str, str]],
                key: str) -> State[Any]:  # fmt: skip
    """Issue 39: a rerun (every request ran already) while the servers do not run one configuration:
    no verdict, and no advice about a key the operator may have removed already."""
    existing = read_migrations(settings)
    _outdate(settings, [_latest(existing, c, s.name, key) for c, s in zip(coords, steps, strict=True)], gate.configs)
    return Failed(message=f"rotation to key {key}: no verdict while the API servers do not run one configuration: "
                          f"{gate.verdict.message} Every request of this rotation ran already; it is proven again, "
                          "writing nothing that is not due, once every API server is heard running one "
                          "configuration. Until that verdict, remove no read key from any server.")  # fmt: skip


@flow(name="rotate-encryption-key", flow_run_name="rotate-encryption-key-{key}", persist_result=False,
      log_prints=False)  # fmt: skip
def rotate_encryption_key(
    key: str,
    resources: list[str] | None = None,
    max_parallel: int | None = None,
    chunk_size: int | None = None,
    write_rate_per_second: float | None = None,
    write_concurrency: int | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
    server_config_timeout: float | None = None,
    skip_server_check: bool = False,
    cluster: str | None = None,
    clusters: list[str] | None = None,
    max_parallel_clusters: int = DEFAULT_PARALLEL_CLUSTERS,
) -> RotationSummary | State[Any]:
    """Migrate `resources` (default secrets and configmaps; `deployments.apps` form for
    others) to the write key `key` (its name as in the EncryptionConfiguration, recorded
    in the requests) and verify. Make `key` the write key on every API server first: the
    run waits up to `server_config_timeout` seconds for every server to report one
    configuration. `skip_server_check` goes on without that: the operator's risk.
    `cluster` names the cluster's KubernetesClusterConfig block; `clusters` rotates each of
    them (`default`: the environment's), `max_parallel_clusters` at once."""
    check_key_name(key)  # a key that cannot be in a name: nothing created
    overrides = run_overrides(chunk_size=chunk_size, write_rate_per_second=write_rate_per_second,
                              write_concurrency=write_concurrency, kubeconfig=kubeconfig, context=context)  # fmt: skip
    if clusters:
        if cluster is not None:
            raise ValueError("give either cluster (one) or clusters (a fleet rotation), not both")
        return _rotate_fleet(key, clusters, limit=max_parallel_clusters, parameters={
            "key": key, "resources": resources, "max_parallel": max_parallel,
            "server_config_timeout": server_config_timeout, "skip_server_check": skip_server_check, **overrides})  # fmt: skip
    settings = cluster_settings(cluster, max_parallel_migrations=max_parallel,
                                server_config_timeout_seconds=server_config_timeout, **overrides)  # fmt: skip
    with delivered_events(), our_logs_in_the_run(), entered_cluster(settings):
        return _rotate(settings, overrides, key=key, resources=resources, skip_server_check=skip_server_check)


def _rotate_fleet(
    key: str, clusters: list[str], *, limit: int, parameters: dict[str, Any]
) -> RotationSummary | State[Any]:
    """One rotation per cluster, side by side; a verdict per cluster and one table of them."""
    if limit < 1:
        raise ValueError(f"max_parallel_clusters must be at least 1, not {limit}")
    outcomes = run_per_cluster(rotate_encryption_key, clusters, parameters, limit=limit)
    verdict = fleet_verdict(f"rotation to key {key}", outcomes)
    create_table_artifact(table=verdict.rows, key=scoped_key(f"rotate-encryption-key-{key}-fleet", None),
                          description=verdict.message)  # fmt: skip
    logger = get_run_logger()
    for row in verdict.rows:
        logger.info("cluster %s: %s %s", row["cluster"], row["verdict"], row["message"])
    if not verdict.completed:
        logger.error("%s", verdict.message)
        return Failed(message=verdict.message + ". Do not remove the old key from those clusters yet.")
    logger.info("%s", verdict.message)
    return RotationSummary(key=key, clusters=verdict.rows, message=verdict.message)


def _rotate(settings: Settings, overrides: dict[str, Any], *, key: str, resources: list[str] | None,
            skip_server_check: bool) -> RotationSummary | State[Any]:  # fmt: skip
    """One cluster's rotation (the module docstring)."""
    logger = get_run_logger()
    wanted = list(DEFAULT_RESOURCES if resources is None else resources)
    targets: dict[str, MigrationTarget] = {}
    for target in resolve_targets(settings, wanted):  # UnknownResource fails the run, nothing created
        targets.setdefault(target.ref.group_resource, target)
    coords = [(t.ref.group, t.ref.resource) for t in targets.values()]

    steps = plan_requests(coords, read_migrations(settings), key=key)
    blocked = [s for s in steps if s.action == "blocked"]
    if blocked:
        message = "; ".join(s.reason for s in blocked)
        logger.error("%s", message)
        return Failed(message=f"rotation to key {key} stopped before anything ran: {message}. "
                              "Do not remove the old key yet.")  # fmt: skip
    gate = wait_for_one_config(settings, what=f"rotation to key {key}", key=f"rotate-{key}",
                               override=skip_server_check)  # fmt: skip
    if gate.verdict.action == "abort":
        if all(s.action == "done" for s in steps):  # issue 39: a rerun; the old key may be gone already
            return _no_verdict(settings, gate, steps, coords, key)
        return Failed(message=f"rotation to key {key} not started: {gate.verdict.message} Not proven: keep the "
                              "old key.")  # fmt: skip
    for step in steps:
        logger.info("%s: %s (%s)", step.name, step.action, step.reason)
    _run_steps(settings, overrides, steps, targets, key, skip_server_check=skip_server_check)
    checks, lost = _prove(settings, overrides, steps, coords, targets, key, skip_server_check=skip_server_check)

    # Issue 19: before the verdict, what every server runs now; each proof must have run under it.
    configs = observe_configs(settings)
    servers = ServerCheckResult(config_hash=configs.common_hash, overridden=skip_server_check,
                                why=f"the API servers do not all run one configuration now ({configs.describe()})")  # fmt: skip
    show_configs(configs, key=f"rotate-{key}", description=f"rotation to key {key}: the API servers at the verdict")
    existing = read_migrations(settings)
    by_name = {m.metadata.name: m for m in existing}
    results = []
    for coord, s in zip(coords, steps, strict=True):
        check = checks.get(s.name)
        why = check.reason if check is not None and check.action == "blocked" else ""
        results.append(summarize_resource(s.resource, s.name, by_name.get(s.name), _latest(existing, coord, s.name, key),
                                          blocked=why, servers=servers, step=check, unreadable=lost.get(s.name)))  # fmt: skip
    if not skip_server_check:  # what the servers run now and no pass proves (a loss, a change during the run)
        _outdate(settings, [_latest(existing, c, s.name, key) for c, s in zip(coords, steps, strict=True)], configs)
    verdict = rotation_verdict(results, key=key, servers=servers)
    create_table_artifact(table=_table(results), key=scoped_key(f"rotate-encryption-key-{key}", settings.cluster),
                          description=verdict.message)  # fmt: skip
    if not verdict.completed:
        logger.error("%s", verdict.message)
        return Failed(message=verdict.message)
    logger.info("%s", verdict.message)
    return RotationSummary(key=key, resources=results, message=verdict.message)
