"""A real schedule: `prefect.yaml` deployed with a short interval on a real Prefect
server, a process worker, and kubesim. A storage version switch is found by a
scheduled `detect-storage-changes` run, migrated, and the StorageState refined —
as the server's flow-run history shows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack import REPO, PrefectStack
from storage_migrator.detection.states import list_states
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.settings import Settings

# Its own waits add up to 780 s (420 + 120 + 240) after a Prefect server, a deploy and a worker
# start (85 s loaded): the suite's 300 s net cut it off on a loaded 2-core CI (it takes 140-270 s
# alone here), and a first refinement took over 240 s twice under extra load.
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("migration_crds"), pytest.mark.timeout(1200)]
GROUP, VERSION = "migration.k8s.io", "v1alpha1"


@pytest.fixture
def scheduled(kubesim: Any, clean_slate: Any, tmp_path: Path) -> Iterator[PrefectStack]:
    text = (REPO / "prefect.yaml").read_text()
    assert "interval: 600" in text
    prefect_file = tmp_path / "prefect.yaml"
    prefect_file.write_text(text.replace("interval: 600", "interval: 5"))
    stack = PrefectStack(
        tmp_path / "prefect-home",
        worker_env={
            "STORAGE_MIGRATOR_KUBECONFIG": kubesim.kubeconfig,
            "STORAGE_MIGRATOR_WRITE_RATE_PER_SECOND": "1000",
            "STORAGE_MIGRATOR_SETTLE_SECONDS": "0",
            "STORAGE_MIGRATOR_MAX_PARALLEL_MIGRATIONS": "4",
            # The test follows ConfigMaps; tracking every resource would only add runs to wait for.
            "STORAGE_MIGRATOR_INCLUDE_RESOURCES": "configmaps",
        },
        # The scheduler service looks for due schedules every 60 s by default.
        server_env={"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2"},
    )
    try:
        stack.start_server()
        stack.deploy(prefect_file)
        stack.start_worker()
        yield stack
    finally:
        stack.stop()


def configmaps_state(kubesim: Any) -> Any:
    api = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    return next((s for s in list_states(api) if s.metadata.name == "configmaps"), None)


def test_a_scheduled_poll_detects_a_switch_and_refines_the_state(
    scheduled: PrefectStack, kubesim: Any, wait_for: Any
) -> None:
    from prefect.client.orchestration import SyncPrefectClient

    # First scheduled polls: the state appears and is refined after the first migration.
    first = wait_for(lambda: (s := configmaps_state(kubesim)) and s.status.persisted_storage_version_hashes == [
        s.status.current_storage_version_hash] and s, timeout=420, what="the first refinement")  # fmt: skip
    old_hash = first.status.current_storage_version_hash
    kubesim.admin.set_storage_version("configmaps", "v2")
    changed = wait_for(lambda: (s := configmaps_state(kubesim)) and s.status.current_storage_version_hash != old_hash
                       and s, timeout=120, what="the poll that sees the switch")  # fmt: skip
    new_hash = changed.status.current_storage_version_hash
    wait_for(lambda: (s := configmaps_state(kubesim)) and s.status.persisted_storage_version_hashes == [new_hash],
             timeout=240, what="the refinement to the new hash")  # fmt: skip

    with SyncPrefectClient(api=scheduled.api_url) as client:
        runs = client.read_flow_runs(limit=200)
        deployments = {d.id: d.name for d in client.read_deployments()}
    polls = [r for r in runs if deployments.get(r.deployment_id) == "detect-storage-changes"
             and r.state and r.state.is_completed()]  # fmt: skip
    assert len(polls) >= 3, "the history shows the scheduled polls"
    assert all(r.auto_scheduled for r in polls), "polls came from the schedule, not by hand"
    migrations = [r for r in runs if deployments.get(r.deployment_id) == "migrate-resource"
                  and r.state and r.state.is_completed() and r.name.startswith("migrate-configmaps-v1-")]  # fmt: skip
    assert len(migrations) >= 2, "one migration on first sight, one after the switch"
