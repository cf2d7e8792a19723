"""The guided key rotation end to end (issue 19 item 3), on a kubesim of 3 servers.

Issue 19: "The guided flow end to end: it is driven through the Prefect API
(`resume_flow_run` with input), as the UI's form would drive it; a 'done' given
before the servers changed does not advance it; it is killed in phase 3 and resumed."
And: "Then it waits until every server's hash has moved to one new common value
before it goes on. 'Done' clicked too early is never taken as done. The phase
reached is recorded, so a crashed or cancelled run resumes at its phase."

The flow runs in a process of its own (so that it can be killed), against the
session's Prefect server; the test plays the operator: it edits each server's
EncryptionConfiguration file and submits the form through the API.

Its waits end on events (issue 29): the kill lands while the re-encryption is held
at a known object (a 429 until the kill), not at a write pace slow enough for a
poll to catch it mid-way; the refused second runbook runs in the test's process
(a flow called as it is, without a third interpreter's start).
"""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from rotation_fixtures import KEY1, KEY2, SECRET1, SECRET2, SharedThreeServers, ThreeServers, stored_keys, wait

from kubesim.cluster import Cluster

pytestmark = [pytest.mark.integration]
pytest_plugins = ["rotation_cluster"]  # one cluster of three servers for the module (issue 29)

ROOT = Path(__file__).resolve().parents[2]
#: Three chunks of CHUNK (issue 29: the smallest size with chunks before and after the kill; was 240).
SECRETS, CHUNK = 60, 20
#: The object whose rewrite is held until the kill: in the second chunk, so the first is checkpointed.
HELD = "s-0030"
#: "done" given too early is checked for this long before the form asks again (no server ever
#: changes then); the "done"s given after the change pass at the first check, however short.
SETTLE_SECONDS = 1
ENV = {"STORAGE_MIGRATOR_SERVER_CONFIG_POLL_SECONDS": "0.5", "STORAGE_MIGRATOR_LEASE_SECONDS": "4",
       # the held write is retried once a second until the kill: 100 attempts (the most the setting takes)
       "STORAGE_MIGRATOR_MAX_WRITE_ATTEMPTS": "100"}  # fmt: skip


def flow_run(name: str) -> Any:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])),
                                     sort=FlowRunSort.START_TIME_DESC, limit=1)  # fmt: skip
    return runs[0] if runs else None


def pause_of(run: Any) -> tuple[str, str]:
    """A pause: the run and its pause key (each pause of a run has its own; a new run counts from 1)."""
    return str(run.id), str(run.state.state_details.pause_key)


def paused(name: str, *, after: set[tuple[str, str]]) -> Callable[[], Any]:
    """The newest run of that name, once it is Paused in a pause not in `after`."""

    def check() -> Any:
        run = flow_run(name)
        if run is None or run.state is None or not run.state.is_paused():
            return None
        return run if pause_of(run) not in after else None

    return check


def recorded_phase(key: str) -> str | None:
    from prefect.variables import Variable

    from storage_migrator.rotation.runbook import record_name

    saved = Variable.get(record_name(key))
    return saved["phase"] if isinstance(saved, dict) else None


def active_runbook() -> Any:
    from prefect.variables import Variable

    from storage_migrator.rotation.runbook import ACTIVE_NAME

    return Variable.get(ACTIVE_NAME)


def form_text(run: Any) -> str:
    from prefect.client.orchestration import get_client

    keyset = run.state.state_details.run_input_keyset
    with get_client(sync_client=True) as client:
        return str(client.read_flow_run_input(run.id, keyset["description"]))


def crash(run_id: Any) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run_id, Crashed(message="its process was killed"), force=True)


def submit(run: Any, done: bool = True) -> None:
    from prefect.flow_runs import resume_flow_run

    resume_flow_run(run.id, run_input={"done": done})


@pytest.fixture
def servers(three_servers: SharedThreeServers) -> Iterator[ThreeServers]:
    """The module's three servers, each reading key1 alone, and a namespace of SECRETS Secrets of this
    test's own (rotation_fixtures.SharedThreeServers: what a test may rely on, and what is put back)."""
    with three_servers.borrowed(secrets=SECRETS) as own:
        yield own


def runbook_parameters(key: str, kubeconfig: Path) -> dict[str, Any]:
    return {"key": key, "old_key": "key1", "resources": ["secrets"], "settle_seconds": SETTLE_SECONDS,
            "chunk_size": CHUNK, "write_rate_per_second": 2000, "kubeconfig": str(kubeconfig)}  # fmt: skip


def start_runbook(prefect_api: str, kubeconfig: Path, key: str, log: Path) -> subprocess.Popen[bytes]:
    code = (
        "from flows.rotation_runbook import key_rotation_runbook as f\n"
        f"s = f(**{runbook_parameters(key, kubeconfig)!r}, return_state=True)\n"
        "raise SystemExit(0 if s.is_completed() else 1)\n"
    )
    env = {**os.environ, "PREFECT_API_URL": prefect_api, **ENV}
    with log.open("ab") as out:  # the child has its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def test_the_guided_runbook_gates_each_phase_and_resumes_after_a_kill(
    servers: ThreeServers, prefect_api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, kubeconfig, ns, operator = servers.cluster, servers.kubeconfig, servers.namespace, servers
    key = f"key2-{uuid.uuid4().hex[:6]}"  # the session's Prefect server keeps each runbook's Variable
    name = f"key-rotation-runbook-{key}"
    log = Path(os.environ.get("RUNBOOK_LOG", tmp_path / "runbook.log"))
    first = start_runbook(prefect_api, kubeconfig, key, log)
    try:
        # Phase 1: the form says what to change, with a snippet and no secret.
        pauses: set[tuple[str, str]] = set()
        run = _wait_pause(name, pauses)
        text = form_text(run)
        assert "add the new key as a read key" in text and key in text and "EncryptionConfiguration" in text
        assert SECRET1 not in text and SECRET2 not in text
        # "Done" before any server changed: asked again, at the same phase.
        pauses.add(pause_of(run))
        submit(run)
        run = _wait_pause(name, pauses)
        assert "Not yet" in form_text(run) and recorded_phase(key) == "add-read-key"
        # The operator adds key2 as a read key everywhere: phase 2.
        operator.roll_all(KEY1, KEY2)
        pauses.add(pause_of(run))
        submit(run)
        run = _wait_pause(name, pauses)
        assert recorded_phase(key) == "make-write-key" and "write key" in form_text(run)
        # key2 the write key everywhere: phase 3 runs; killed while it writes (held at HELD).
        operator.roll_all(KEY2, KEY1)
        operator.admins[0].set_faults([{"verb": "patch", "resource": "secrets", "namespace": ns, "name": HELD,
                                        "code": 429, "retry_after": 1}])  # fmt: skip
        pauses.add(pause_of(run))
        submit(run)
        wait(lambda: _chunks_done(cluster, "secrets-" + key) >= 1, "the re-encryption's first chunk", timeout=120)
        wait(lambda: operator.admins[0].faults()[0]["fired"] > 0, f"the re-encryption's write of {HELD} held",
             timeout=120)  # fmt: skip
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
        operator.admins[0].clear_faults()
    assert recorded_phase(key) == "reencrypt"
    assert set(stored_keys(cluster, f"/registry/secrets/{ns}/").values()) == {"key1", "key2"}, "killed part-way"
    # The killed run still says Running, and holds the runbooks' one place: a second runbook
    # is refused, naming it, and writes nothing.
    from flows.rotation_runbook import key_rotation_runbook

    for variable, value in ENV.items():
        monkeypatch.setenv(variable, value)
    other = f"key3-{uuid.uuid4().hex[:6]}"
    refused = key_rotation_runbook(**runbook_parameters(other, kubeconfig), return_state=True)
    assert refused.is_failed(), refused.message
    assert f"another key-rotation runbook is in progress: flow run {run.id} (key {key})" in (refused.message or "")
    assert recorded_phase(other) is None
    # What a process worker does when its run's process dies: the run is marked Crashed.
    crash(run.id)

    second = start_runbook(prefect_api, kubeconfig, key, log)
    try:
        run = _wait_pause(name, pauses)  # resumed at phase 3, which completes; then phase 4's form
        assert recorded_phase(key) == "remove-old-key", log.read_text()[-3000:]
        assert set(stored_keys(cluster, "/registry/secrets/").values()) == {"key2"}
        operator.roll_all(KEY2)
        submit(run)
        assert second.wait(timeout=180) == 0, log.read_text()[-3000:]
    finally:
        if second.poll() is None:
            second.kill()
    assert recorded_phase(key) == "done"
    assert active_runbook() is None, "the finished run gave its place back"
    # Issue 39: phase 5 went through the rerun's path: proven again under the configuration the servers
    # run after the removal, by a new pass that rewrote nothing (the first stays as the record).
    removed = "sha256:" + hashlib.sha256(operator.files[0].read_bytes()).hexdigest()
    passes = verification_passes(cluster, f"secrets-{key}")
    assert passes[f"secrets-{key}-verify-2"] == (removed, 0), passes
    # And a run of the finished runbook (a schedule, an operator checking): phase 5 again, nothing written.
    before, requests = revisions(cluster, ns), set(passes)
    again = key_rotation_runbook(**runbook_parameters(key, kubeconfig), return_state=True)
    assert again.is_completed(), again.message
    assert f"key1 is gone from every API server (they run {removed}" in again.result().message
    assert revisions(cluster, ns) == before and set(verification_passes(cluster, f"secrets-{key}")) == requests
    for server in range(3):
        core = k8s.CoreV1Api(
            k8s_config.new_client_from_config(config_file=str(kubeconfig), context=f"kubesim-{server}")
        )
        for i in range(0, SECRETS, 7):
            assert base64.b64decode(core.read_namespaced_secret(f"s-{i:04d}", ns).data["v"]).decode() == f"s{i}"


def _wait_pause(name: str, after: set[tuple[str, str]]) -> Any:
    return wait_until(paused(name, after=after), what=f"{name} to pause again (pauses so far: {sorted(after)})",
                      timeout=180)  # fmt: skip


def _chunks_done(cluster: Cluster, name: str) -> int:
    api = k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        svm = k8s.CustomObjectsApi(api).get_cluster_custom_object("migration.k8s.io", "v1alpha1",
                                                                  "storageversionmigrations", name)  # fmt: skip
    except k8s.ApiException:
        return 0
    finally:
        api.close()
    return int(((svm.get("status") or {}).get("progress") or {}).get("chunks") or 0)


def verification_passes(cluster: Cluster, request: str) -> dict[str, tuple[str | None, int | None]]:
    """name -> (the configuration hash it ran under, objects it rewrote) of each verification pass of `request`."""
    api = k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        items = k8s.CustomObjectsApi(api).list_cluster_custom_object("migration.k8s.io", "v1alpha1",
                                                                     "storageversionmigrations")["items"]  # fmt: skip
    finally:
        api.close()
    status = {m["metadata"]["name"]: m.get("status") or {} for m in items
              if m["metadata"]["name"].startswith(f"{request}-verify")}  # fmt: skip
    return {
        name: (st.get("encryptionConfigHash"), (st.get("progress") or {}).get("rewritten"))
        for name, st in status.items()
    }


def revisions(cluster: Cluster, namespace: str) -> dict[str, int]:
    """etcd's revision of every Secret of the namespace: a write of any of them moves one."""
    from kubesim.etcd import prefix_end

    prefix = f"/registry/secrets/{namespace}/".encode()
    etcd = cluster.etcd()
    try:
        return {kv.key.decode(): kv.mod_revision for kv in etcd.range(prefix, prefix_end(prefix)).kvs}
    finally:
        etcd.close()
