"""A cluster's copy of a template deployment (issue 20 item 3), and the flows a cluster needs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from storage_migrator.fleet.deployments import (
    FLEET_FLOWS,
    DeploymentSpec,
    ScheduleSpec,
    cluster_of,
    engine_of,
    for_cluster,
    keeping_pauses,
    mode_of,
)

ROOT = Path(__file__).resolve().parents[3]

TEMPLATE = DeploymentSpec(
    flow_id="0b7f6c1e-0000-4000-8000-000000000001", flow_name="detect-storage-changes",
    name="detect-storage-changes", description="One poll.", entrypoint="flows/x.py:x",
    work_pool_name="storage-migrator-local", work_queue_name="default", job_variables={"image": "i"},
    parameters={"settle_seconds": 30}, tags=["storage-migrator"], concurrency_limit=1,
    collision_strategy="CANCEL_NEW",
    parameter_openapi_schema={"type": "object", "properties": {"cluster": {"type": "string"}}},
    schedules=[ScheduleSpec(schedule={"interval": 600.0}, active=False, parameters={"cluster": "other"})],
)  # fmt: skip


def test_every_deployment_of_prefect_yaml_is_one_a_cluster_gets() -> None:
    """A flow deployed without a copy per cluster would start its children for no cluster at all."""
    deployed = [d["name"] for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]]
    assert sorted(deployed) == sorted(FLEET_FLOWS)


def test_a_copy_is_the_template_with_the_cluster_as_parameter_tag_and_name() -> None:
    copy = for_cluster(TEMPLATE, "prod-eu")
    assert copy.full_name == "detect-storage-changes/prod-eu"
    assert copy.parameters == {"settle_seconds": 30, "cluster": "prod-eu"}
    assert copy.tags == ["storage-migrator", "cluster:prod-eu", "mode:push"] and mode_of(copy.tags) == "push"
    # A schedule may not point its runs at another cluster; paused stays paused.
    assert copy.schedules == [ScheduleSpec(schedule={"interval": 600.0}, active=False, parameters={})]
    assert copy.description is not None and copy.description.startswith("One poll.") and "prod-eu" in copy.description
    unchanged = TEMPLATE.model_dump(exclude={"name", "parameters", "tags", "schedules", "description"})
    assert copy.model_dump(exclude={"name", "parameters", "tags", "schedules", "description"}) == unchanged
    assert copy.takes_cluster and not TEMPLATE.model_copy(update={"parameter_openapi_schema": {}}).takes_cluster


def test_a_copy_of_a_copy_is_tagged_for_one_cluster_only() -> None:
    twice = for_cluster(for_cluster(TEMPLATE, "a"), "b")
    assert twice.tags == ["storage-migrator", "cluster:b", "mode:push"] and cluster_of(twice.tags) == "b"
    assert cluster_of(TEMPLATE.tags) is None


@pytest.mark.parametrize("name", ["default", "Prod", "a/b", ""])
def test_the_environments_cluster_and_names_no_block_can_have_are_refused(name: str) -> None:
    """`default/flow` would overwrite the templates themselves."""
    with pytest.raises(ValueError):
        for_cluster(TEMPLATE, name)


def test_an_update_keeps_what_the_operator_paused_or_resumed_on_the_clusters_schedules() -> None:
    """A new copy's schedule is paused as the template's; the cluster's own choice outlives an upgrade."""
    copy = for_cluster(TEMPLATE, "prod-eu")  # the template's schedule is paused
    resumed = [copy.schedules[0].model_copy(update={"active": True})]
    assert [s.active for s in keeping_pauses(copy, resumed).schedules] == [True]
    assert [s.active for s in keeping_pauses(copy, []).schedules] == [False], "no schedule of its own yet"
    slugged = copy.model_copy(update={"schedules": [s.model_copy(update={"slug": "poll"}) for s in copy.schedules]})
    other_slug = [ScheduleSpec(schedule={"interval": 60.0}, active=True, slug="other")]
    assert [s.active for s in keeping_pauses(slugged, other_slug).schedules] == [False], "another schedule's state"
    same_slug = [ScheduleSpec(schedule={"interval": 60.0}, active=True, slug="poll")]
    assert [s.active for s in keeping_pauses(slugged, same_slug).schedules] == [True]


def test_a_pull_mode_copy_goes_to_the_clusters_own_pool() -> None:
    """Issue 30: "`storage-migrator fleet add NAME --pool POOL` gives cluster NAME its deployments
    on a work pool (or a queue) of its own." Everything else is the template's, as in push mode."""
    copy = for_cluster(TEMPLATE, "prod-eu", pool="pool-eu")
    assert (copy.work_pool_name, copy.work_queue_name) == ("pool-eu", None), "the pool's default queue"
    assert copy.tags == ["storage-migrator", "cluster:prod-eu", "mode:pull"] and mode_of(copy.tags) == "pull"
    assert "STORAGE_MIGRATOR_CLUSTER=prod-eu" in (copy.description or "")
    queued = for_cluster(TEMPLATE, "prod-eu", pool="shared", queue="prod-eu")
    assert (queued.work_pool_name, queued.work_queue_name) == ("shared", "prod-eu")
    assert for_cluster(copy, "prod-us").tags == ["storage-migrator", "cluster:prod-us", "mode:push"], (
        "a copy of a copy says its own mode"
    )
    unchanged = TEMPLATE.model_dump(exclude={"name", "parameters", "tags", "schedules", "description",
                                             "work_pool_name", "work_queue_name"})  # fmt: skip
    assert copy.model_dump(exclude={"name", "parameters", "tags", "schedules", "description", "work_pool_name",
                                    "work_queue_name"}) == unchanged  # fmt: skip


def test_an_engine_is_a_tag_of_every_copy_and_the_parameter_of_those_that_take_it() -> None:
    """Issue 36: `fleet add NAME --engine in-tree`: shown by `fleet list` (the tag); every migration of the cluster
    runs through its migrate-resource copy (the parameter). In pull mode its runs refuse it unless the install
    runs the same engine (flows/cluster_scope.py): the cluster decides."""
    migrate = TEMPLATE.model_copy(update={"flow_name": "migrate-resource", "parameters": {}, "parameter_openapi_schema":
                                          {"properties": {"cluster": {}, "engine": {}}}})  # fmt: skip
    copy = for_cluster(migrate, "prod-eu", engine="in-tree")
    assert copy.parameters == {"cluster": "prod-eu", "engine": "in-tree"}
    assert copy.tags[-1] == "engine:in-tree" and engine_of(copy.tags) == "in-tree"
    poll = for_cluster(TEMPLATE, "prod-eu", pool="pool-eu", engine="auto")  # takes no engine: the tag only
    assert "engine" not in poll.parameters and engine_of(poll.tags) == "auto"
    again = for_cluster(copy, "prod-us")  # a copy of a copy carries no engine it was not given
    assert engine_of(again.tags) is None and "engine" not in again.parameters
    assert engine_of(for_cluster(copy, "prod-us", engine="client").tags) == "client"
