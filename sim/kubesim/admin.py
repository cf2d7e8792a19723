"""A client of kubesim's admin API (`/_kubesim/`), for tests, the demo, the
benchmarks and `python -m kubesim admin`.

Over HTTPS it verifies the server's certificate: against the CA of the
kubeconfig it was built from, or else this process's kubesim CA (the one every
in-process cluster serves with, sim/kubesim/tls.py)."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from kubesim import tls


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


class Admin:
    def __init__(self, url: str, *, timeout: float = 30.0, ca_pem: bytes | None = None) -> None:
        """`ca_pem`: the CA the server's certificate chains to (default: this process's kubesim CA)."""
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._context: ssl.SSLContext | None = tls.client_context(ca_pem) if self.url.startswith("https:") else None

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path | str, context: str | None = None) -> Admin:
        entry = _cluster_entry(kubeconfig, context)
        ca_data = entry.get("certificate-authority-data")
        ca_pem = base64.b64decode(ca_data) if ca_data else None
        return cls(str(entry["server"]), ca_pem=ca_pem)

    def _call(self, method: str, route: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.url}/_kubesim/{route}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._context) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("message", str(exc))
            except ValueError:
                message = str(exc)
            raise AdminError(message) from None

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
