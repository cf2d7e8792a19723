"""The one request function every call of the access layer goes through.

Design decision: we need raw JSON both ways (LIST pages stay plain dicts, the
PUT fallback sends the bytes exactly as read, DESIGN 4.1), which the generated
typed API classes cannot do. We still use the official client for everything
that touches credentials: ``ApiClient.param_serialize`` builds the URL and the
auth headers (bearer tokens, exec plugins and their refresh hooks), and the
client's own urllib3 pool manager carries TLS, client certificates and proxy
settings. We call that pool manager directly rather than
``rest_client.request`` because the latter ``json.dumps`` every body sent with a
JSON content type, which would re-encode raw bytes.

urllib3's own retries are switched off (``retries=False``): retrying is decided
in one place (``errors.is_retriable``) by the caller, with backoff and the
server's Retry-After hint.

Issue 22 (client CPU per object over TLS): every object costs one request, so
what the pool manager does per request counts. Without a proxy, the API
server's connection pool is looked up once per client and asked directly
(the manager parses the URL and builds a pool key on every request, about as
much CPU as the TLS records themselves); through a proxy the manager keeps
routing. Timeouts are built once per value, and the answer's headers are kept
as urllib3 read them rather than copied.
"""

from __future__ import annotations

import functools
import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import urllib3
from kubernetes.client import ApiClient

from storage_migrator.kube.answers import from_http_response, from_transport_error

__all__ = [
    "ACCEPT_JSON",
    "ACCEPT_PARTIAL_METADATA",
    "ACCEPT_PARTIAL_METADATA_LIST",
    "CONTENT_JSON",
    "CONTENT_MERGE_PATCH",
    "DEFAULT_TIMEOUT_SECONDS",
    "RawResponse",
    "request",
]

ACCEPT_JSON: Final = "application/json"
#: Metadata-only answer for one object (DESIGN 4.5: 428 B instead of 1,463 B for a Secret).
ACCEPT_PARTIAL_METADATA: Final = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
#: Metadata-only LIST: object bodies never leave the API server.
ACCEPT_PARTIAL_METADATA_LIST: Final = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
CONTENT_JSON: Final = "application/json"
CONTENT_MERGE_PATCH: Final = "application/merge-patch+json"
#: A LIST page of 500 large Secrets can take a while; a hung connection must not hang a run.
DEFAULT_TIMEOUT_SECONDS: Final = 60.0


@dataclass(frozen=True)
class RawResponse:
    """A successful (2xx) answer: status, headers and the body bytes, undecoded."""

    status: int
    data: bytes = field(repr=False)  # may be an object body: never in a repr
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def size(self) -> int:
        """Bytes received in the body (cheap traffic accounting for task results)."""
        return len(self.data)

    def json(self) -> Any:
        """Decode the body as JSON (the caller decides what shape it expects)."""
        return json.loads(self.data)


def request(
    api_client: ApiClient,
    *,
    method: str,
    path: str,
    what: str,
    query: Mapping[str, str | int] | None = None,
    accept: str = ACCEPT_JSON,
    content_type: str | None = None,
    body: bytes | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> RawResponse:
    """Send one request and return its 2xx answer, or raise a ``KubeError``.

    ``what`` names the object or resource for error messages (never a body).
    """
    headers: dict[str, str] = {"Accept": accept}
    if content_type is not None:
        headers["Content-Type"] = content_type
    query_params = [(key, str(value)) for key, value in (query or {}).items()]
    _, url, auth_headers, _, _ = api_client.param_serialize(
        method=method,
        resource_path=path,
        query_params=query_params or None,
        header_params=headers,
        auth_settings=["BearerToken"],
    )
    manager: urllib3.PoolManager = api_client.rest_client.pool_manager
    try:
        direct = _server_pool(manager, str(api_client.configuration.host), url)
        if direct is not None:
            pool, request_uri = direct
            response = pool.urlopen(method, request_uri, body=body, headers=auth_headers, timeout=_timeout(timeout),
                                    retries=False, preload_content=True, assert_same_host=False, redirect=False)  # fmt: skip
        else:
            response = manager.request(method, url, body=body, headers=auth_headers, timeout=_timeout(timeout),
                                       retries=False, preload_content=True)  # fmt: skip
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise from_transport_error(exc, what=what) from exc
    if not 200 <= response.status <= 299:
        raise from_http_response(response, what=what)
    return RawResponse(status=response.status, data=response.data, headers=response.headers)


@functools.lru_cache(maxsize=16)
def _timeout(seconds: float) -> urllib3.Timeout:
    """One Timeout per value: the pool clones it for each request."""
    return urllib3.Timeout(total=seconds)


#: Pool manager -> (API server URL, length of its scheme://host:port, its connection pool); gone with the
#: client. The pool is held weakly: `ApiClient.close()` clears the manager, which drops its pools, and
#: urllib3 closes a pool's connections when the pool is collected; a strong reference here would keep
#: them open for as long as the closed client lives.
_POOLS: weakref.WeakKeyDictionary[
    urllib3.PoolManager, tuple[str, int, weakref.ReferenceType[urllib3.HTTPConnectionPool]]
] = weakref.WeakKeyDictionary()


def _server_pool(manager: urllib3.PoolManager, host: str, url: str) -> tuple[urllib3.HTTPConnectionPool, str] | None:
    """The API server's connection pool and the request's URI (a path prefix of the server URL
    kept: `https://rancher/k8s/clusters/c-1`), or None: let the manager route it (a proxy)."""
    if type(manager) is not urllib3.PoolManager or not url.startswith(host):
        return None
    known = _POOLS.get(manager)
    pool = known[2]() if known is not None and known[0] == host else None
    if pool is None or known is None:
        parsed = urllib3.util.parse_url(host)
        origin = f"{parsed.scheme}://{parsed.netloc}"
        if not host.startswith(origin):
            return None
        pool = manager.connection_from_url(origin)
        known = (host, len(origin), weakref.ref(pool))
        _POOLS[manager] = known
    return pool, url[known[1] :]
