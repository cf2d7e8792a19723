"""A cluster's deployments: copies of the project's own (issue 20: "adding a cluster means one block plus one command").

Design decision: the deployments `prefect deploy` makes from prefect.yaml
(`flow/flow`) are the templates, and a cluster's deployment `flow/<cluster>` is
a copy of one with the cluster among its parameters and tags. A copy, not a
prefect.yaml per cluster: what the operator deployed (pool, image, job
variables, schedule, concurrency) is what every cluster runs, and an upgrade is
deploying the templates again, then ``storage-migrator fleet add`` again. Plain
data here (no Prefect): the CLI reads and writes it through the Prefect client.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.fleet.names import block_of, cluster_tag, deployment_name

__all__ = [
    "CLUSTER_PARAMETER",
    "ENGINE_PARAMETER",
    "FLEET_FLOWS",
    "DeploymentSpec",
    "ScheduleSpec",
    "cluster_of",
    "default_pool",
    "engine_of",
    "for_cluster",
    "keeping_pauses",
    "mode_of",
]

#: Every flow of prefect.yaml, by its deployment's name (tests/unit/fleet keeps them equal):
#: a cluster needs all of them, since a run for it starts its children through `flow/<cluster>`.
FLEET_FLOWS: tuple[str, ...] = ("detect-storage-changes", "migrate-resource", "run-migrations", "initialize",
                                "rotate-encryption-key", "key-rotation-runbook")  # fmt: skip
#: The flows' parameter naming the cluster's KubernetesClusterConfig block.
CLUSTER_PARAMETER = "cluster"
_TAG_PREFIX = cluster_tag("x").removesuffix("x")
#: The tags that say how a cluster's deployments reach it (issue 30).
PULL_TAG, PUSH_TAG = "mode:pull", "mode:push"
#: Issue 36: the engine `fleet add --engine` gave the cluster: a tag on every copy (`fleet list`), and the
#: `engine` parameter of the copies whose flow takes one (migrate-resource, which every migration runs).
ENGINE_PARAMETER = "engine"
_ENGINE_TAG = "engine:"


def engine_of(tags: list[str]) -> str | None:
    """The engine a cluster's deployment was given (`fleet add --engine`); None: the workers' setting."""
    return next((t.removeprefix(_ENGINE_TAG) for t in tags if t.startswith(_ENGINE_TAG)), None)


def default_pool(cluster: str) -> str:
    """The work pool of a cluster added in pull mode without one named."""
    return f"storage-migrator-{cluster}"


def mode_of(tags: list[str]) -> str:
    """'pull' or 'push' (a copy made before there were modes: push, as it was)."""
    return "pull" if PULL_TAG in tags else "push"


class ScheduleSpec(BaseModel):
    """One schedule of a deployment; `schedule` as the Prefect API serialises it (interval, cron or rrule)."""

    model_config = ConfigDict(frozen=True)

    schedule: dict[str, Any]
    active: bool = True
    max_scheduled_runs: int | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    slug: str | None = None


class DeploymentSpec(BaseModel):
    """What a deployment is, as far as a copy for another cluster must repeat it."""

    model_config = ConfigDict(frozen=True)

    flow_id: str
    flow_name: str
    name: str
    description: str | None = None
    version: str | None = None
    version_info: dict[str, Any] | None = None
    entrypoint: str | None = None
    path: str | None = None
    pull_steps: list[dict[str, Any]] | None = None
    storage_document_id: str | None = None
    infrastructure_document_id: str | None = None
    work_pool_name: str | None = None
    work_queue_name: str | None = None
    job_variables: dict[str, Any] = Field(default_factory=dict)
    parameters: dict[str, Any] = Field(default_factory=dict)
    parameter_openapi_schema: dict[str, Any] | None = None
    enforce_parameter_schema: bool = True
    tags: list[str] = Field(default_factory=list)
    concurrency_limit: int | None = None
    collision_strategy: str | None = None
    grace_period_seconds: int | None = None
    #: Not `paused`: a deployment's pause is its own (the template's is the default cluster's).
    schedules: list[ScheduleSpec] = Field(default_factory=list)

    @property
    def full_name(self) -> str:
        return f"{self.flow_name}/{self.name}"

    @property
    def takes_cluster(self) -> bool:
        """Whether the flow's parameter schema has `cluster` (a template deployed from an older release has not)."""
        return CLUSTER_PARAMETER in (self.parameter_openapi_schema or {}).get("properties", {})


def cluster_of(tags: list[str]) -> str | None:
    """The cluster a deployment is for, from its `cluster:<name>` tag; None for a template."""
    return next((t.removeprefix(_TAG_PREFIX) for t in tags if t.startswith(_TAG_PREFIX)), None)


def for_cluster(template: DeploymentSpec, cluster: str, *, pool: str | None = None,
                queue: str | None = None, engine: str | None = None) -> DeploymentSpec:  # fmt: skip
    """The cluster's copy of a template: its own name, the cluster as a parameter and a tag, all else the same.

    Schedules are the template's, active or paused as it is, each the cluster's own (a
    schedule is a deployment's; `keeping_pauses` for an update); a concurrency limit is per deployment, so each cluster
    gets its own one-at-a-time poll and dispatcher. `pool` (pull mode, issue 30): the copy's runs go to that work pool
    (its `queue`, else the pool's default queue), which only the cluster's own worker serves; push mode keeps the
    template's pool and queue, whose workers reach the cluster through its block. `engine` (issue 36): a tag on
    each copy, and the parameter of those whose flow takes it; in push mode it chooses, in pull mode the runs
    refuse it unless it is the install's (the cluster decides: flows/cluster_scope.py).
    """
    if block_of(cluster) is None:  # `default` or nothing; a name no block can have raises there
        raise ValueError(f"{cluster!r} is the environment's cluster: its deployments are the templates "
                         "themselves (flow/flow); name another cluster")  # fmt: skip
    name = deployment_name(template.flow_name, cluster).split("/", 1)[1]
    tags = [t for t in template.tags if not t.startswith((_TAG_PREFIX, _ENGINE_TAG)) and t not in (PULL_TAG, PUSH_TAG)]
    tags += [cluster_tag(cluster), PULL_TAG if pool else PUSH_TAG, *([f"{_ENGINE_TAG}{engine}"] if engine else [])]
    takes_engine = ENGINE_PARAMETER in (template.parameter_openapi_schema or {}).get("properties", {})
    chosen = {ENGINE_PARAMETER: engine} if engine and takes_engine else {}
    schedules = [s.model_copy(update={"parameters": {k: v for k, v in s.parameters.items() if k != CLUSTER_PARAMETER}})
                 for s in template.schedules]  # fmt: skip
    how = (f"pull mode, work pool {pool!r}: its own worker, in the cluster, started with STORAGE_MIGRATOR_CLUSTER="
           f"{cluster}" if pool else "its KubernetesClusterConfig block")  # fmt: skip
    description = f"{template.description or ''}\n\nFor cluster {cluster!r}: {how} " \
                  f"(storage-migrator fleet add {cluster}{f' --pool {pool}' if pool else ''}).".lstrip()  # fmt: skip
    placed = {"work_pool_name": pool, "work_queue_name": queue} if pool else {}
    return template.model_copy(update={
        "name": name, "tags": tags, "schedules": schedules, "description": description,
        "parameters": {**{k: v for k, v in template.parameters.items() if k != ENGINE_PARAMETER},
                       CLUSTER_PARAMETER: cluster, **chosen}, **placed,
    })  # fmt: skip


def keeping_pauses(copy: DeploymentSpec, existing: list[ScheduleSpec]) -> DeploymentSpec:
    """An update keeps each schedule the operator paused or resumed on the cluster's deployment (by slug, else
    by position): `prefect deployment schedule pause` stops one cluster's poll, and an upgrade must not undo it."""
    slugs = {s.slug: s.active for s in existing if s.slug}
    schedules = [
        s.model_copy(update={"active": slugs[s.slug]}) if s.slug in slugs
        else s.model_copy(update={"active": existing[i].active}) if not s.slug and i < len(existing)
        else s
        for i, s in enumerate(copy.schedules)
    ]  # fmt: skip
    return copy.model_copy(update={"schedules": schedules})
