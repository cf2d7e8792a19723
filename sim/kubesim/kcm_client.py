"""kube-controller-manager's client of one API server, for the controllers kubesim runs.

Design decision: the controllers kubesim runs for the cluster (sim/kubesim/svm_controller.py)
write over HTTP(S) to one API server, as kcm does through its kubeconfig, not
into the registry: every write then goes through that server's write path
(admission, etcd, faults) and shows in its request counters and per-second
write timeline, where a test or the write-budget bench sees it.

As client-go's REST client does it (k8s.io/client-go/rest, util/flowcontrol):
- requests wait for a token of a token bucket of `qps` tokens a second holding
  at most `burst` (kcm's `--kube-api-qps`, `--kube-api-burst`); the bucket
  starts full;
- a 429 or a 5xx that carries a `Retry-After` header is sent again after that
  many seconds, up to 10 times (`checkWait`, `maxRetries`); any other answer is
  the caller's.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
PARTIAL_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
#: client-go's maxRetries for an answer with Retry-After.
_MAX_RETRIES = 10


class Unreachable(Exception):
    """The server did not answer (down, restarting, or the connection dropped): worth retrying."""


class Stopped(Exception):
    """The client was stopped while a request waited for its turn."""


class TokenBucket:
    """flowcontrol.NewTokenBucketRateLimiter: `qps` tokens a second, at most `burst` saved, full at start."""

    def __init__(self, qps: float, burst: int) -> None:
        self._lock = threading.Lock()
        self.qps, self.burst = float(qps), int(burst)
        self._tokens = float(burst)
        self._at = time.monotonic()

    def configure(self, qps: float, burst: int) -> None:
        with self._lock:
            self._refill()
            self.qps, self.burst = float(qps), int(burst)
            self._tokens = min(self._tokens, float(burst))

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
        self._at = now

    def wait(self, stop: threading.Event) -> None:
        """Take a token, sleeping until one is there; raises Stopped when `stop` is set meanwhile."""
        while True:
            with self._lock:
                self._refill()
                if self._tokens >= 1.0:
                    self._tokens -= 1.0
                    return
                pause = (1.0 - self._tokens) / self.qps
            if stop.wait(pause):
                raise Stopped


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status <= 299

    @property
    def message(self) -> str:
        """What client-go's StatusError says: the Status' message."""
        if isinstance(self.body, dict) and self.body.get("message"):
            return str(self.body["message"])
        return f"the server responded with the status code {self.status} but did not return more information"

    @property
    def retry_after(self) -> int | None:
        value = self.headers.get("retry-after")
        if value is None and isinstance(self.body, dict):
            value = ((self.body.get("details") or {}).get("retryAfterSeconds")) or None
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None


@dataclass
class Endpoint:
    """Where the client talks: the server's URL, how to trust it, and the bearer token."""

    url: str
    context: ssl.SSLContext | None
    token: str


class KubeClient:
    """One kind of client of kcm's (its own token bucket), thread-safe: a connection per thread."""

    def __init__(
        self, endpoint: Callable[[], Endpoint | None], limiter: TokenBucket, *, user_agent: str, stop: threading.Event
    ) -> None:
        self._endpoint = endpoint
        self.limiter = limiter
        self._user_agent = user_agent
        self._stop = stop
        self._local = threading.local()

    def _connection(self, endpoint: Endpoint) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "url", None) == endpoint.url:
            return conn
        self.close()
        parts = urlsplit(endpoint.url)
        host, port = parts.hostname or "127.0.0.1", parts.port
        if endpoint.context is None:
            conn = http.client.HTTPConnection(host, port, timeout=30)
        else:
            conn = http.client.HTTPSConnection(host, port, timeout=30, context=endpoint.context)
        self._local.conn, self._local.url = conn, endpoint.url
        return conn

    def close(self) -> None:
        """Close this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()
        self._local.conn = None

    def request(self, method: str, path: str, body: Any = None, *, ctype: str = JSON, accept: str = JSON) -> Answer:
        """Send one request (after a token); Unreachable when no answer came, Stopped when stopped."""
        for _attempt in range(_MAX_RETRIES + 1):
            self.limiter.wait(self._stop)
            answer = self._send(method, path, body, ctype=ctype, accept=accept)
            retryable = answer.status == 429 or 500 <= answer.status <= 504
            wait = answer.headers.get("retry-after")
            if not retryable or wait is None:
                return answer
            try:
                seconds = max(0.0, float(wait))
            except ValueError:
                return answer
            if self._stop.wait(seconds):
                raise Stopped
        return answer

    def _send(self, method: str, path: str, body: Any, *, ctype: str, accept: str) -> Answer:
        endpoint = self._endpoint()
        if endpoint is None:
            raise Unreachable("no API server to talk to")
        headers = {"Accept": accept, "User-Agent": self._user_agent, "Authorization": f"Bearer {endpoint.token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = ctype
        for reused in (True, False):
            conn = self._connection(endpoint)
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if reused:
                    continue  # a kept connection the server dropped since: once more on a new one
                raise Unreachable(f"{method} {path}: {exc}") from exc
            if resp.will_close:
                self.close()
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = raw.decode(errors="replace")
            return Answer(resp.status, parsed, {k.lower(): v for k, v in resp.getheaders()})
        raise Unreachable(f"{method} {path}: no answer")
