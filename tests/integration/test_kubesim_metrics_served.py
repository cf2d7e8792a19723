"""kubesim's /metrics over real etcd: each server of a rolling update reports its
own identity and the hash of its own EncryptionConfiguration file, as a real
v1.36 server does (tests/reference/apiserver-metrics-encryption-config.txt).

Each test starts a Cluster of its own (its own etcd). Reloads are awaited by
polling /metrics or the admin state with generous deadlines; nothing asserts on time.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Kubectl, Kubesim
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from prometheus_client.parser import text_string_to_metric_families

from kubesim import encryption, leases, metrics, tls
from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.server import ApiServer
from kubesim.server_config import admin_document

RELOAD = 0.2
NS = "default"


# ----- plumbing ---------------------------------------------------------------


def secret_of(byte: bytes) -> str:
    return base64.b64encode(byte * 32).decode()


def write_config(path: Path, *keys: str, valid: bool = True) -> str:
    """Secrets encrypted with `keys` (the first writes), replaced in one step; the file's hash.
    `valid=False`: a secret of the wrong length, which kube-apiserver refuses."""
    secret = secret_of(b"k") if valid else base64.b64encode(b"short").decode()
    aescbc = {"aescbc": {"keys": [{"name": k, "secret": secret} for k in keys]}}
    rule = {"resources": ["secrets"], "providers": [aescbc, {"identity": {}}]}
    doc = {"apiVersion": encryption.API_VERSION, "kind": encryption.KIND, "resources": [rule]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    os.replace(tmp, path)
    return sha256(path.read_bytes())


def sha256(data: bytes | str) -> str:
    return "sha256:" + hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def get_metrics(url: str, token: str | None = None) -> tuple[int, str, str]:
    """Status, Content-Type and body of `GET /metrics`, as a Prometheus scraper asks."""
    conn = tls.connection(url)
    try:
        headers = {"Accept": "text/plain;version=0.0.4"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        conn.request("GET", metrics.PATH, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read().decode()
    finally:
        conn.close()


def families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def labels_in(text: str) -> dict[str, str] | None:
    """The labels of the one encryption-config sample, None when the family is absent."""
    family = families(text).get(metrics.ENCRYPTION_CONFIG_INFO)
    if family is None:
        return None
    assert family.type == "gauge"
    [sample] = family.samples
    assert sample.value == 1
    return dict(sample.labels)


def scrape(server: ApiServer) -> dict[str, str] | None:
    status, ctype, text = get_metrics(server.url)
    assert (status, ctype) == (200, "text/plain; version=0.0.4; charset=utf-8"), text
    return labels_in(text)


def config_hash(server: ApiServer) -> str | None:
    labels = scrape(server)
    return labels["hash"] if labels else None


def wait_until(predicate: Callable[[], Any], *, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def identity_leases(api: k8s.ApiClient) -> set[str]:
    """The names of the identity Leases in kube-system, read through the API."""
    items = (
        k8s.CoordinationV1Api(api)
        .list_namespaced_lease(leases.NAMESPACE, label_selector=f"{leases.IDENTITY_LABEL}=kube-apiserver")
        .items
    )
    return {lease.metadata.name for lease in items}


def write_secret(server: ApiServer, name: str) -> None:
    conn = tls.connection(server.url)
    try:
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": {"v": "eA=="}}
        conn.request("POST", f"/api/v1/namespaces/{NS}/secrets", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})  # fmt: skip
        resp = conn.getresponse()
        assert resp.status == 201, resp.read()
    finally:
        conn.close()


def stored_key(cluster: Cluster, name: str) -> bytes:
    store = cluster.etcd()
    try:
        kv, _ = store.get(f"/registry/secrets/{NS}/{name}".encode())
    finally:
        store.close()
    assert kv is not None
    return bytes(kv.value).split(b":")[4]  # k8s:enc:aescbc:v1:<key>:...


# ----- a rolling update of the file ---------------------------------------------


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    paths = [tmp_path / f"encryption-{i}.yaml" for i in range(3)]
    for path, key in zip(paths, ("key-a", "key-b", "key-c"), strict=True):
        write_config(path, key)
    return paths


@pytest.fixture
def rolling(files: list[Path]) -> Iterator[Cluster]:
    with Cluster(servers=3, encryption_config=files, automatic_reload=True, reload_interval=RELOAD) as cluster:
        yield cluster


def test_each_server_reports_its_identity_and_its_file(rolling: Cluster, files: list[Path], tmp_path: Path) -> None:
    kubeconfig = rolling.write_kubeconfig(tmp_path / "kubeconfig")
    with k8s_config.new_client_from_config(config_file=str(kubeconfig)) as api:
        names = identity_leases(api)
    assert len(names) == 3
    reported = set()
    for i, (server, path) in enumerate(zip(rolling.servers, files, strict=True)):
        labels = scrape(server)
        assert labels is not None
        assert labels["hash"] == sha256(path.read_bytes())
        server_id = Admin(server.url).config()["serverID"]
        assert server_id in names
        assert labels["apiserver_id_hash"] == sha256(server_id)
        reported.add(labels["apiserver_id_hash"])
        # It applies its own file, not only reports it.
        write_secret(server, f"via-{i}")
        assert stored_key(rolling, f"via-{i}") == f"key-{'abc'[i]}".encode()
    assert reported == {sha256(name) for name in names}
    assert len({sha256(path.read_bytes()) for path in files}) == 3


def test_a_reload_changes_only_that_servers_hash(rolling: Cluster, files: list[Path]) -> None:
    before = [config_hash(server) for server in rolling.servers]
    assert len(set(before)) == 3
    new = write_config(files[1], "key-b2", "key-b")
    assert new != before[1]
    wait_until(lambda: config_hash(rolling.servers[1]) == new, what="server 1 to report its new file")
    assert [config_hash(server) for server in rolling.servers] == [before[0], new, before[2]]
    write_secret(rolling.servers[1], "after-reload")
    assert stored_key(rolling, "after-reload") == b"key-b2"

    # An invalid file: the previous configuration, and its hash, stay.
    bad = write_config(files[1], "key-b3", valid=False)
    admin = Admin(rolling.servers[1].url)
    error = wait_until(lambda: admin.config()["encryption"]["providerConfig"]["lastReloadError"],
                       what="server 1 to refuse the invalid file")  # fmt: skip
    assert "secret is not of the expected length" in error
    assert [config_hash(server) for server in rolling.servers] == [before[0], new, before[2]]
    assert bad != new
    write_secret(rolling.servers[1], "after-bad-edit")
    assert stored_key(rolling, "after-bad-edit") == b"key-b2"


def test_restarted_and_added_servers_keep_their_own_file(rolling: Cluster, files: list[Path], tmp_path: Path) -> None:
    before = scrape(rolling.servers[2])
    restarted = rolling.restart_server(2)
    assert (
        scrape(restarted)
        == before
        == {
            "apiserver_id_hash": sha256(restarted.registry.config.server_id),
            "hash": sha256(files[2].read_bytes()),
        }
    )

    with pytest.raises(ValueError, match="files of their own"):
        rolling.add_server()
    extra = tmp_path / "encryption-3.yaml"
    digest = write_config(extra, "key-d")
    added = rolling.add_server(encryption_config=extra)
    labels = scrape(added)
    assert labels == {"apiserver_id_hash": sha256(added.registry.config.server_id), "hash": digest}
    assert [config_hash(server) for server in rolling.servers] == [sha256(p.read_bytes()) for p in [*files, extra]]


# ----- encryption from the admin API, and the switch ------------------------------


def test_admin_encryption_hash_and_the_switch(tmp_path: Path) -> None:
    with Cluster(servers=2) as cluster:
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        first, second = cluster.servers
        default = sha256(admin_document({"secrets"}, ["key1"]))
        assert [config_hash(first), config_hash(second)] == [default, default]

        # One server rotated (a rolling update through the admin API), then the other.
        Admin(second.url).set_encryption(["key2", "key1"])
        rotated = sha256(admin_document({"secrets"}, ["key2", "key1"]))
        assert [config_hash(first), config_hash(second)] == [default, rotated]
        Admin(first.url).set_encryption(["key2", "key1"])
        assert [config_hash(first), config_hash(second)] == [rotated, rotated]
        Admin(first.url).set_encryption(["key2", "key1"], resources=["secrets", "configmaps"])
        assert config_hash(first) == sha256(admin_document({"secrets", "configmaps"}, ["key2", "key1"])) != rotated

        # The switch: /metrics without the family on that server only.
        state = Admin(second.url).set_metrics(encryption_config_info=False)
        assert state["metrics"] == {"encryptionConfigInfo": False}
        assert scrape(second) is None
        assert "process_start_time_seconds" in families(get_metrics(second.url)[2])
        assert config_hash(first) is not None
        Admin(second.url).set_metrics(encryption_config_info=True)
        assert config_hash(second) == rotated

        # The same through `python -m kubesim admin`.
        cli = [sys.executable, "-m", "kubesim", "admin", "--kubeconfig", str(kubeconfig), "--context", "kubesim-0"]
        out = subprocess.run([*cli, "metrics", "--no-encryption-config-info"], capture_output=True, text=True,
                             timeout=60, check=True).stdout  # fmt: skip
        assert json.loads(out) == {"encryptionConfigInfo": False}
        assert scrape(first) is None
        subprocess.run([*cli, "metrics", "--encryption-config-info"], capture_output=True, timeout=60, check=True)
        assert config_hash(first) is not None
        assert Admin(first.url).counters()["requests"]["metrics"] >= 6


# ----- who may read it --------------------------------------------------------


def test_rbac_guards_metrics(tmp_path: Path) -> None:
    """A non-resource URL no default role grants: 403 without a rule for it, 200 with one."""
    alice, bob = secrets.token_hex(8), secrets.token_hex(8)
    tokens = tmp_path / "tokens.csv"
    tokens.write_text(f"{alice},alice,uid-alice\n{bob},bob,uid-bob\n")
    with Cluster(token_auth_file=tokens, authorization_mode="RBAC") as cluster:
        admin_kubeconfig = cluster.write_kubeconfig(tmp_path / "admin.yaml")
        with k8s_config.new_client_from_config(config_file=str(admin_kubeconfig)) as api:
            rbac = k8s.RbacAuthorizationV1Api(api)
            rbac.create_cluster_role({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "metrics-reader"},
                "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]})  # fmt: skip
            rbac.create_cluster_role_binding({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "metrics-reader"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "metrics-reader"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}]})  # fmt: skip
            status, text = read_metrics(api)  # system:masters
            assert status == 200 and metrics.ENCRYPTION_CONFIG_INFO in families(text)

        url = cluster.server.url
        status, _, body = get_metrics(url, alice)
        assert status == 403, body
        doc = json.loads(body)
        assert (doc["reason"], doc["message"]) == ("Forbidden", 'forbidden: User "alice" cannot get path "/metrics"')
        assert get_metrics(url)[0] == 401

        def as_user(token: str) -> k8s.ApiClient:
            doc = yaml.safe_load(admin_kubeconfig.read_text())
            doc["users"] = [{"name": "kubesim-admin", "user": {"token": token}}]
            path = tmp_path / f"{token}.yaml"
            path.write_text(yaml.safe_dump(doc))
            return k8s_config.new_client_from_config(config_file=str(path))

        with as_user(bob) as api:
            status, text = read_metrics(api)
            assert status == 200, text
            labels = labels_in(text)
            assert labels is not None
            assert labels["apiserver_id_hash"] == sha256(cluster.server.registry.config.server_id)
        with as_user(alice) as api:
            status, text = read_metrics(api)
            assert (status, json.loads(text)["message"]) == (403, 'forbidden: User "alice" cannot get path "/metrics"')

        # During the authorization warm-up after a restart only system:masters reads it.
        restarted = cluster.restart_server(0, authz_warmup_seconds=600)
        status, _, body = get_metrics(restarted.url, bob)
        assert (status, json.loads(body)["message"]) == (403, 'forbidden: User "bob" cannot get path "/metrics"')
        assert get_metrics(restarted.url, cluster.access.admin_token)[0] == 200


def read_metrics(api: k8s.ApiClient) -> tuple[int, str]:
    """`GET /metrics` through the official client (its URL and credentials), as a program reading it would."""
    method, url, headers, _, _ = api.param_serialize(
        "GET", metrics.PATH, header_params={"Accept": "text/plain;version=0.0.4"}, auth_settings=["BearerToken"]
    )
    resp = api.call_api(method, url, header_params=headers)
    return resp.status, resp.read().decode()


def test_kubectl_reads_it(kubectl: Kubectl, kubesim: Kubesim) -> None:
    """`kubectl get --raw /metrics` on the shared cluster (encryption from the admin API)."""
    text = kubectl("get", "--raw", metrics.PATH).stdout
    state = kubesim.admin.config()
    labels = labels_in(text)
    assert labels == {
        "apiserver_id_hash": sha256(state["serverID"]),
        "hash": sha256(admin_document(state["encryption"]["resources"], state["encryption"]["keys"])),
    }
