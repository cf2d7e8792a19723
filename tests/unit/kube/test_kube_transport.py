"""Which connection pool a request goes to (storage_migrator/kube/transport.py), without a network."""

from __future__ import annotations

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
