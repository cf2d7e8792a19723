"""What the key-rotation tests share: the EncryptionConfiguration file of the runbook,
writers that remember what each Secret must hold, and reads of etcd (DESIGN 8: a
rotation is judged by the key each stored value is encrypted with)."""

from __future__ import annotations

import base64
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import install_migration_crds
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.etcd import prefix_end

SECRET1, SECRET2 = (base64.b64encode(bytes([n]) * 32).decode() for n in (1, 2))
N = 300
KEY1, KEY2 = ("key1", SECRET1), ("key2", SECRET2)


def config(*keys: tuple[str, str]) -> str:
    """The runbook's file: aescbc with `keys` (write key first), then identity."""
    listed = "".join(f"            - name: {name}\n              secret: {secret}\n" for name, secret in keys)
    return (
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n"
        "  - resources: [secrets, configmaps]\n    providers:\n      - aescbc:\n          keys:\n"
        f"{listed}      - identity: {{}}\n"
    )


def wait(predicate: Callable[[], Any], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class SecretWriters(threading.Thread):
    """Creates, updates and deletes Secrets throughout; remembers what each one must hold."""

    def __init__(self, api: Any, namespace: str) -> None:
        super().__init__(daemon=True)
        self.core, self.namespace = k8s.CoreV1Api(api), namespace
        self.expected: dict[str, str] = {}  # name -> the value of its last acknowledged write
        self.stop = threading.Event()
        self.counts = {"create": 0, "update": 0, "delete": 0}

    def _try(self, verb: str, call: Callable[..., Any], *args: Any) -> bool:
        try:
            call(*args)
        except k8s.ApiException:
            return False  # injected faults and races: not acknowledged, so not expected
        self.counts[verb] += 1
        return True

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            name, value = f"w-{n:04d}", f"v{n}"
            body = k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=name), string_data={"v": value})
            if self._try("create", self.core.create_namespaced_secret, self.namespace, body):
                self.expected[name] = value
            older = sorted(self.expected)[: max(0, len(self.expected) - 5)]
            if older and n % 2 == 0:
                target, update = older[n % len(older)], f"u{n}"
                if self._try("update", self._update, target, update):
                    self.expected[target] = update
            if older and n % 7 == 0 and self._try("delete", self.core.delete_namespaced_secret, older[0],
                                                  self.namespace):  # fmt: skip
                del self.expected[older[0]]
            time.sleep(0.02)

    def _update(self, name: str, value: str) -> None:
        """A read, then a replace conditional on what was read (a 409 is a lost race, retried later)."""
        current = self._read(name)
        self.core.replace_namespaced_secret(name, self.namespace, {**current, "stringData": {"v": value}})

    def _read(self, name: str) -> dict[str, Any]:
        obj = self.core.read_namespaced_secret(name, self.namespace)
        return dict(k8s.ApiClient().sanitize_for_serialization(obj))


def stored_keys(cluster: Cluster, prefix: str) -> dict[str, str]:
    """name -> the key its etcd value is encrypted with (the test's own read of etcd)."""
    etcd = cluster.etcd()
    try:
        out = {}
        for kv in etcd.range(prefix.encode(), prefix_end(prefix.encode())).kvs:
            assert kv.value.startswith(b"k8s:enc:aescbc:v1:"), kv.key
            out[kv.key.decode().rsplit("/", 1)[1]] = kv.value.split(b":")[4].decode()
        return out
    finally:
        etcd.close()


@dataclass
class ThreeServers:
    """Three API servers over one etcd, each reading its own EncryptionConfiguration file (issue 19),
    and a namespace of Secrets `s-0000`... holding `s0`..."""

    cluster: Cluster
    files: list[Path]
    kubeconfig: Path
    admins: list[Admin]
    namespace: str

    def api(self, server: int = 0) -> k8s.ApiClient:
        return k8s_config.new_client_from_config(config_file=str(self.kubeconfig), context=f"kubesim-{server}")

    def roll(self, server: int, *keys: tuple[str, str]) -> None:
        """One step of a rolling update: server `server`'s file now lists `keys` (write key first)."""
        staged = self.files[server].with_suffix(".new")  # renamed into place: a reload never reads half a file
        staged.write_text(config(*keys))
        staged.replace(self.files[server])
        names = [name for name, _ in keys]
        wait(lambda: self.admins[server].config()["encryption"]["keys"] == names,
             f"server {server} reloading its file ({names})")  # fmt: skip

    def roll_all(self, *keys: tuple[str, str]) -> None:
        for server in range(len(self.files)):
            self.roll(server, *keys)

    def migrator_writes(self) -> int:
        """Merge patches of Secrets: only the migrator sends them (writers create, replace, delete)."""
        return sum(a.counters()["requestsByResource"].get("patch secrets", 0) for a in self.admins)

    def keys_in_etcd(self) -> set[str]:
        return set(stored_keys(self.cluster, f"/registry/secrets/{self.namespace}/").values())


@contextmanager
def three_servers(tmp_path: Path, *, secrets: int) -> Iterator[ThreeServers]:
    """Every server starts with key1 alone; the CRDs are installed."""
    files = [tmp_path / f"encryption-config-{i}.yaml" for i in range(3)]
    for path in files:
        path.write_text(config(KEY1))
    with Cluster(servers=3, encryption_config=files, automatic_reload=True, reload_interval=0.2) as own:
        kubeconfig = own.write_kubeconfig(tmp_path / "kubeconfig")
        api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
        install_migration_crds(api)
        namespace = f"t-{uuid.uuid4().hex[:8]}"
        core = k8s.CoreV1Api(api)
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
        for i in range(secrets):
            core.create_namespaced_secret(namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=f"s-{i:04d}"),
                                                                  string_data={"v": f"s{i}"}))  # fmt: skip
        api.close()
        yield ThreeServers(cluster=own, files=files, kubeconfig=kubeconfig,
                           admins=[Admin(s.url) for s in own.servers], namespace=namespace)  # fmt: skip
