"""Whoever holds the Prefect API can start our flows, and nothing else (issue 35).

The issue's set-up, attacked as its reporter did: one kubesim cluster with a token kubeconfig,
the session's Prefect server (with auth: tests/prefect_server.py), a pull-mode cluster's
deployment on a pool of its own, and `storage-migrator worker --pool POOL` holding only that
cluster's kubeconfig (STORAGE_MIGRATOR_CLUSTER, STORAGE_MIGRATOR_KUBECONFIG). Every attack is
made with the auth string in hand, through the API, as `prefect deployment run --job-variable`
or `prefect work-pool update` make it:

- the pool's base job template rewritten (command, env, working directory): every run meets it;
- on one run, `command` set through the job variables; `env` (STORAGE_MIGRATOR_CLUSTER of
  another cluster, PYTHONPATH to a sitecustomize of the attacker's); `image`,
  `service_account_name`; `working_dir` (a directory whose `flow_runner` package would shadow
  ours under `python -m`);
- a pull step added to the deployment; an entrypoint changed to a module of the attacker's;
- a parameter that names another cluster.

"Each is judged by what ran and by etcd": every payload writes a file of its own in `stolen/`
(the kubeconfig, token included, as the issue's did), which must not exist; each run's state,
and for a refused one its one-line message; kubesim's request counters (no request of any verb
on Secrets) and etcd (the Secrets' mod revisions). The attacks run at once, on one worker.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until
from crd_install import install_migration_crds
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.client.schemas.objects import FlowRun
from prefect.workers.process import ProcessWorker

from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.etcd import prefix_end
from storage_migrator.fleet.names import identity_variable
from storage_migrator.fleet.run_admission import SET_WORKING_DIRECTORY

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
MIGRATE = "flows/migrate_resource.py:migrate_resource"
OUR_PULL_STEPS = [{SET_WORKING_DIRECTORY: {"directory": str(ROOT)}}]
SECRETS = b"/registry/secrets/"


@dataclass
class Scene:
    name: str  # the cluster's, and its deployments'
    pool: str
    kubeconfig: Path
    stolen: Path  # where every payload would write
    evil: Path  # the attacker's code, as if it had reached the worker's machine
    admin: Admin
    cluster: Cluster
    worker_log: Path

    def secrets(self) -> dict[bytes, int]:
        etcd = self.cluster.etcd()
        try:
            return {bytes(kv.key): kv.mod_revision for kv in etcd.range(SECRETS, prefix_end(SECRETS)).kvs}
        finally:
            etcd.close()


def payload(scene: Scene, attack: str) -> str:
    """A shell command that copies the cluster's kubeconfig (its token) and the environment to `stolen/<attack>`."""
    mark = scene.stolen / attack
    return f"sh -c 'cat {scene.kubeconfig} > {mark}; env >> {mark}'"


def python_payload(scene: Scene, attack: str) -> str:
    return (f"import os, shutil\nshutil.copy({str(scene.kubeconfig)!r}, {str(scene.stolen / attack)!r})\n"
            f"open({str(scene.stolen / attack)!r}, 'a').write(str(dict(os.environ)))\n")  # fmt: skip


def the_attackers_code(scene: Scene) -> None:
    """What the attacks point at: a sitecustomize (PYTHONPATH), a `flow_runner` package (a working
    directory that `python -m` would import from first) and a flow module (an entrypoint)."""
    scene.evil.mkdir()
    (scene.evil / "sitecustomize.py").write_text(python_payload(scene, "env-pythonpath"))
    (scene.evil / "flow_runner").mkdir()
    (scene.evil / "flow_runner" / "__init__.py").write_text(python_payload(scene, "working-dir"))
    (scene.evil / "flow_runner" / "__main__.py").write_text("")
    (scene.evil / "evil.py").write_text(python_payload(scene, "entrypoint")
                                        + "from prefect import flow\n\n@flow\ndef run(**kw):\n    pass\n")  # fmt: skip


def _deployment(client: SyncPrefectClient, flow_id: Any, scene: Scene, name: str, **changes: Any) -> Any:
    """A pull-mode copy as `storage-migrator fleet add NAME --pool POOL` makes it (prefect.yaml's entrypoint
    and pull step), with `changes` made through the API."""
    fields: dict[str, Any] = {
        "flow_id": flow_id, "name": name, "entrypoint": MIGRATE, "pull_steps": OUR_PULL_STEPS,
        "work_pool_name": scene.pool, "tags": [f"cluster:{scene.name}", "mode:pull"],
        "parameters": {"resource": "configmaps", "cluster": scene.name, "write_rate_per_second": 2000.0},
    }  # fmt: skip
    return client.create_deployment(**{**fields, **changes})


def _rewritten_template(scene: Scene) -> dict[str, Any]:
    """Prefect's process template with the attacker's defaults: a command, an environment, a working directory."""
    template = ProcessWorker.get_default_base_job_template()
    variables = template["variables"]["properties"]
    variables["command"]["default"] = payload(scene, "pool-template-command")
    variables["env"]["default"] = {"PYTHONPATH": str(scene.evil), "STORAGE_MIGRATOR_CLUSTER": "b"}
    variables["working_dir"]["default"] = str(scene.evil)
    return template


@pytest.fixture(scope="module")
def scene(prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    home = tmp_path_factory.mktemp("attack")
    tokens = home / "tokens.csv"
    tokens.write_text("")  # kubesim authenticates the kubeconfig's own token only
    name = f"a-{uuid.uuid4().hex[:6]}"
    with Cluster(token_auth_file=tokens) as cluster:
        scene = Scene(name=name, pool=f"storage-migrator-{name}", kubeconfig=home / "a.kubeconfig",
                      stolen=home / "stolen", evil=home / "evil", admin=Admin(cluster.server.url),
                      cluster=cluster, worker_log=home / "worker.log")  # fmt: skip
        cluster.write_kubeconfig(scene.kubeconfig)
        scene.admin = Admin.from_kubeconfig(scene.kubeconfig)
        scene.stolen.mkdir()
        the_attackers_code(scene)
        with k8s_config.new_client_from_config(config_file=str(scene.kubeconfig)) as api:
            install_migration_crds(api)
            core = k8s.CoreV1Api(api)
            core.create_namespaced_config_map("default", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="cm")))
            core.create_namespaced_secret("default", k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="sentinel"),
                                                                  string_data={"v": secrets.token_hex(8)}))  # fmt: skip
            uid = str(core.read_namespace("kube-system").metadata.uid)
        with get_client(sync_client=True) as client:
            client.create_work_pool(WorkPoolCreate(name=scene.pool, type="process",
                                                   base_job_template=ProcessWorker.get_default_base_job_template()))  # fmt: skip
            # The identity pinned before the first run (`fleet add --uid`): the runs start at once.
            client.create_variable(_variable(identity_variable(name), uid))
        env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_HOME": str(home / "prefect"),
               "PREFECT_WORKER_QUERY_SECONDS": "1", "DO_NOT_TRACK": "1",
               "STORAGE_MIGRATOR_CLUSTER": name, "STORAGE_MIGRATOR_KUBECONFIG": str(scene.kubeconfig)}  # fmt: skip
        env.pop("KUBECONFIG", None)
        with scene.worker_log.open("wb") as log:
            worker = subprocess.Popen([str(Path(sys.executable).with_name("storage-migrator")), "worker", "--pool",
                                       scene.pool, "--name", f"worker-{name}", "--limit", "8"], cwd=ROOT, env=env,
                                      stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            yield scene
        finally:
            worker.terminate()
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            with get_client(sync_client=True) as client:
                for deployment in client.read_deployments(limit=200):
                    if f"cluster:{name}" in (deployment.tags or []):
                        client.delete_deployment(deployment.id)
                client.delete_work_pool(scene.pool)
                client.delete_variable_by_name(identity_variable(name))


def _variable(name: str, uid: str) -> Any:
    from prefect.client.schemas.actions import VariableCreate

    return VariableCreate(name=name, value={"uid": uid})


def _final(client: SyncPrefectClient, run_id: Any) -> FlowRun | None:
    run = client.read_flow_run(run_id)
    return run if run.state is not None and run.state.is_final() else None


def test_the_api_starts_our_flows_and_nothing_else(scene: Scene) -> None:
    before = scene.secrets()
    scene.admin.reset_counters()
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("migrate-resource")
        ours = _deployment(client, flow_id, scene, scene.name)
        # A pull step added, an entrypoint of the attacker's: deployments rewritten through the API.
        shell_step = {"prefect.deployments.steps.run_shell_script": {"script": payload(scene, "pull-step")}}
        pulled = _deployment(client, flow_id, scene, f"{scene.name}-pull", pull_steps=[*OUR_PULL_STEPS, shell_step])
        entry = _deployment(client, flow_id, scene, f"{scene.name}-entry",
                            entrypoint=f"{scene.evil / 'evil.py'}:run")  # fmt: skip
        # The pool's base job template rewritten through the API: every run below meets it.
        client.update_work_pool(scene.pool, WorkPoolUpdate(base_job_template=_rewritten_template(scene)))

        def run(deployment: Any, **kwargs: Any) -> Any:
            return client.create_flow_run_from_deployment(deployment, **kwargs).id

        # Each payload writes a file of its own, so one run can carry several job variables and
        # still say which one ran; the runs without job variables meet the rewritten template alone.
        job_variables = {
            "command": payload(scene, "command"),
            "env": {"STORAGE_MIGRATOR_CLUSTER": "b", "PYTHONPATH": str(scene.evil),
                    "STORAGE_MIGRATOR_KUBECONFIG": str(scene.evil)},
            "image": "attacker.example/evil:latest", "service_account_name": "default",
            "working_dir": str(scene.evil),
        }  # fmt: skip
        runs = {
            "job variables": run(ours, job_variables=job_variables),
            "pull step": run(pulled),
            "entrypoint": run(entry),
            "another cluster": run(ours, parameters={"cluster": "b"}),
        }
        done: dict[str, FlowRun] = wait_until(
            lambda: (found := {k: _final(client, r) for k, r in runs.items()}) and all(found.values()) and found,
            what="every attack's flow run to end", timeout=420,
        )  # fmt: skip
        log = scene.worker_log.read_text(errors="replace")[-4000:]

        states = {k: (r.state.type.value, r.state.message) for k, r in done.items() if r.state is not None}

        # Nothing of the attacker's ran: no payload wrote its file.
        assert sorted(p.name for p in scene.stolen.iterdir()) == [], (states, log)

        # The job variables and the pool's template were not applied: our flow ran, for this cluster.
        assert states["job variables"][0] == "COMPLETED", (states, log)
        assert f"cluster:{scene.name}" in (done["job variables"].tags or []), done["job variables"].tags
        # What the runner refused, in one line each.
        refused = {k: v for k, v in states.items() if v[0] != "COMPLETED"}
        assert {k: v[0] for k, v in refused.items()} == dict.fromkeys(("pull step", "entrypoint", "another cluster"),
                                                                     "FAILED"), states  # fmt: skip
        for attack, (_, message) in refused.items():
            assert message and "\n" not in message, (attack, message)
            assert message.startswith("refused by storage-migrator-run (issue 35): "), (attack, message)
        assert (f"has the pull steps [{SET_WORKING_DIRECTORY}, prefect.deployments.steps.run_shell_script]"
                in str(refused["pull step"][1]))  # fmt: skip
        assert f"names the entrypoint '{scene.evil / 'evil.py'}:run', which is not one of the flows" in str(
            refused["entrypoint"][1]
        )
        assert (f"this flow run is for cluster 'b', and the worker that took it serves cluster '{scene.name}'"
                in str(refused["another cluster"][1]))  # fmt: skip

        # The worker says on the run which job variables it did not apply (names, never values).
        def said() -> list[str]:
            logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[runs["job variables"]])))
            return [entry.message for entry in logs if "applies no job variable" in entry.message]

        [warning] = wait_until(said, what="the worker's warning on the run with job variables", timeout=60)
        assert "command, env, image, service_account_name, working_dir not applied" in warning, warning
        assert "sh -c" not in warning and str(scene.evil) not in warning, warning

    # The cluster's Secrets: no request of any verb reached them, and etcd holds them as before.
    touched = {k: n for k, n in scene.admin.counters()["requestsByResource"].items() if k.endswith(" secrets")}
    assert touched == {}, touched
    assert scene.secrets() == before
