"""A migration across API server restarts, against kubesim over etcd.

Issue "A restarting API server fails objects for good": "for a few seconds after
each start, before its RBAC caches fill, the server answered `403 Forbidden` ...
to requests it allows a moment later. ... A 403 or 401 right after connection
errors or a `/readyz` failure is not an answer about the object: retry it with
backoff while the server is settling, retry every failed object once more before
the run ends, and fail only what still fails." Done when "a migration across two
kubesim restarts with their 403 window ends `Succeeded`".

The restart tests use a cluster of their own (restarting the session's would
disturb other tests) and judge by what etcd holds.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import install_migration_crds
from kubernetes import client as k8s
from kubernetes.client import ApiClient

from kubesim import tls
from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.etcd import EtcdProcess, free_port, prefix_end
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.migration.chunk_terms import ChunkOptions, add_progress
from storage_migrator.migration.chunks import migrate_chunk
from storage_migrator.migration.pacing import LocalPacer, LocalRateLimiter
from storage_migrator.migration.requests import failure_summary
from storage_migrator.migration.settling import ServerTrouble
from storage_migrator.models import MigrationProgress, ObjectFailure
from storage_migrator.settings import Settings

pytestmark = pytest.mark.integration

SECRETS = ResourceRef(version="v1", resource="secrets")
#: The prefix of a value etcd holds encrypted under key2 (DESIGN 6).
KEY2 = b"k8s:enc:aescbc:v1:key2:"
WINDOW_SECONDS = 2.5
OPTIONS = ChunkOptions(
    limit=40,
    write_concurrency=4,
    max_write_attempts=8,
    backoff_base_seconds=0.05,
    backoff_max_seconds=0.5,
    settle_window_seconds=60.0,
    settle_timeout_seconds=30.0,
)


def http(url: str, method: str = "GET", body: bytes | None = None, ctype: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method, data=body, headers={"Content-Type": ctype} if ctype else {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=tls.client_context()) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


def wait_ready(url: str) -> None:
    deadline = time.monotonic() + 30
    while http(f"{url}/readyz")[0] != 200:
        assert time.monotonic() < deadline, "kubesim never became ready"
        time.sleep(0.05)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster() as own:
        own.write_kubeconfig(tmp_path / "kubeconfig")
        yield own


@pytest.fixture
def api(cluster: Cluster) -> Iterator[ApiClient]:
    assert cluster.kubeconfig is not None
    client = api_client_from_settings(Settings(kubeconfig=cluster.kubeconfig))
    yield client
    client.close()  # type: ignore[no-untyped-call]


def make_secrets(api: ApiClient, count: int) -> str:
    core = k8s.CoreV1Api(api)
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    for i in range(count):
        core.create_namespaced_secret(
            namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=f"s-{i:04d}"), string_data={"k": f"v-{i}"})
        )
    return namespace


def write_keys(cluster: Cluster, namespace: str) -> dict[str, str]:
    """The encryption key of every Secret of `namespace`, read from etcd."""
    etcd = cluster.etcd()
    try:
        prefix = f"/registry/secrets/{namespace}/".encode()
        kvs = etcd.range(prefix, prefix_end(prefix)).kvs
    finally:
        etcd.close()
    keys = {}
    for kv in kvs:
        assert kv.value.startswith(b"k8s:enc:aescbc:v1:"), kv.key
        keys[kv.key.decode().rsplit("/", 1)[1]] = kv.value.split(b":")[4].decode()
    return keys


class Restarter(threading.Thread):
    """Restarts API server 0 (with its 403 window) each time `at` many Secrets are under key2.

    It counts them from etcd's watch of the namespace, from the revision it was made at (issue
    29: each write an event, where a poll read every Secret 20 times a second)."""

    def __init__(self, cluster: Cluster, namespace: str, at: list[int]) -> None:
        super().__init__(daemon=True)
        self.cluster, self.namespace, self.at = cluster, namespace, at
        self.done: list[int] = []
        self.stop = threading.Event()
        self._etcd = cluster.etcd()
        self._since = self._etcd.revision()

    def run(self) -> None:
        prefix = f"/registry/secrets/{self.namespace}/".encode()
        events, cancel = self._etcd.watch(prefix, start_revision=self._since + 1)
        under_key2: set[bytes] = set()
        pending = list(self.at)
        try:
            for batch in events:
                if self.stop.is_set():
                    return
                if isinstance(batch, Exception):
                    raise batch
                under_key2 |= {e.kv.key for e in batch if e.type == "PUT" and e.kv.value.startswith(KEY2)}
                while pending and len(under_key2) >= pending[0]:
                    self.cluster.restart_server(0, down_seconds=0.3, authz_warmup_seconds=WINDOW_SECONDS)
                    self.done.append(pending.pop(0))
                if not pending:
                    return
        finally:
            cancel()
            self._etcd.close()


def test_kubesim_restart_keeps_port_and_data_and_answers_403_while_warming(cluster: Cluster, api: ApiClient) -> None:
    """kubesim "after it starts answers 403 for a configurable time": a PATCH gets
    the real RBAC Status and /readyz fails bootstrap-roles; afterwards both are 200,
    on the same port, with the data kept."""
    namespace = make_secrets(api, 2)
    url = cluster.server.url
    patch = f"{url}/api/v1/namespaces/{namespace}/secrets/s-0001"

    server = cluster.restart_server(0, authz_warmup_seconds=30.0)

    assert server.url == url
    code, body = http(patch, "PATCH", b"{}", "application/merge-patch+json")
    assert code == 403
    assert json.loads(body) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": f'secrets "s-0001" is forbidden: User "system:serviceaccount:default:kubesim" cannot patch '
                   f'resource "secrets" in API group "" in the namespace "{namespace}"',
        "reason": "Forbidden", "details": {"name": "s-0001", "kind": "secrets"}, "code": 403,
    }  # fmt: skip
    code, body = http(f"{url}/readyz")
    assert (code, body.splitlines()[-1]) == (500, b"readyz check failed")
    assert b"[-]poststarthook/rbac/bootstrap-roles failed: reason withheld" in body
    assert http(f"{url}/livez") == (200, b"ok")
    assert http(f"{url}/api")[0] == 200  # discovery stays open

    cluster.restart_server(0, authz_warmup_seconds=0.0)

    assert http(f"{url}/readyz") == (200, b"ok")
    code, body = http(patch, "PATCH", b"{}", "application/merge-patch+json")
    assert code == 200
    assert json.loads(body)["metadata"]["name"] == "s-0001"


def test_a_migration_across_two_restarts_with_their_403_window_fails_nothing(cluster: Cluster, api: ApiClient) -> None:
    """Done when "a migration across two kubesim restarts with their 403 window
    ends Succeeded": every Secret is re-encrypted under the new key (etcd), no
    object fails, and every listed object settled into one outcome."""
    count = 600  # 15 chunks of 40; a restart at 1/8 and at 1/2 of the way (issue 29: was 1200)
    namespace = make_secrets(api, count)
    admin = Admin(cluster.server.url)
    admin.set_encryption(["key2", "key1"])
    restarter = Restarter(cluster, namespace, at=[75, 300])
    pacer = LocalPacer(LocalRateLimiter(250.0, burst=4))
    trouble = ServerTrouble(window_seconds=OPTIONS.settle_window_seconds)
    progress = MigrationProgress()
    failures: list[ObjectFailure] = []
    settle_waits = 0
    token: str | None = None
    restarter.start()
    try:
        while True:
            chunk = migrate_chunk(api, SECRETS, continue_token=token, options=OPTIONS, pacer=pacer, trouble=trouble)
            progress = add_progress(progress, chunk)
            failures += chunk.failures
            settle_waits += chunk.settle_waits
            token = chunk.token_out
            if token is None:
                break
    finally:
        restarter.stop.set()
        restarter.join(timeout=30)

    assert restarter.done == [75, 300], "both restarts happened while the migration ran"
    assert settle_waits > 0, "the migration met the 403 window"
    assert progress.failed == 0, failure_summary(failures, progress.failed)
    settled = progress.rewritten + progress.unchanged + progress.gone + progress.conflicted + progress.failed
    assert settled == progress.listed >= count
    keys = write_keys(cluster, namespace)
    assert len(keys) == count
    assert set(keys.values()) == {"key2"}


def test_a_real_rbac_403_still_fails_the_object_after_one_more_try(kubesim: Any, namespace: str) -> None:
    """The issue's rule keeps real denials: a 403 from a server that is ready and
    has not failed lately is "an answer about the object". It is tried once, then
    once more at the end of its chunk ("fail only what still fails"), and is
    reported by name; the rest is migrated."""
    client = api_client_from_settings(Settings(kubeconfig=Path(kubesim.kubeconfig)))
    core = k8s.CoreV1Api(client)
    for i in range(12):
        core.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"cm-{i:02d}")))
    kubesim.admin.set_faults(
        [{"verb": "patch", "resource": "configmaps", "namespace": namespace, "name": "cm-07", "code": 403}]
    )
    ref = ResourceRef(version="v1", resource="configmaps")
    progress = MigrationProgress()
    failures: list[ObjectFailure] = []
    settle_waits = 0
    token: str | None = None
    try:
        while True:
            chunk = migrate_chunk(client, ref, continue_token=token, options=OPTIONS.model_copy(update={"limit": 5}))
            progress = add_progress(progress, chunk)
            failures += chunk.failures
            settle_waits += chunk.settle_waits
            token = chunk.token_out
            if token is None:
                break
        fired = [rule["fired"] for rule in kubesim.admin.faults()]
    finally:
        kubesim.admin.clear_faults()
        client.close()  # type: ignore[no-untyped-call]

    assert fired == [2]
    assert settle_waits == 0
    assert progress.failed == 1
    assert [(f.namespace, f.name, f.code, f.reason) for f in failures] == [(namespace, "cm-07", 403, "Forbidden")]
    assert f"{namespace}/cm-07 (403 Forbidden" in failure_summary(failures, progress.failed)


@pytest.mark.usefixtures("prefect_api")
def test_the_migrate_resource_flow_across_two_restarts_ends_succeeded(cluster: Cluster, api: ApiClient) -> None:
    """Done when "a migration across two kubesim restarts with their 403 window ends
    `Succeeded`": the whole flow, whose checkpoints and status writes also meet the
    window (they retry like the writes), and the request's condition is the verdict."""
    from flows.migrate_resource import migrate_resource
    from storage_migrator.conditions import is_condition_true
    from storage_migrator.migration.requests import list_migrations
    from storage_migrator.models import CONDITION_SUCCEEDED

    count = 400  # 10 chunks of 40; a restart at about 1/6 and 4/7 of the way (issue 29: was 600)
    install_migration_crds(api)
    namespace = make_secrets(api, count)
    Admin(cluster.server.url).set_encryption(["key2", "key1"])
    restarter = Restarter(cluster, namespace, at=[70, 230])
    restarter.start()
    try:
        state = migrate_resource(
            resource="secrets", kubeconfig=str(cluster.kubeconfig), chunk_size=40, write_rate_per_second=150.0,
            write_concurrency=4, return_state=True,
        )  # fmt: skip
    finally:
        restarter.stop.set()
        restarter.join(timeout=30)

    assert restarter.done == [70, 230], "both restarts happened while the flow ran"
    assert state.is_completed(), state.message
    (request,) = [m for m in list_migrations(api) if m.spec.resource.resource == "secrets"]
    assert is_condition_true(request.status.conditions, CONDITION_SUCCEEDED), request.status.conditions
    assert request.status.progress is not None and request.status.progress.failed == 0
    keys = write_keys(cluster, namespace)
    assert len(keys) == count
    assert set(keys.values()) == {"key2"}


def test_a_server_started_again_on_its_port_keeps_its_id_and_storage_versions() -> None:
    """kube-apiserver's ID is a hash of its host name (k8s.io/apiserver/pkg/server/config.go,
    KEP-1965), so a crashed server started again is the same server: its StorageVersion
    entries stand and the objects' resourceVersions do not move. A new ID per start made
    every restart look like seed 001's "storage version changed while the migration ran"
    and cost a whole new pass (bench/chaos.py, campaign (c); issue 13)."""
    path = "/apis/internal.apiserver.k8s.io/v1alpha1/storageversions/core.configmaps"
    with EtcdProcess() as etcd:
        port = free_port()
        with Cluster(etcd_url=etcd.url, port=port) as first:
            server_id = first.server.registry.config.server_id
            url = first.server.url
            before = json.loads(http(f"{url}{path}")[1])
        with Cluster(etcd_url=etcd.url, port=port) as again:
            assert again.server.registry.config.server_id == server_id
            code, body = http(f"{url}{path}")
    assert code == 200
    after = json.loads(body)
    assert [e["apiServerID"] for e in after["status"]["storageVersions"]] == [server_id]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
