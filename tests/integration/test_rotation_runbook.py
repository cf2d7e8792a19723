"""docs/key-rotation.md, step by step, on kubesim reading kube-apiserver's EncryptionConfiguration file.

Issue 11: "The same rotation with concurrent writers creating, updating and
deleting Secrets, and 20% injected faults: same result, no writer's update
lost", and the runbook's steps are "the real ones": the file is edited, the
server reloads it, `rotate-encryption-key` runs, `verify-etcd` and the test's
own etcd reads agree, then the old key is removed and every object still reads.
Seed 003: data must be migrated "after choosing a new write key and before
removing an old read key".
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import install_migration_crds
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from rotation_fixtures import SECRET1, SECRET2, SecretWriters, config, create_secrets, stored_keys, wait

from kubesim.admin import Admin
from kubesim.cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]

#: Of each resource: three chunks of CHUNK (issue 29: the smallest size with more than one chunk
#: under writers and faults; it was 300 in chunks of 100).
N, CHUNK = 120, 40


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Cluster, Path]]:
    path = tmp_path / "encryption-config.yaml"
    path.write_text(config(("key1", SECRET1)))
    with Cluster(encryption_config=path, automatic_reload=True, reload_interval=0.2) as own:
        own.write_kubeconfig(tmp_path / "kubeconfig")
        yield own, path


def test_the_runbook_rotates_key1_to_key2_under_writers_and_faults(
    cluster: tuple[Cluster, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.rotate_encryption_key import rotate_encryption_key
    from storage_migrator.cli import main

    own, path = cluster
    admin = Admin(own.server.url)
    api = k8s_config.new_client_from_config(config_file=str(own.kubeconfig))
    install_migration_crds(api)
    core = k8s.CoreV1Api(api)
    ns = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ns)))
    create_secrets(api, ns, N)  # the data set, made in parallel (issue 29)

    def config_map(i: int) -> None:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"c-{i:04d}"}, "data": {"v": f"c{i}"}}
        answer = core.create_namespaced_config_map(ns, body, _preload_content=False)
        answer.read()
        answer.release_conn()

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(config_map, range(N)))

    def write_key() -> str | None:
        rules = admin.config()["encryption"]["providerConfig"]["resources"]
        return next(r["writeKey"] for r in rules if r["resource"] == "secrets")

    # Step 1: key2 as a read key. Step 2: key2 the write key.
    path.write_text(config(("key1", SECRET1), ("key2", SECRET2)))
    wait(lambda: "key2" in admin.config()["encryption"]["keys"], "the reload adding key2")
    path.write_text(config(("key2", SECRET2), ("key1", SECRET1)))
    wait(lambda: write_key() == "key2", "the reload making key2 the write key")

    # Step 3 under concurrent writers and faults on a fifth of the migrator's requests.
    writers = SecretWriters(k8s_config.new_client_from_config(config_file=str(own.kubeconfig)), ns)
    faults = [
        {"verb": verb, "resource": resource, "rate": 0.05, **fault}
        for verb in ("list", "patch")
        for resource in ("secrets", "configmaps")
        for fault in ({"code": 503}, {"code": 429, "retry_after": 0}, {"drop": True}, {"latency": 0.05, "code": 500})
    ]  # fmt: skip
    admin.set_faults(faults)
    # Short backoffs: this test is about what survives the faults, not how long the migrator
    # waits between tries (tests/unit/migration/test_backoff.py); the defaults made it take 90 s. 8 attempts
    # per object instead of 6, as in test_chaos.py: each of these faults fails a request (18.5% of
    # them), so the 6 + 1 tries of one object all fail once in ~135,000 objects, about once in 110
    # runs of this test's 1,200 writes when it had 300 of each (seen in CI: "s-0166 (429 TooManyRequests)");
    # 8 + 1: once in 3,000 then, and once in ~8,000 with its 480 writes now.
    monkeypatch.setenv("STORAGE_MIGRATOR_BACKOFF_BASE_SECONDS", "0.05")
    monkeypatch.setenv("STORAGE_MIGRATOR_BACKOFF_MAX_SECONDS", "0.5")
    monkeypatch.setenv("STORAGE_MIGRATOR_MAX_WRITE_ATTEMPTS", "8")
    writers.start()
    try:
        state = rotate_encryption_key(key="key2", kubeconfig=str(own.kubeconfig), write_rate_per_second=3000.0,
                                      chunk_size=CHUNK, return_state=True)  # fmt: skip
    finally:
        writers.stop.set()
        writers.join(timeout=30)
        fired = sum(rule["fired"] for rule in admin.faults())
        admin.clear_faults()
    assert fired > 0, "faults were injected"
    assert state.is_completed(), state.message
    summary = state.result()
    assert {r.resource for r in summary.resources} == {"secrets", "configmaps"}
    assert all(r.verified and r.verify_rewritten == 0 for r in summary.resources)
    assert min(writers.counts.values()) > 0, writers.counts

    # The proof where etcd can be read: verify-etcd and the test's own read agree.
    for resource in ("secrets", "configmaps"):
        prefix = f"/registry/{resource}/"
        ours = stored_keys(own, prefix)
        assert set(ours.values()) == {"key2"}, f"{resource} not all under key2"
        assert main(["verify-etcd", own.etcd_url, prefix, "-o", "json", "--expect-key", "key2"]) == 0
        counted = json.loads(capsys.readouterr().out)
        assert counted["by_key"] == {"key2": len(ours)}
        assert counted["total"] == len(ours) and counted["unknown"] == 0

    # Step 4: the old key goes; everything still reads, with what was last written.
    path.write_text(config(("key2", SECRET2)))
    wait(lambda: admin.config()["encryption"]["keys"] == ["key2"], "the reload removing key1")
    for i in range(N):
        assert base64.b64decode(core.read_namespaced_secret(f"s-{i:04d}", ns).data["v"]).decode() == f"s{i}"
        assert core.read_namespaced_config_map(f"c-{i:04d}", ns).data == {"v": f"c{i}"}
    for name, value in writers.expected.items():
        assert base64.b64decode(core.read_namespaced_secret(name, ns).data["v"]).decode() == value, name
    remaining = {s.metadata.name for s in core.list_namespaced_secret(ns).items if s.metadata.name.startswith("w-")}
    assert remaining == set(writers.expected), "a deleted Secret came back or an acknowledged one is missing"
    api.close()
