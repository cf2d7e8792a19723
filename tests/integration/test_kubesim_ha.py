"""Several kubesim API servers over one etcd: an HA control plane mid-upgrade,
and the StorageVersion API they publish (seed 001 as shipped,
reference/storageversion-core-secrets.json)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.codec import decode

SV_PATH = "/apis/internal.apiserver.k8s.io/v1alpha1/storageversions"


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def storage_version(server_url: str, name: str) -> dict[str, Any]:
    return dict(get_json(f"{server_url}{SV_PATH}/{name}"))


@pytest.fixture(scope="module")
def ha() -> Iterator[Cluster]:
    with Cluster(servers=2) as cluster:
        yield cluster


def test_each_server_publishes_its_encoding_version(ha: Cluster) -> None:
    """Shipped shape: status.storageVersions[] of {apiServerID, encodingVersion,
    decodableVersions, servedVersions}, commonEncodingVersion, and the
    AllEncodingVersionsEqual condition with reason CommonEncodingVersionSet."""
    sv = storage_version(ha.servers[0].url, "core.secrets")
    assert sv["kind"] == "StorageVersion"
    assert sv["apiVersion"] == "internal.apiserver.k8s.io/v1alpha1"
    entries = sv["status"]["storageVersions"]
    assert {e["apiServerID"] for e in entries} == {s.registry.config.server_id for s in ha.servers}
    for entry in entries:
        assert entry["encodingVersion"] == "v1"
        assert entry["decodableVersions"] == ["v1"]
        assert entry["servedVersions"] == ["v1"]
    assert sv["status"]["commonEncodingVersion"] == "v1"
    (condition,) = sv["status"]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "AllEncodingVersionsEqual",
        "True",
        "CommonEncodingVersionSet",
    )
    assert storage_version(ha.servers[1].url, "apps.deployments")["status"]["commonEncodingVersion"] == "apps/v1"


def test_rolling_upgrade_loses_then_regains_agreement(ha: Cluster) -> None:
    """seed 001: while servers disagree there is no agreed encoding version; the
    object's resourceVersion moves when the agreed version changes."""
    first, second = (Admin(s.url) for s in ha.servers)
    before = storage_version(ha.servers[0].url, "core.configmaps")
    try:
        second.set_storage_version("configmaps", "v2")
        mid = storage_version(ha.servers[0].url, "core.configmaps")
        assert "commonEncodingVersion" not in mid["status"]
        assert sorted(e["encodingVersion"] for e in mid["status"]["storageVersions"]) == ["v1", "v2"]
        assert mid["status"]["conditions"][0]["status"] == "False"
        first.set_storage_version("configmaps", "v2")
        after = storage_version(ha.servers[1].url, "core.configmaps")
        assert after["status"]["commonEncodingVersion"] == "v2"
        assert int(after["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
    finally:
        first.set_storage_version("configmaps", "v1")
        second.set_storage_version("configmaps", "v1")


def test_servers_encode_in_their_own_storage_version(ha: Cluster) -> None:
    """Mid-upgrade, what lands in etcd depends on which server wrote it (DESIGN 6)."""
    second = Admin(ha.servers[1].url)
    etcd = ha.etcd()
    try:
        second.set_storage_version("configmaps", "v2")
        for i, server in enumerate(ha.servers):
            body = json.dumps({"metadata": {"name": f"ha-{i}"}, "data": {"k": "v"}}).encode()
            req = urllib.request.Request(
                f"{server.url}/api/v1/namespaces/default/configmaps",
                data=body,
                method="POST",
                headers={"Content-Type": "application/json"},
            )
            urllib.request.urlopen(req, timeout=10).close()
        stored = {}
        for i in range(2):
            kv, _ = etcd.get(f"/registry/configmaps/default/ha-{i}".encode())
            assert kv is not None
            stored[i] = decode(kv.value, read_keys=[]).api_version
        assert stored == {0: "v1", 1: "v2"}
        # Discovery differs per server too: each reports the hash of its own storage version.
        hashes = []
        for server in ha.servers:
            doc = get_json(f"{server.url}/api/v1")
            hashes.append(next(r["storageVersionHash"] for r in doc["resources"] if r["name"] == "configmaps"))
        assert hashes[0] == "qFsyl6wFWjQ=" and hashes[1] != hashes[0]
    finally:
        second.set_storage_version("configmaps", "v1")
        etcd.close()


def test_removed_server_withdraws_its_entries() -> None:
    with Cluster(servers=2) as cluster:
        gone = cluster.servers[1].registry.config.server_id
        cluster.remove_server(1)
        sv = storage_version(cluster.servers[0].url, "core.secrets")
        assert gone not in {e["apiServerID"] for e in sv["status"]["storageVersions"]}
        assert len(sv["status"]["storageVersions"]) == 1
