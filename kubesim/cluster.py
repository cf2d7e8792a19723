"""A simulated cluster: one etcd (ours or given) and one or more API servers
sharing it, each on its own loopback port, plus a kubeconfig for them.

Several servers stand for an HA control plane during a rolling upgrade: each
has its own storage versions and encryption keys (its `ServerConfig`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import yaml

from kubesim import storageversions
from kubesim.etcd import EtcdProcess, EtcdStore
from kubesim.registry import Registry, ServerConfig
from kubesim.server import ApiServer


def kubeconfig_doc(servers: list[ApiServer]) -> dict[str, Any]:
    """Contexts `kubesim` (the first server) and `kubesim-<i>` for each one."""
    clusters, contexts = [], []
    for i, server in enumerate(servers):
        clusters.append({"name": f"kubesim-{i}", "cluster": {"server": server.url}})
        contexts.append({"name": f"kubesim-{i}", "context": {"cluster": f"kubesim-{i}", "user": "kubesim-admin"}})
    contexts.insert(0, {"name": "kubesim", "context": {"cluster": "kubesim-0", "user": "kubesim-admin"}})
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": clusters,
        "contexts": contexts,
        "current-context": "kubesim",
        # kubesim checks no credentials; a token keeps clients that insist on one happy.
        "users": [{"name": "kubesim-admin", "user": {"token": "kubesim"}}],
        "preferences": {},
    }


class Cluster:
    def __init__(
        self, *, etcd_url: str | None = None, servers: int = 1, port: int = 0, authz_warmup_seconds: float = 0.0
    ) -> None:
        self._etcd_process: EtcdProcess | None = None
        self._etcd_url = etcd_url
        self._count = servers
        self._port = port
        self._authz_warmup_seconds = authz_warmup_seconds
        self.servers: list[ApiServer] = []
        self.kubeconfig: Path | None = None

    @property
    def etcd_url(self) -> str:
        assert self._etcd_url is not None, "start() the cluster first"
        return self._etcd_url

    @property
    def server(self) -> ApiServer:
        return self.servers[0]

    def start(self) -> Cluster:
        if self._etcd_url is None:
            self._etcd_process = EtcdProcess().start()
            self._etcd_url = self._etcd_process.url
        try:
            for i in range(self._count):
                self.add_server(port=self._port if i == 0 else 0, authz_warmup_seconds=self._authz_warmup_seconds)
        except BaseException:
            self.stop()
            raise
        return self

    def add_server(
        self, *, port: int = 0, config: ServerConfig | None = None, authz_warmup_seconds: float = 0.0
    ) -> ApiServer:
        server = self._start_server(port=port, config=config, authz_warmup_seconds=authz_warmup_seconds)
        self.servers.append(server)
        if self.kubeconfig is not None:
            self.write_kubeconfig(self.kubeconfig)
        return server

    def _start_server(self, *, port: int, config: ServerConfig | None, authz_warmup_seconds: float) -> ApiServer:
        registry = Registry(EtcdStore(self.etcd_url), config)
        registry.ensure_default_namespaces()
        storageversions.publish(registry)
        return ApiServer(registry, port=port, authz_warmup_seconds=authz_warmup_seconds).start()

    def restart_server(
        self, index: int = 0, *, down_seconds: float = 0.0, authz_warmup_seconds: float = 0.0
    ) -> ApiServer:
        """Restart API server `index` as a real restart: same port, same etcd, same `ServerConfig`.

        Connections in flight are dropped; for `down_seconds` the port refuses
        connections; then a new server (fresh in-memory state) answers 403 to every
        API request for `authz_warmup_seconds`, as kube-apiserver does until its
        RBAC caches fill (kubesim/health.py).
        """
        old = self.servers[index]
        old.stop()
        old.registry.etcd.close()
        if down_seconds > 0:
            time.sleep(down_seconds)
        server = self._start_server(
            port=old.port, config=old.registry.config, authz_warmup_seconds=authz_warmup_seconds
        )
        self.servers[index] = server
        return server

    def remove_server(self, index: int) -> None:
        """Stop one API server of an HA cluster (a rolling upgrade takes it down).

        Its StorageVersion entries are withdrawn at once; kube-apiserver's
        garbage collector does that once the server's identity lease expires.
        """
        server = self.servers.pop(index)
        server.stop()
        storageversions.publish(server.registry, withdraw=True)
        server.registry.etcd.close()
        if self.kubeconfig is not None:
            self.write_kubeconfig(self.kubeconfig)

    def write_kubeconfig(self, path: Path | str) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(yaml.safe_dump(kubeconfig_doc(self.servers), sort_keys=False))
        os.replace(tmp, path)
        self.kubeconfig = path
        return path

    def etcd(self) -> EtcdStore:
        """A fresh etcd client for tests that judge by what is stored."""
        return EtcdStore(self.etcd_url)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
            server.registry.etcd.close()
        self.servers = []
        if self._etcd_process is not None:
            self._etcd_process.stop()
            self._etcd_process = None

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
