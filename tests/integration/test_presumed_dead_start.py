"""A run the dispatcher presumed dead, which starts after all, writes nothing.

The e2e scale-out test saw it (docs/migrations.md, "Crashes and cancelling"): a flow run
sat 50 s in Submitting on a loaded machine, longer than the lease; the dispatcher marked
it Crashed and resumed its request elsewhere; then its process started, Prefect let it
move from Crashed to Running, and two runs rewrote one resource at once. Seed 003: the
migrations of one resource run one at a time. Run here as a worker runs a flow run
(Prefect's `run_flow` on the stored run), judged by what etcd holds.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Kubesim
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from prefect.client.orchestration import get_client
from prefect.flow_engine import run_flow
from prefect.states import Crashed

from kubesim.etcd import prefix_end
from storage_migrator.migration.dispatch import PRESUMED_DEAD

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api", "migration_crds")]


def revisions(kubesim: Kubesim) -> dict[bytes, int]:
    """key -> mod_revision of every ConfigMap and every StorageVersionMigration, from etcd."""
    out = {}
    for prefix in (b"/registry/configmaps/", b"/registry/migration.k8s.io/storageversionmigrations/"):
        out |= {bytes(kv.key): kv.mod_revision for kv in kubesim.etcd.range(prefix, prefix_end(prefix)).kvs}
    return out


def test_a_run_marked_dead_before_it_started_ends_cancelled_without_writing(kubesim: Kubesim, namespace: str) -> None:
    from flows.migrate_resource import migrate_resource

    with k8s_config.new_client_from_config(config_file=kubesim.kubeconfig) as api:
        k8s.CoreV1Api(api).create_namespaced_config_map(namespace, k8s.V1ConfigMap(
            metadata=k8s.V1ObjectMeta(name="late-start"), data={"k": "v"}))  # fmt: skip
    parameters = {"resource": "configmaps", "kubeconfig": kubesim.kubeconfig}
    with get_client(sync_client=True) as client:
        created = client.create_flow_run(migrate_resource, parameters=parameters)
        message = (f"storageversionmigrations.migration.k8s.io/configmaps-x had no checkpoint, and this run showed "
                   f"Pending, for longer than lease_seconds (90 s): {PRESUMED_DEAD} (...)")  # fmt: skip
        client.set_flow_run_state(created.id, Crashed(message=message), force=True)
        stored_run = client.read_flow_run(created.id)
    before = revisions(kubesim)

    state: Any = run_flow(migrate_resource, flow_run=stored_run, parameters=parameters, return_type="state")

    assert state.is_cancelled(), (state.name, state.message)
    assert "marked this run Crashed before it started" in (state.message or "")
    assert revisions(kubesim) == before, "no request created, no ConfigMap rewritten"
    with get_client(sync_client=True) as client:
        history = [s.type.value for s in client.read_flow_run_states(created.id)]
    assert history[-1] == "CANCELLED" and "CRASHED" in history, history
