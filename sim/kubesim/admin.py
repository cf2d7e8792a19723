"""A client of kubesim's admin API (`/_kubesim/`), for tests, the demo, the
benchmarks and `python -m kubesim admin`.

Over HTTPS it verifies the server's certificate: against the CA of the
kubeconfig it was built from, or else this process's kubesim CA (the one every
in-process cluster serves with, sim/kubesim/tls.py).

Issue 29: one connection, kept alive across calls (the test harness makes a
score of admin calls around every test; a TLS handshake each cost more than the
call). A call on a kept connection the server has since dropped (a restart, a
stop) is sent again once on a new one; every admin call can be sent twice.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import threading
import weakref
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml


def _own_ca_context() -> ssl.SSLContext:
    from kubesim import tls

    return tls.client_context()


class AdminError(Exception):
    """The admin API refused a command; the message says why."""


def server_url(kubeconfig: Path | str, context: str | None = None) -> str:
    return str(_cluster_entry(kubeconfig, context)["server"]).rstrip("/")


def _cluster_entry(kubeconfig: Path | str, context: str | None) -> dict[str, Any]:
    doc = yaml.safe_load(Path(kubeconfig).read_text())
    name = context or doc.get("current-context")
    ctx = next((c["context"] for c in doc.get("contexts", []) if c["name"] == name), None)
    if ctx is None:
        raise AdminError(f"context {name!r} not found in {kubeconfig}")
    cluster = next((c["cluster"] for c in doc.get("clusters", []) if c["name"] == ctx["cluster"]), None)
    if cluster is None:
        raise AdminError(f"cluster {ctx['cluster']!r} not found in {kubeconfig}")
    return dict(cluster)


#: What a kept connection the server has dropped since its last answer raises on reuse.
_STALE = (
    http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError,
    ssl.SSLEOFError, ssl.SSLZeroReturnError,
)  # fmt: skip


class Admin:
    def __init__(self, url: str, *, timeout: float = 30.0, ca_pem: bytes | None = None) -> None:
        """`ca_pem`: the CA the server's certificate chains to (default: this process's kubesim CA)."""
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._context: ssl.SSLContext | None = None
        if self.url.startswith("https:"):
            # The PKI (and its `cryptography` import) only for this process's own CA.
            self._context = ssl.create_default_context(cadata=ca_pem.decode()) if ca_pem else _own_ca_context()
        parts = urlsplit(self.url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port
        self._prefix = parts.path.rstrip("/")
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path | str, context: str | None = None) -> Admin:
        entry = _cluster_entry(kubeconfig, context)
        ca_data = entry.get("certificate-authority-data")
        ca_pem = base64.b64decode(ca_data) if ca_data else None
        return cls(str(entry["server"]), ca_pem=ca_pem)

    def _connect(self) -> http.client.HTTPConnection:
        if self._context is None:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        else:
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout, context=self._context)
        weakref.finalize(self, conn.close)  # the socket goes with the Admin, never left to the collector
        return conn

    def close(self) -> None:
        """Close the kept connection (the next call opens another)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _exchange(self, method: str, path: str, data: bytes | None) -> tuple[int, bytes]:
        for attempt in (1, 2):
            reused = self._conn is not None
            conn = self._conn or self._connect()
            self._conn = None
            try:
                conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                raw = resp.read()
            except _STALE:
                conn.close()
                if reused and attempt == 1:
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            if resp.will_close:
                conn.close()
            else:
                self._conn = conn
            return resp.status, raw
        raise AssertionError("unreachable")

    def _call(self, method: str, route: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        with self._lock:
            status, raw = self._exchange(method, f"{self._prefix}/_kubesim/{route}", data)
        if 200 <= status <= 299:
            return json.loads(raw)
        try:
            message = json.loads(raw).get("message", f"HTTP Error {status}")
        except ValueError:
            message = f"HTTP Error {status}: {raw[:200]!r}"
        raise AdminError(message)

    def config(self) -> dict[str, Any]:
        return dict(self._call("GET", "config"))

    def set_storage_version(self, resource: str, version: str, *, group: str = "") -> dict[str, Any]:
        return dict(self._call("PUT", "storage-version", {"resource": resource, "group": group, "version": version}))

    def set_encryption(self, keys: list[str], *, resources: list[str] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"keys": keys}
        if resources is not None:
            body["resources"] = resources
        return dict(self._call("PUT", "encryption", body))

    def set_verbs(self, resource: str, verbs: list[str] | None, *, group: str = "") -> dict[str, Any]:
        """Serve a built-in resource with `verbs` only (e.g. without patch), or its own (None)."""
        return dict(self._call("PUT", "verbs", {"resource": resource, "group": group, "verbs": verbs}))

    def set_feature_gates(self, gates: dict[str, bool]) -> dict[str, Any]:
        """E.g. {"StorageVersionMigrator": True}: serve the in-tree storagemigration.k8s.io API."""
        return dict(self._call("PUT", "feature-gates", gates))

    def set_metrics(self, *, encryption_config_info: bool) -> dict[str, Any]:
        """False: this server's /metrics leaves out apiserver_encryption_config_controller_last_config_info
        (a server that predates it); True: reports it again (the default)."""
        return dict(self._call("PUT", "metrics", {"encryptionConfigInfo": encryption_config_info}))

    def svm_controller(self) -> dict[str, Any]:
        """kube-controller-manager's storage version migrator: its settings, whether it runs, its progress."""
        return dict(self._call("GET", "svm-controller"))

    def set_svm_controller(
        self,
        *,
        enabled: bool | None = None,
        gc_delay: float | None = None,
        missing_resource_grace: float | None = None,
        qps: float | None = None,
        burst: int | None = None,
    ) -> dict[str, Any]:
        """Switch the controller on or off (the API stays served), or change its timing and client limits."""
        body = {
            key: value
            for key, value in (
                ("enabled", enabled), ("gcDelaySeconds", gc_delay),
                ("missingResourceGraceSeconds", missing_resource_grace), ("kubeAPIQPS", qps), ("kubeAPIBurst", burst),
            )
            if value is not None
        }  # fmt: skip
        return dict(self._call("PUT", "svm-controller", body))

    def restart_svm_controller(self) -> dict[str, Any]:
        """Restart it as kcm restarts: what it held in memory is gone; running migrations are scanned again."""
        return dict(self._call("POST", "svm-controller/restart", {}))

    def compact(self) -> int:
        return int(self._call("POST", "compact")["revision"])

    def set_faults(self, rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(self._call("PUT", "faults", {"rules": rules})["rules"])

    def faults(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "faults")["rules"])

    def clear_faults(self) -> None:
        self._call("DELETE", "faults")

    def counters(self) -> dict[str, Any]:
        return dict(self._call("GET", "counters"))

    def timeline(self) -> dict[str, list[tuple[int, int]]]:
        """Writes the server saw per tenth of a second (wall clock), by "verb resource"."""
        tenths = self._call("GET", "timeline")["tenths"]
        return {key: [(int(t), int(n)) for t, n in rows] for key, rows in tenths.items()}

    def reset_counters(self) -> dict[str, Any]:
        return dict(self._call("DELETE", "counters"))
