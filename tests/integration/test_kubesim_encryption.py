"""kubesim's `--encryption-provider-config` with automatic reload, judged by reading etcd.

Each test starts a Cluster of its own reading an `EncryptionConfiguration` file
in tmp_path, rewrites the file as a runbook would (rotate: new key first; then
drop the old key), and reads the `k8s:enc:aescbc:v1:<key>:` prefix etcd holds.
Reloads are awaited by polling the admin state for the file's hash, with generous
deadlines; nothing asserts on time.

The clusters share one etcd per module (issue 29: an etcd takes about a second to
elect itself): each test's Secrets have names of their own in `default`, and a
test reads only its own, by name.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesim import encryption, tls
from kubesim.cluster import Cluster
from kubesim.etcd import EtcdProcess

MERGE = "application/merge-patch+json"
NS = "default"
KEY1 = base64.b64encode(b"1" * 32).decode()
KEY2 = base64.b64encode(b"2" * 32).decode()
RELOAD = 0.2


# ----- plumbing ---------------------------------------------------------------


def write_config(path: Path, *entries: dict[str, Any]) -> None:
    """Replace the file in one step, as a config-management tool would."""
    doc = {"apiVersion": encryption.API_VERSION, "kind": encryption.KIND, "resources": list(entries)}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    os.replace(tmp, path)


def aescbc(*keys: tuple[str, str]) -> dict[str, Any]:
    return {"aescbc": {"keys": [{"name": n, "secret": s} for n, s in keys]}}


IDENTITY: dict[str, Any] = {"identity": {}}


def call(url: str, method: str, path: str, body: Any = None, *, content_type: str = "application/json") -> Any:
    conn = tls.connection(url)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json", **({"Content-Type": content_type} if data is not None else {})}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def ok(reply: tuple[int, Any], code: int = 200) -> Any:
    status, doc = reply
    assert status == code, doc
    return doc


def secret_path(name: str = "") -> str:
    return f"/api/v1/namespaces/{NS}/secrets" + (f"/{name}" if name else "")


def make_secret(url: str, name: str) -> str:
    body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": {"token": "c2VjcmV0"}}
    return str(ok(call(url, "POST", secret_path(), body), 201)["metadata"]["resourceVersion"])


def noop_patch(url: str, name: str, rv: str) -> str:
    patch = {"metadata": {"resourceVersion": rv}}
    return str(ok(call(url, "PATCH", secret_path(name), patch, content_type=MERGE))["metadata"]["resourceVersion"])


def etcd_value(cluster: Cluster, name: str) -> bytes:
    store = cluster.etcd()
    try:
        kv, _ = store.get(f"/registry/secrets/{NS}/{name}".encode())
    finally:
        store.close()
    assert kv is not None
    return bytes(kv.value)


def provider_state(cluster: Cluster) -> dict[str, Any]:
    return dict(ok(call(cluster.server.url, "GET", "/_kubesim/config"))["encryption"]["providerConfig"])


def wait_until(predicate: Callable[[], Any], *, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def rewrite_and_wait(cluster: Cluster, path: Path, *entries: dict[str, Any]) -> dict[str, Any]:
    """Rewrite the file and wait until the server reports its new hash."""
    write_config(path, *entries)
    digest = encryption.config_hash(path.read_bytes())
    return dict(wait_until(lambda: (s := provider_state(cluster))["hash"] == digest and s, what="the reload"))


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    return tmp_path / "encryption-config.yaml"


@pytest.fixture(scope="module")
def etcd_url() -> Iterator[str]:
    """The module's etcd, under every test's cluster."""
    with EtcdProcess() as etcd:
        yield etcd.url


@pytest.fixture
def cluster(config_path: Path, etcd_url: str) -> Iterator[Cluster]:
    write_config(config_path, {"resources": ["secrets"], "providers": [aescbc(("key1", KEY1)), IDENTITY]})
    with Cluster(etcd_url=etcd_url, encryption_config=config_path, automatic_reload=True,
                 reload_interval=RELOAD) as c:  # fmt: skip
        yield c


# ----- tests ------------------------------------------------------------------


def test_rotation_through_the_file(cluster: Cluster, config_path: Path) -> None:
    """The runbook's steps: add key2 first (key1 still read), rewrite, drop key1."""
    url = cluster.server.url
    old_rv = make_secret(url, "old")
    make_secret(url, "stranded")
    assert etcd_value(cluster, "old").startswith(b"k8s:enc:aescbc:v1:key1:")
    assert b"c2VjcmV0" not in etcd_value(cluster, "old")
    state = provider_state(cluster)
    assert state["automaticReload"] is True and state["lastReloadError"] is None
    assert state["resources"][0] == {
        "resource": "secrets",
        "providers": ["aescbc", "identity"],
        "writeKey": "key1",
        "readKeys": ["key1"],
        "plaintextReadable": True,
    }

    state = rewrite_and_wait(
        cluster, config_path, {"resources": ["secrets"], "providers": [aescbc(("key2", KEY2), ("key1", KEY1))]}
    )
    assert (state["resources"][0]["writeKey"], state["resources"][0]["readKeys"]) == ("key2", ["key2", "key1"])
    make_secret(url, "new")
    assert etcd_value(cluster, "new").startswith(b"k8s:enc:aescbc:v1:key2:")
    assert etcd_value(cluster, "old").startswith(b"k8s:enc:aescbc:v1:key1:")  # untouched until rewritten
    assert ok(call(url, "GET", secret_path("old")))["data"] == {"token": "c2VjcmV0"}

    # The no-op rule: a value under a key other than the write key is rewritten, once.
    new_rv = noop_patch(url, "old", old_rv)
    assert new_rv != old_rv
    assert etcd_value(cluster, "old").startswith(b"k8s:enc:aescbc:v1:key2:")
    assert noop_patch(url, "old", new_rv) == new_rv

    rewrite_and_wait(cluster, config_path, {"resources": ["secrets"], "providers": [aescbc(("key2", KEY2))]})
    status, doc = call(url, "GET", secret_path("stranded"))
    assert (status, doc["reason"]) == (500, "InternalError"), doc
    assert "key1" in doc["message"]
    assert ok(call(url, "GET", secret_path("old")))["data"] == {"token": "c2VjcmV0"}
    assert ok(call(url, "GET", secret_path("new")))["data"] == {"token": "c2VjcmV0"}


def test_identity_first_writes_plaintext(cluster: Cluster, config_path: Path) -> None:
    """Decryption (identity first, aescbc kept to read): new writes and rewrites go in the clear."""
    url = cluster.server.url
    rv = make_secret(url, "enc")
    rewrite_and_wait(cluster, config_path, {"resources": ["secrets"], "providers": [IDENTITY, aescbc(("key1", KEY1))]})
    make_secret(url, "plain")
    assert json.loads(etcd_value(cluster, "plain"))["data"] == {"token": "c2VjcmV0"}
    assert ok(call(url, "GET", secret_path("enc")))["data"] == {"token": "c2VjcmV0"}

    new_rv = noop_patch(url, "enc", rv)
    assert new_rv != rv
    assert json.loads(etcd_value(cluster, "enc"))["kind"] == "Secret"  # now plaintext
    assert noop_patch(url, "enc", new_rv) == new_rv


def test_plaintext_unreadable_without_identity(config_path: Path, etcd_url: str) -> None:
    """A Secret written before encryption was on cannot be read once `identity` is not listed."""
    write_config(config_path, {"resources": ["configmaps"], "providers": [aescbc(("key1", KEY1)), IDENTITY]})
    with Cluster(etcd_url=etcd_url, encryption_config=config_path, automatic_reload=True,
                 reload_interval=RELOAD) as cluster:  # fmt: skip
        url = cluster.server.url
        rv = make_secret(url, "before")
        assert etcd_value(cluster, "before").startswith(b"{")  # secrets not listed: plaintext
        assert noop_patch(url, "before", rv) == rv  # plaintext is the write "key": no rewrite

        rewrite_and_wait(cluster, config_path, {"resources": ["secrets"], "providers": [aescbc(("key1", KEY1))]})
        status, doc = call(url, "GET", secret_path("before"))
        assert (status, doc["reason"]) == (500, "InternalError"), doc
        assert "no matching prefix found" in doc["message"]
        make_secret(url, "after")
        assert etcd_value(cluster, "after").startswith(b"k8s:enc:aescbc:v1:key1:")
        assert ok(call(url, "GET", secret_path("after")))["data"] == {"token": "c2VjcmV0"}

        # Encrypted values of a resource the file no longer lists are unreadable too.
        rewrite_and_wait(cluster, config_path, {"resources": ["configmaps"], "providers": [IDENTITY]})
        assert call(url, "GET", secret_path("after"))[0] == 500


def test_invalid_rewrite_keeps_the_previous_config(cluster: Cluster, config_path: Path) -> None:
    url = cluster.server.url
    before = provider_state(cluster)
    write_config(
        config_path, {"resources": ["secrets"], "providers": [aescbc(("key2", "not base64!"), ("key1", KEY1))]}
    )
    state = wait_until(lambda: (s := provider_state(cluster))["lastReloadError"] and s, what="the reload error")
    assert "resources[0].providers[0].aescbc.keys[0].secret" in state["lastReloadError"]
    assert "secrets must be base64 encoded" in state["lastReloadError"]
    assert state["hash"] == before["hash"] and state["resources"] == before["resources"]
    make_secret(url, "still-key1")
    assert etcd_value(cluster, "still-key1").startswith(b"k8s:enc:aescbc:v1:key1:")

    # The admin API does not fight the file.
    assert call(url, "PUT", "/_kubesim/encryption", {"keys": ["key9"]})[0] == 400

    state = rewrite_and_wait(
        cluster, config_path, {"resources": ["secrets"], "providers": [aescbc(("key2", KEY2), ("key1", KEY1))]}
    )
    assert state["lastReloadError"] is None
    make_secret(url, "key2-now")
    assert etcd_value(cluster, "key2-now").startswith(b"k8s:enc:aescbc:v1:key2:")

    cluster.stop()
    assert not [t for t in threading.enumerate() if t.name.startswith("kubesim-encryption-reload")]


def test_invalid_file_refuses_to_start(config_path: Path, tmp_path: Path) -> None:
    write_config(config_path, {"resources": ["secrets"], "providers": [aescbc(("key1", KEY1), ("key1", KEY2))]})
    with pytest.raises(encryption.ConfigError, match=r"keys\[1\]\.name: Duplicate value"):
        Cluster(encryption_config=config_path).start()

    proc = subprocess.run(
        [sys.executable, "-m", "kubesim", "serve", "--kubeconfig", str(tmp_path / "kc"),
         "--encryption-provider-config", str(config_path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "Duplicate value" in proc.stderr and str(config_path) in proc.stderr
    assert not (tmp_path / "kc").exists()
