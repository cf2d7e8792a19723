"""The least a client can do to migrate a resource over TLS: the baseline of bench/client_cpu.py.

`http.client` over one TLS context built once from a kubeconfig (its CA, and its
bearer token or client certificate, as the official loader reads them, exec
plugins included, once), a main-thread connection for the metadata-only LIST
and `threads` writer threads, each keeping one connection alive, for the no-op
merge patches. Each answer is decoded for its resourceVersion, which is what a
tally needs; nothing else is done per object.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from kubernetes import config as kube_config
from kubernetes.client import Configuration

__all__ = ["RawLoop"]

LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
PATCH_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


class RawLoop:
    """LIST a page, patch its items on `threads` threads, next page, until the LIST ends."""

    def __init__(self, host: str, context: ssl.SSLContext | None, headers: dict[str, str], *, threads: int) -> None:
        parts = urlsplit(host)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)
        self._context = context
        self._headers = headers
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="raw")
        self._opened: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str, *, threads: int) -> RawLoop:
        """Credentials and CA through the official loader, read once."""
        cfg = Configuration()
        kube_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
        headers = {"Authorization": cfg.api_key["BearerToken"]} if cfg.api_key.get("BearerToken") else {}
        context = None
        if str(cfg.host).startswith("https"):
            context = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
            if not cfg.verify_ssl:
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            if cfg.cert_file:
                context.load_cert_chain(cfg.cert_file, cfg.key_file)
        return cls(str(cfg.host), context, headers, threads=threads)

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._context is not None:
                conn = http.client.HTTPSConnection(self._host, self._port, timeout=60, context=self._context)
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=60)
            self._local.conn = conn
            with self._lock:
                self._opened.append(conn)
        return conn

    def _call(self, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> tuple[int, bytes]:
        """One request on this thread's connection; reconnects once if the server closed it."""
        for attempt in (0, 1):
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers={**self._headers, **headers})
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (http.client.RemoteDisconnected, ConnectionError, http.client.CannotSendRequest):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _patch(self, item: dict[str, Any]) -> bool:
        meta = item["metadata"]
        ns = meta.get("namespace")
        base = f"/api/v1/namespaces/{quote(ns)}/configmaps" if ns else "/api/v1/configmaps"
        body = json.dumps({"metadata": {"resourceVersion": meta["resourceVersion"]}}).encode()
        status, data = self._call("PATCH", f"{base}/{quote(meta['name'])}", {
            "Accept": PATCH_ACCEPT, "Content-Type": "application/merge-patch+json"}, body)  # fmt: skip
        if status in (404, 409):
            return False
        if status != 200:
            raise RuntimeError(f"PATCH {meta['name']}: {status}")
        return bool(json.loads(data)["metadata"]["resourceVersion"] != meta["resourceVersion"])

    def run(self, list_path: str, *, limit: int) -> int:
        """Objects listed (and patched)."""
        token: str | None = None
        objects = 0
        while True:
            query = {"limit": str(limit), **({"continue": token} if token else {})}
            status, data = self._call("GET", f"{list_path}?{urlencode(query)}", {"Accept": LIST_ACCEPT})
            if status != 200:
                raise RuntimeError(f"LIST: {status} {data[:200]!r}")
            page = json.loads(data)
            items = page.get("items") or []
            list(self._pool.map(self._patch, items))
            objects += len(items)
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                return objects

    def close(self) -> None:
        self._pool.shutdown()
        with self._lock:
            for conn in self._opened:
                conn.close()
