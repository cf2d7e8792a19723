"""Several kubesim API servers over one etcd: an HA control plane mid-upgrade,
the StorageVersion API they publish (seed 001 as shipped,
reference/storageversion-core-secrets.json) behind its feature gate, the
garbage collection of a gone server's entries once its identity lease expires,
and the `kubernetes` Service's EndpointSlices that tell where the servers are.
Tests that add or remove servers run a cluster of their own."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from kubesim import tls
from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.codec import decode
from kubesim.server_config import ServerConfig

SV_PATH = "/apis/internal.apiserver.k8s.io/v1alpha1/storageversions"


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10, context=tls.client_context()) as resp:
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
            urllib.request.urlopen(req, timeout=10, context=tls.client_context()).close()
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


def wait_until(predicate: Callable[[], Any], *, what: str, timeout: float = 30.0) -> Any:
    """Poll `predicate` until it answers something true; fail after a generous `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def status_code(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10, context=tls.client_context()) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def server_ids(sv: dict[str, Any]) -> set[str]:
    return {e["apiServerID"] for e in sv["status"].get("storageVersions") or []}


def test_gate_off_serves_no_storage_version_api_and_publishes_nothing(ha: Cluster) -> None:
    """With `StorageVersionAPI` off (v1.36's default upstream: the gate is alpha) a server
    does not serve `internal.apiserver.k8s.io` (absent from /apis, 404 as any API that is
    not served, reference/unknown-resource-404.txt) and publishes no entry; each server
    has its own gates. Turning it on publishes again."""
    on, off = ha.servers
    off_id = off.registry.config.server_id
    admin = Admin(off.url)
    try:
        state = admin.set_feature_gates({"StorageVersionAPI": False})
        assert state["featureGates"]["StorageVersionAPI"] is False
        groups = {g["name"] for g in get_json(f"{off.url}/apis")["groups"]}
        assert "internal.apiserver.k8s.io" not in groups
        assert "internal.apiserver.k8s.io" in {g["name"] for g in get_json(f"{on.url}/apis")["groups"]}
        assert status_code(f"{off.url}{SV_PATH}") == 404
        assert status_code(f"{off.url}{SV_PATH}/core.secrets") == 404
        for sv in get_json(f"{on.url}{SV_PATH}")["items"]:
            assert off_id not in server_ids(sv), sv["metadata"]["name"]
        # The server left alone is all there is to agree with.
        assert storage_version(on.url, "core.secrets")["status"]["commonEncodingVersion"] == "v1"

        admin.set_feature_gates({"StorageVersionAPI": True})
        assert status_code(f"{off.url}{SV_PATH}") == 200
        assert off_id in server_ids(storage_version(on.url, "core.secrets"))
    finally:
        admin.set_feature_gates({"StorageVersionAPI": True})


def test_server_started_with_the_gate_off_never_publishes() -> None:
    """`Cluster(feature_gates=...)` (serve --feature-gates) and a ServerConfig of its own:
    a server that starts with the gate off writes no entry, even at start."""
    with Cluster(servers=1) as cluster:
        quiet = cluster.add_server(config=ServerConfig(feature_gates=set()))
        sv = storage_version(cluster.server.url, "core.secrets")
        assert server_ids(sv) == {cluster.server.registry.config.server_id}
        assert status_code(f"{quiet.url}{SV_PATH}") == 404
    with Cluster(servers=1, feature_gates={"StorageVersionAPI": False}) as cluster:
        assert status_code(f"{cluster.server.url}{SV_PATH}") == 404
        assert cluster.server.registry.config.feature_gates == set()


def test_removed_server_entries_go_when_its_identity_lease_expires() -> None:
    """seed 001, Garbage collection: "stale storageVersion.status.serverStorageVersions
    entries left by API servers that have gone away" are removed by a control loop, and
    "after the removal, if all participating API servers have the same encodingVersion,
    then sets [the common encoding version] and status.condition". As shipped: the
    apiserverleasegc controller deletes an identity lease once renewTime +
    leaseDurationSeconds is past, and storageversiongc then drops the entries whose
    apiServerID has no lease (pkg/controller/storageversiongc). A stopped server deletes
    neither: its entries outlive it until then."""
    with Cluster(servers=3) as cluster:
        first, _, last = cluster.servers
        gone = last.registry.config.server_id
        Admin(last.url).set_storage_version("configmaps", "v2")  # the server going away disagrees
        before = storage_version(first.url, "core.configmaps")
        assert "commonEncodingVersion" not in before["status"]

        cluster.remove_server(2, lease_seconds=2)
        right_after = storage_version(first.url, "core.configmaps")
        assert gone in server_ids(right_after)
        assert "commonEncodingVersion" not in right_after["status"]
        lease_url = f"{first.url}/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{gone}"
        assert get_json(lease_url)["spec"]["leaseDurationSeconds"] == 2

        def collected() -> dict[str, Any] | None:
            sv = storage_version(first.url, "core.configmaps")
            return sv if gone not in server_ids(sv) else None

        after = wait_until(collected, what=f"the entries of {gone} to be garbage collected")
        assert server_ids(after) == {s.registry.config.server_id for s in cluster.servers}
        assert after["status"]["commonEncodingVersion"] == "v1"
        (condition,) = after["status"]["conditions"]
        assert (condition["status"], condition["reason"]) == ("True", "CommonEncodingVersionSet")

        # One GC pass prunes the objects one after another: wait for the pass, not for the first object.
        def all_collected() -> list[str] | None:
            left = [sv["metadata"]["name"] for sv in get_json(f"{first.url}{SV_PATH}")["items"]
                    if gone in server_ids(sv)]  # fmt: skip
            return None if left else ["none left"]

        wait_until(all_collected, what=f"every StorageVersion entry of {gone} to be garbage collected")
        assert status_code(lease_url) == 404


def test_default_lease_keeps_a_removed_server_entries() -> None:
    """kube-apiserver's --identity-lease-duration-seconds defaults to 3600: a server that
    went away a moment ago still counts, so no agreement appears by itself (the migrator
    must not take a server's silence for its agreement)."""
    with Cluster(servers=2) as cluster:
        gone = cluster.servers[1].registry.config.server_id
        cluster.remove_server(1)
        left = cluster.server.identity
        assert left is not None
        # Two passes of the collectors of the server left that began after the removal (one a second).
        since = left.passes
        wait_until(lambda: left.passes >= since + 2, what="two passes of the collectors after the removal")
        assert gone in server_ids(storage_version(cluster.server.url, "core.secrets"))


def test_identity_leases_exist_and_are_renewed(tmp_path: Path) -> None:
    """One Lease per server in kube-system, named after its ID, labelled
    apiserver.kubernetes.io/identity=kube-apiserver, holderIdentity `<id>_<uuid>`
    (pkg/controlplane/apiserver/server.go), renewed well within its duration."""
    with Cluster(servers=2, identity_lease_seconds=4) as cluster:
        api = k8s_config.new_client_from_config(config_file=str(cluster.write_kubeconfig(tmp_path / "kubeconfig")))
        coordination = k8s.CoordinationV1Api(api)

        def identity_leases() -> dict[str, Any]:
            listed = coordination.list_namespaced_lease(
                "kube-system", label_selector="apiserver.kubernetes.io/identity=kube-apiserver"
            )
            return {lease.metadata.name: lease for lease in listed.items}

        try:
            first = identity_leases()
            assert set(first) == {s.registry.config.server_id for s in cluster.servers}
            for name, lease in first.items():
                assert lease.spec.holder_identity.startswith(f"{name}_")
                assert lease.spec.lease_duration_seconds == 4
                assert lease.spec.renew_time is not None
            wait_until(
                lambda: all(
                    lease.spec.renew_time > first[name].spec.renew_time for name, lease in identity_leases().items()
                ),
                what="every identity lease to be renewed",
            )
            # A restart keeps the server's ID (its lease) with a new holder, as a new process.
            restarted = cluster.restart_server(0).registry.config.server_id
            assert identity_leases()[restarted].spec.holder_identity != first[restarted].spec.holder_identity
        finally:
            api.close()


def test_endpoint_slices_list_every_live_server(tmp_path: Path) -> None:
    """The `kubernetes` Service's EndpointSlices (pkg/controlplane/reconcilers/endpointsadapter.go):
    in `default`, labelled kubernetes.io/service-name=kubernetes, addressType IPv4, ready
    endpoints; one address:port per live API server, updated when servers come and go."""
    with Cluster(servers=2) as cluster:
        kubeconfig = str(cluster.write_kubeconfig(tmp_path / "kubeconfig"))  # rewritten as servers come and go

        def endpoint_slices(**kw: Any) -> list[Any]:
            with k8s_config.new_client_from_config(config_file=kubeconfig) as api:
                return list(k8s.DiscoveryV1Api(api).list_namespaced_endpoint_slice("default", **kw).items)

        def endpoints() -> set[str]:
            out = set()
            for slice_ in endpoint_slices(label_selector="kubernetes.io/service-name=kubernetes"):
                assert slice_.address_type == "IPv4"
                (port,) = slice_.ports
                assert (port.name, port.protocol) == ("https", "TCP")
                for endpoint in slice_.endpoints:
                    assert endpoint.conditions.ready is True
                    out.update(f"{address}:{port.port}" for address in endpoint.addresses)
            return out

        def live() -> set[str]:
            return {f"127.0.0.1:{s.port}" for s in cluster.servers}

        assert endpoints() == live() and len(live()) == 2
        assert "kubernetes" in {s.metadata.name for s in endpoint_slices()}
        cluster.add_server()
        assert endpoints() == live() and len(live()) == 3
        removed = f"127.0.0.1:{cluster.servers[0].port}"
        cluster.remove_server(0)
        assert removed not in endpoints()
        assert endpoints() == live() and len(live()) == 2
        cluster.restart_server(1)
        assert endpoints() == live()
