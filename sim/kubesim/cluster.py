"""A simulated cluster: one etcd (ours or given) and one or more API servers
sharing it, each on its own loopback port, plus a kubeconfig for them.

Several servers stand for an HA control plane during a rolling upgrade: each
has its own storage versions, encryption keys and feature gates (its
`ServerConfig`), its identity lease (sim/kubesim/leases.py), and its EndpointSlice
of the `kubernetes` Service.

EndpointSlices: kube-apiserver's endpoint reconciler keeps ONE slice named
`kubernetes` in `default`, labelled `kubernetes.io/service-name: kubernetes`,
one endpoint per API server address, and one port list, since every server
listens on the same port (pkg/controlplane/reconcilers/endpointsadapter.go).
kubesim's servers share 127.0.0.1 and differ by port, so each gets a slice of
its own: the first one `kubernetes` (the name a real cluster has), the others
`kubernetes-<port>` (stable across a restart, which keeps the port, and unique;
the real reconciler's only other name is `kubernetes-v4`/`-v6` for a second
address family). Clients select them by label, as they must on a real cluster.
A removed server's slice goes at once (a real server removes its address in a
pre-shutdown hook); a restarted one keeps its slice.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from kubesim import encryption, leases
from kubesim.access import AccessConfig
from kubesim.errors import StatusError
from kubesim.etcd import EtcdProcess, EtcdStore
from kubesim.registry import Registry
from kubesim.server import ApiServer
from kubesim.server_config import EncryptionConfig, ServerConfig, host_server_id
from kubesim.svm_controller import ControllerSettings, SvmController
from kubesim.tls import Authority, shared_authority


def kubeconfig_doc(servers: list[ApiServer], *, token: str = "kubesim") -> dict[str, Any]:
    """Contexts `kubesim` (the first server) and `kubesim-<i>` for each one, as user `token`'s;
    over HTTPS, each cluster entry carries the CA as `certificate-authority-data`."""
    clusters, contexts = [], []
    for i, server in enumerate(servers):
        entry: dict[str, str] = {"server": server.url}
        if server.tls is not None:
            entry["certificate-authority-data"] = server.tls.ca_data
        clusters.append({"name": f"kubesim-{i}", "cluster": entry})
        contexts.append({"name": f"kubesim-{i}", "context": {"cluster": f"kubesim-{i}", "user": "kubesim-admin"}})
    contexts.insert(0, {"name": "kubesim", "context": {"cluster": "kubesim-0", "user": "kubesim-admin"}})
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": clusters,
        "contexts": contexts,
        "current-context": "kubesim",
        # Without a token file kubesim checks no credentials (any token will do); with one,
        # the cluster's admin token, in group system:masters (sim/kubesim/access.py).
        "users": [{"name": "kubesim-admin", "user": {"token": token}}],
        "preferences": {},
    }


SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def endpoint_slice(name: str, *, host: str, port: int) -> dict[str, Any]:
    """One API server's slice of the `kubernetes` Service, as endpointsadapter.go writes it."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "default", "labels": {SERVICE_NAME_LABEL: "kubernetes"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }


class Cluster:
    def __init__(
        self,
        *,
        etcd_url: str | None = None,
        servers: int = 1,
        port: int = 0,
        authz_warmup_seconds: float = 0.0,
        identity_lease_seconds: int = leases.LEASE_SECONDS,
        feature_gates: Mapping[str, bool] | None = None,
        encryption_config: Path | str | Sequence[Path | str] | None = None,
        automatic_reload: bool = False,
        reload_interval: float = 1.0,
        token_auth_file: Path | str | None = None,
        authorization_mode: str = "AlwaysAllow",
        insecure_http: bool = False,
        authority: Authority | None = None,
        svm_controller: ControllerSettings | None = None,
    ) -> None:
        """Served over HTTPS, as kube-apiserver, with `authority`'s serving certificate (by default
        this process's kubesim CA, sim/kubesim/tls.py); `insecure_http=True`: plain HTTP.

        `identity_lease_seconds`: each server's identity lease (kube-apiserver's
        --identity-lease-duration-seconds, 3600 s); `feature_gates`: applied to the
        ServerConfig of every server this cluster creates (kube-apiserver's --feature-gates).

        `encryption_config`: an `EncryptionConfiguration` file every server reads
        (kube-apiserver's --encryption-provider-config, sim/kubesim/encryption.py), or a
        list of `servers` files, server i reading the i-th (servers mid-way through a
        rolling update of the file; a ValueError for another length); an invalid one
        makes start() raise encryption.ConfigError. `automatic_reload`
        (--encryption-provider-config-automatic-reload): each server polls its file
        every `reload_interval` seconds (kube-apiserver: about a minute) and
        applies a changed, valid content.

        `token_auth_file` (kube-apiserver's --token-auth-file) turns authentication on:
        bearer tokens of that CSV file, and the kubeconfig's admin token; anything else
        gets 401. `authorization_mode="RBAC"` (--authorization-mode) then authorizes every
        request against the cluster's RBAC objects (sim/kubesim/rbac_authorizer.py).

        `svm_controller`: the settings of kube-controller-manager's storage version migrator the
        cluster runs (sim/kubesim/svm_controller.py): it talks to the first server, and works while
        that server's `StorageVersionMigrator` gate is on and it is enabled."""
        self._etcd_process: EtcdProcess | None = None
        self._etcd_url = etcd_url
        self._count = servers
        self._port = port
        self._authz_warmup_seconds = authz_warmup_seconds
        self.identity_lease_seconds = identity_lease_seconds
        self._feature_gates = dict(feature_gates or {})
        #: The file every server reads, or one per server (then None and `_encryption_configs`).
        self._encryption_config: Path | None = None
        self._encryption_configs: list[Path] | None = None
        if isinstance(encryption_config, (str, os.PathLike)):
            self._encryption_config = Path(encryption_config)
        elif encryption_config is not None:
            self._encryption_configs = [Path(p) for p in encryption_config]
            if len(self._encryption_configs) != servers:
                raise ValueError(
                    f"encryption_config: {len(self._encryption_configs)} files for {servers} servers; "
                    "give one file for every server, or one per server"
                )
        self._reload_interval = reload_interval if automatic_reload else None
        self.access = AccessConfig(
            token_auth_file=Path(token_auth_file) if token_auth_file is not None else None,
            authorization_mode=authorization_mode,
        )
        self._insecure_http = insecure_http
        self._authority = authority
        self.servers: list[ApiServer] = []
        self.kubeconfig: Path | None = None
        # The endpoint reconciler's writes, through an etcd client of their own (not counted as clients').
        self._control: Registry | None = None
        self._slices: dict[int, str] = {}  # port -> EndpointSlice name
        self._svm_settings = svm_controller or ControllerSettings()
        #: kube-controller-manager's storage version migrator, once started.
        self.svm_controller: SvmController | None = None

    @property
    def etcd_url(self) -> str:
        assert self._etcd_url is not None, "start() the cluster first"
        return self._etcd_url

    @property
    def etcd_pid(self) -> int | None:
        """The id of the etcd process the cluster started (None: it uses an etcd of someone else's)."""
        return None if self._etcd_process is None else self._etcd_process.pid

    @property
    def authority(self) -> Authority | None:
        """The CA its servers' certificates chain to (None: plain HTTP)."""
        if self._insecure_http:
            return None
        if self._authority is None:
            self._authority = shared_authority()
        return self._authority

    @property
    def server(self) -> ApiServer:
        return self.servers[0]

    def start(self) -> Cluster:
        for path in self._encryption_configs or ([self._encryption_config] if self._encryption_config else []):
            encryption.load(path)  # refuse a bad file before starting etcd
        if self._etcd_url is None:
            self._etcd_process = EtcdProcess().start()
            self._etcd_url = self._etcd_process.url
        try:
            self._control = Registry(EtcdStore(self.etcd_url))
            token = self.access.admin_token if self.access.authenticating else "kubesim"
            self.svm_controller = SvmController(
                etcd_url=self.etcd_url, target=self._controller_target, token=token, settings=self._svm_settings
            )
            for i in range(self._count):
                self.add_server(
                    port=self._port if i == 0 else 0,
                    authz_warmup_seconds=self._authz_warmup_seconds,
                    encryption_config=self._encryption_configs[i] if self._encryption_configs else None,
                )
            self.svm_controller.start()
        except BaseException:
            self.stop()
            raise
        return self

    def add_server(
        self,
        *,
        port: int = 0,
        config: ServerConfig | None = None,
        authz_warmup_seconds: float = 0.0,
        encryption_config: Path | str | None = None,
    ) -> ApiServer:
        """Start one more API server (its identity lease, StorageVersion entries and EndpointSlice).

        Without `config`, its encryption file is `encryption_config` when given, else
        the cluster's single file; a cluster of per-server files needs it named (which
        file a new server of a rolling update reads is the caller's choice)."""
        if config is None:
            # A fixed port is a server that may be started again (a crash, an upgrade): a stable ID.
            config = ServerConfig(server_id=host_server_id(port)) if port else ServerConfig()
            for gate, on in self._feature_gates.items():
                (config.feature_gates.add if on else config.feature_gates.discard)(gate)
            path = Path(encryption_config) if encryption_config is not None else self._encryption_config
            if path is None and self._encryption_configs is not None:
                raise ValueError("this cluster's servers read files of their own: add_server(encryption_config=PATH)")
            if path is not None:
                config.encryption = EncryptionConfig.from_file(path, reload_interval=self._reload_interval)
        server = self._start_server(port=port, config=config, authz_warmup_seconds=authz_warmup_seconds)
        self.servers.append(server)
        self._add_endpoint(server)
        if self.kubeconfig is not None:
            self.write_kubeconfig(self.kubeconfig)
        return server

    def _start_server(self, *, port: int, config: ServerConfig | None, authz_warmup_seconds: float) -> ApiServer:
        registry = Registry(EtcdStore(self.etcd_url), config)
        registry.ensure_default_namespaces()
        server = ApiServer(
            registry, port=port, authz_warmup_seconds=authz_warmup_seconds, access=self.access, tls=self.authority
        )
        server.svm_controller = self.svm_controller
        return server.start(identity_lease_seconds=self.identity_lease_seconds)

    def _controller_target(self) -> ApiServer | None:
        """The server kube-controller-manager talks to: the first (kcm's kubeconfig names one address)."""
        servers = self.servers
        return servers[0] if servers else None

    def restart_server(
        self, index: int = 0, *, down_seconds: float = 0.0, authz_warmup_seconds: float = 0.0
    ) -> ApiServer:
        """Restart API server `index` as a real restart: same port, same etcd, same `ServerConfig`
        (its own encryption file, read again: an invalid one raises encryption.ConfigError).

        Connections in flight are dropped; for `down_seconds` the port refuses
        connections; then a new server (fresh in-memory state) answers 403 to every
        API request for `authz_warmup_seconds`, as kube-apiserver does until its
        RBAC caches fill (sim/kubesim/health.py). Its identity lease (same server ID)
        and its EndpointSlice (same port) are kept.
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

    def remove_server(self, index: int, *, lease_seconds: int | None = None) -> None:
        """Take one API server of an HA cluster down for good (a rolling upgrade replaces it).

        Its EndpointSlice goes at once. Its StorageVersion entries stay until its
        identity lease has expired: then the garbage collectors of the servers
        still up delete the lease and drop the entries (sim/kubesim/leases.py). The
        lease expires `identity_lease_seconds` after its last renewal (3600 s by
        default, as kube-apiserver), or `lease_seconds` from now when given.
        """
        server = self.servers.pop(index)
        self._remove_endpoint(server)
        server.stop(lease_seconds=lease_seconds)
        server.registry.etcd.close()
        if self.kubeconfig is not None:
            self.write_kubeconfig(self.kubeconfig)

    # ----- the endpoint reconciler --------------------------------------------
    def _add_endpoint(self, server: ApiServer) -> None:
        assert self._control is not None
        name = "kubernetes" if "kubernetes" not in self._slices.values() else f"kubernetes-{server.port}"
        self._slices[server.port] = name
        rt = self._control.lookup("discovery.k8s.io", "v1", "endpointslices")
        body = endpoint_slice(name, host=server.host, port=server.port)
        try:
            self._control.create(rt, "v1", "default", body, manager="kube-apiserver")
        except StatusError as exc:
            if exc.code != 409:
                raise
            self._control.update(rt, "v1", "default", name, lambda _current: body, manager="kube-apiserver")

    def _remove_endpoint(self, server: ApiServer) -> None:
        name = self._slices.pop(server.port, None)
        if name is None or self._control is None:
            return
        rt = self._control.lookup("discovery.k8s.io", "v1", "endpointslices")
        try:
            self._control.delete(rt, "v1", "default", name)
        except StatusError as exc:
            if exc.code != 404:
                raise

    def write_kubeconfig(self, path: Path | str) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        token = self.access.admin_token if self.access.authenticating else "kubesim"
        tmp.write_text(yaml.safe_dump(kubeconfig_doc(self.servers, token=token), sort_keys=False))
        os.replace(tmp, path)
        self.kubeconfig = path
        return path

    def etcd(self) -> EtcdStore:
        """A fresh etcd client for tests that judge by what is stored."""
        return EtcdStore(self.etcd_url)

    def stop(self) -> None:
        if self.svm_controller is not None:
            self.svm_controller.close()
            self.svm_controller = None
        for server in self.servers:
            with contextlib.suppress(Exception):  # a graceful shutdown removes its endpoint, if etcd lets it
                self._remove_endpoint(server)
            server.stop()
            server.registry.etcd.close()
        self.servers = []
        if self._control is not None:
            self._control.etcd.close()
            self._control = None
        if self._etcd_process is not None:
            self._etcd_process.stop()
            self._etcd_process = None

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
