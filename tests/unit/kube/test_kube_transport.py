"""Which connection pool a request goes to (storage_migrator/kube/transport.py), without a network."""

from __future__ import annotations

import gc
import weakref

import urllib3

from storage_migrator.kube.transport import _server_pool


def test_the_server_pool_keeps_a_path_prefix_of_the_server_url() -> None:
    """A kubeconfig server behind a proxying front (`https://rancher/k8s/clusters/c-1`) keeps its prefix."""
    manager = urllib3.PoolManager()
    host = "https://rancher.example/k8s/clusters/c-1"
    found = _server_pool(manager, host, f"{host}/api/v1/configmaps?limit=500")
    assert found is not None
    pool, uri = found
    assert (pool.scheme, pool.host, pool.port, uri) == ("https", "rancher.example", 443,
                                                        "/k8s/clusters/c-1/api/v1/configmaps?limit=500")  # fmt: skip
    assert _server_pool(manager, host, f"{host}/api")[0] is pool  # type: ignore[index]


def test_a_proxy_or_another_host_is_left_to_the_pool_manager() -> None:
    host = "https://127.0.0.1:6443"
    assert _server_pool(urllib3.ProxyManager("http://proxy.example:3128"), host, f"{host}/api") is None
    assert _server_pool(urllib3.PoolManager(), host, "https://10.0.0.1:6443/api") is None


def test_the_pool_goes_with_the_clients_close_and_a_new_one_is_asked_for() -> None:
    """`ApiClient.close()` clears the manager, which drops its pools (urllib3 closes a pool's
    connections when it is collected): this cache must not keep the old one alive, and a
    client used after it gets the manager's new pool."""
    manager = urllib3.PoolManager()
    host = "https://127.0.0.1:6443"
    first = _server_pool(manager, host, f"{host}/api")
    assert first is not None
    gone = weakref.ref(first[0])
    del first
    manager.clear()
    gc.collect()
    assert gone() is None
    again = _server_pool(manager, host, f"{host}/api")
    assert again is not None and again[0] is manager.connection_from_url(host)
