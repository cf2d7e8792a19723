"""What the key-rotation tests share: the EncryptionConfiguration file of the runbook,
writers that remember what each Secret must hold, and reads of etcd (DESIGN 8: a
rotation is judged by the key each stored value is encrypted with)."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s

from kubesim.cluster import Cluster
from kubesim.etcd import prefix_end

SECRET1, SECRET2 = (base64.b64encode(bytes([n]) * 32).decode() for n in (1, 2))
N = 300


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
