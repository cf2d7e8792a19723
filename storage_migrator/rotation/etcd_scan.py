"""Read-only count of the values under an etcd key prefix, by how each is stored.

Design decision: `verify-etcd` is the operator's proof that a key rotation
reached every object (DESIGN 4.8), so it reads etcd directly, as
`etcdctl get --prefix` would, and nothing else: ranges only, no writes, no
leases, no watches. It pages through the prefix a page at a time and reads
every page at the revision of the first, so the counts are one consistent
snapshot even while the API server keeps writing. Each value is classified
(storage_migrator.rotation.etcd_values) and dropped at once: never kept, logged or
printed, and neither are the keys (DESIGN 8: these are Secrets).

We use the raw gRPC stubs of `etcd-sdk-python` (import `pyetcd`), the client
that honours range `limit` (DESIGN 6).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import pyetcd
from pyetcd import etcdrpc

from storage_migrator.rotation.etcd_values import Tally, classify

__all__ = ["EtcdEndpoint", "EtcdScanError", "PrefixScan", "prefix_end", "scan_prefix"]

PAGE_SIZE = 1000
REQUEST_TIMEOUT_SECONDS = 10.0
# etcd answers with pages up to its own send limit (2 GiB by default); a page of
# 1000 Secrets easily passes gRPC's 4 MiB default receive limit, as in etcdctl.
_GRPC_OPTIONS = [("grpc.max_receive_message_length", -1)]
_COMPACTION_RETRIES = 3


class EtcdScanError(Exception):
    """etcd could not be read: what failed, on which endpoint, and what to do."""


@dataclass(frozen=True)
class EtcdEndpoint:
    """An etcd client URL and the TLS files of etcdctl's `--cacert`, `--cert`, `--key`."""

    url: str
    cacert: Path | None = None
    cert: Path | None = None
    key: Path | None = None


@dataclass(frozen=True)
class PrefixScan:
    prefix: str
    revision: int
    tally: Tally


def prefix_end(prefix: bytes) -> bytes:
    """The exclusive end of the key range that starts with `prefix` (etcdctl's --prefix)."""
    ba = bytearray(prefix)
    for i in range(len(ba) - 1, -1, -1):
        if ba[i] < 0xFF:
            ba[i] += 1
            return bytes(ba[: i + 1])
    return b"\0"


def _read(option: str, path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise EtcdScanError(f"cannot read {option} {path}: {exc.strerror or exc}") from exc


def _client(endpoint: EtcdEndpoint) -> Any:
    url = endpoint.url if "://" in endpoint.url else f"{'https' if endpoint.cacert else 'http'}://{endpoint.url}"
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or 2379
    except ValueError as exc:
        raise EtcdScanError(f"bad etcd endpoint {endpoint.url!r}: {exc} (e.g. https://10.0.0.1:2379)") from exc
    if parts.scheme not in ("http", "https") or not host:
        raise EtcdScanError(
            f"bad etcd endpoint {endpoint.url!r}: give etcd's client URL, e.g. https://10.0.0.1:2379 or http://127.0.0.1:2379"
        )
    if (endpoint.cert is None) != (endpoint.key is None):
        raise EtcdScanError("--cert and --key go together: give the client certificate and its private key")
    secure = parts.scheme == "https"
    if not secure and (endpoint.cacert or endpoint.cert):
        raise EtcdScanError(f"TLS options given for {endpoint.url}, which is plain http: use https://{parts.netloc}")
    creds = None
    if secure:
        creds = grpc.ssl_channel_credentials(  # the system's roots when --cacert is absent, as etcdctl
            root_certificates=_read("--cacert", endpoint.cacert),
            private_key=_read("--key", endpoint.key),
            certificate_chain=_read("--cert", endpoint.cert),
        )
    ep = pyetcd.Endpoint(f"[{host}]" if ":" in host else host, port, secure=secure, creds=creds, opts=_GRPC_OPTIONS)
    return pyetcd.MultiEndpointEtcd3Client(endpoints=[ep], timeout=REQUEST_TIMEOUT_SECONDS, failover=False)


class _Compacted(Exception):
    pass


def _explain(exc: grpc.RpcError, endpoint: EtcdEndpoint) -> EtcdScanError:
    """The one place that turns a gRPC failure into what the operator should do."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else "") or str(code)
    lowered = details.lower()
    if any(w in lowered for w in ("ssl", "tls", "tsi_", "certificate", "handshake")):
        return EtcdScanError(
            f"TLS with etcd at {endpoint.url} failed: {details}. Check that the endpoint is https, --cacert is "
            "the CA that signed etcd's server certificate, and --cert/--key a client certificate etcd trusts "
            "(on a kubeadm control plane: /etc/kubernetes/pki/etcd/ca.crt, healthcheck-client.crt/.key)."
        )
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return EtcdScanError(
            f"cannot reach etcd at {endpoint.url}: {details}. Check the endpoint (etcd's client URL, as "
            "kube-apiserver's --etcd-servers, e.g. https://10.0.0.1:2379), that it is reachable from here, "
            "and for TLS the https scheme and --cacert/--cert/--key."
        )
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return EtcdScanError(
            f"etcd at {endpoint.url} refused the read: {details}. Use a client certificate etcd grants read access."
        )
    return EtcdScanError(f"etcd at {endpoint.url} failed: {code}: {details}")


def _range(client: Any, endpoint: EtcdEndpoint, request: Any) -> Any:
    try:
        return client.kvstub.Range(request, REQUEST_TIMEOUT_SECONDS)
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        details = (exc.details() if hasattr(exc, "details") else "") or ""
        if code == grpc.StatusCode.OUT_OF_RANGE or "compacted" in details:
            raise _Compacted from exc
        raise _explain(exc, endpoint) from exc


def _scan_once(client: Any, endpoint: EtcdEndpoint, prefix: bytes, page_size: int) -> tuple[int, Tally]:
    tally = Tally()
    end = prefix_end(prefix)
    start = prefix
    revision = 0  # the first page: the current revision, which every later page reads at
    while True:
        request = etcdrpc.RangeRequest(key=start, range_end=end, limit=page_size, revision=revision)
        resp = _range(client, endpoint, request)
        if revision == 0:
            revision = int(resp.header.revision)
        last_key = b""
        for kv in resp.kvs:
            tally.add(classify(kv.value))  # classified and dropped: never kept
            last_key = kv.key
        if not resp.more or not last_key:
            return revision, tally
        start = last_key + b"\0"  # the next key after the last one read
        del resp


def scan_prefix(endpoint: EtcdEndpoint, prefix: str, *, page_size: int = PAGE_SIZE) -> PrefixScan:
    """Counts of the values under `prefix` at one revision (retried from scratch if etcd compacts it meanwhile)."""
    if not prefix:
        raise EtcdScanError("the key prefix is empty: give one such as /registry/secrets/")
    client = _client(endpoint)
    try:
        for _ in range(_COMPACTION_RETRIES):
            with contextlib.suppress(_Compacted):
                revision, tally = _scan_once(client, endpoint, prefix.encode(), page_size)
                return PrefixScan(prefix=prefix, revision=revision, tally=tally)
        raise EtcdScanError(
            f"etcd at {endpoint.url} compacted the revision of the scan {_COMPACTION_RETRIES} times in a row: run again"
        )
    finally:
        with contextlib.suppress(Exception):  # closing a dead channel is fine
            client.close()
