"""The schedule as deployed: `prefect.yaml`'s `detect-storage-changes` polls every 10 minutes
(seed 000: "the triggering controller polls discovery every 10 minutes"), and the server's
own scheduler fires it: a run it creates is taken by the worker and polls the cluster.

Issue 29: the schedule's behaviour is the unit under test here: read back from the server,
then fired once by the scheduler, and the run judged by what it wrote to the cluster. What a
poll does (a first sight, a switch, the migration it requests, the refinement) is the flow's
behaviour, tested by calling the flow: tests/integration/test_detection_lifecycle.py (the seed's
life cycle of a StorageState, poll after poll), test_ha_migration.py
(run-migrations ends with a poll that refines at once), test_first_install.py. An earlier
version of this test waited here for that whole chain (poll, migration, poll that refines, a
switch, the same again) on a schedule of 5 s, flow run after flow run: it timed out after
420 s on a loaded machine.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from shared_stack import DETECTION, paused_detection, runs_under_way

from devstack import PrefectStack
from storage_migrator.detection.states import list_states
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.discovery import discover
from storage_migrator.settings import Settings

# The waits below end on events (the scheduler's run created, that run's final state); this
# bounds them all on a loaded 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("migration_crds"), pytest.mark.timeout(900)]

#: Bounds for each event: a slow machine makes them slow, not false.
SCHEDULER_SECONDS = 300
RUN_SECONDS = 420


def test_the_deployed_schedule_polls_every_ten_minutes_and_the_scheduler_fires_it(
    deployed_stack: PrefectStack, kubesim: Any, clean_slate: Any, wait_for: Any
) -> None:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.schedules import IntervalSchedule

    stack = deployed_stack
    with stack.client() as client:
        deployment = client.read_deployment_by_name(DETECTION)
        [schedule] = deployment.schedules
        assert schedule.schedule.interval == timedelta(minutes=10) and schedule.active, schedule
        # One poll at a time: a slow poll never overlaps the next (prefect.yaml).
        assert deployment.global_concurrency_limit is not None and deployment.global_concurrency_limit.limit == 1
        assert deployment.concurrency_options is not None
        assert deployment.concurrency_options.collision_strategy.value == "CANCEL_NEW"

        # Fired soon: the same schedule every 10 seconds instead of 10 minutes, so that its next
        # run is due within seconds whenever the scheduler looks (an anchor in the near future
        # would be a guess at when that is); and told not to start run-migrations, which would
        # migrate every resource of the shared cluster (dozens of flow runs this test is not
        # about). Resuming the deployment has the scheduler see it within seconds (Prefect's
        # recent-deployments scheduler); the tier keeps it paused otherwise.
        fired = datetime.now(UTC)
        client.update_deployment_schedule(deployment.id, schedule.id,
                                          schedule=IntervalSchedule(interval=timedelta(seconds=10)),
                                          parameters={"start_migrations": False})  # fmt: skip
        client.resume_deployment(deployment.id)
    try:

        def scheduled_runs() -> list[Any]:
            """The deployment's runs the scheduler created (none by hand: `auto_scheduled`)."""
            with stack.client() as client:
                runs = client.read_flow_runs(
                    deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))
                )
            return [r for r in runs if r.auto_scheduled]

        # The first of them: later ones may find it still running and end Cancelled (CANCEL_NEW).
        runs = wait_for(scheduled_runs, timeout=SCHEDULER_SECONDS, what="the scheduler's runs of the poll")
        run = min(runs, key=lambda r: r.expected_start_time)
        ended = wait_for(lambda: (r := _read(stack, run.id)).state and r.state.is_final() and r,
                         timeout=RUN_SECONDS, what=f"the scheduled poll {run.name} to end")  # fmt: skip
    finally:
        paused_detection(stack)
        with stack.client() as client:
            client.update_deployment_schedule(deployment.id, schedule.id, schedule=schedule.schedule,
                                              parameters=schedule.parameters)  # fmt: skip
        # A later poll the worker had already taken ends before the cluster is wiped (clean_slate).
        wait_for(lambda: not runs_under_way(stack), timeout=RUN_SECONDS, what="the scheduled polls to end")
    assert ended.state.is_completed(), ended.state.message
    assert ended.auto_scheduled and ended.parameters == {"start_migrations": False}

    # The poll ran against the cluster: configmaps' StorageState, seen for the first time, holds
    # the hash discovery serves now and "Unknown" as what may be persisted (seed 000).
    api = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    served = next(r for r in discover(api).resources if r.group == "" and r.resource == "configmaps")
    state = next(s for s in list_states(api) if s.metadata.name == "configmaps")
    assert state.status.current_storage_version_hash == served.storage_version_hash
    assert state.status.persisted_storage_version_hashes == ["Unknown"]
    assert state.status.last_heartbeat_time is not None and state.status.last_heartbeat_time >= fired - timedelta(
        seconds=1)  # fmt: skip


def _read(stack: PrefectStack, run_id: Any) -> Any:
    with stack.client() as client:
        return client.read_flow_run(run_id)
