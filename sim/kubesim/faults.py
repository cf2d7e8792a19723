"""Fault injection and request counters, driven through the admin API.

A rule matches requests by verb, resource, namespace and name, and then fires
with a probability (`rate`) at most `times` times: it answers an error code (429
with Retry-After in both shapes kube-apiserver uses: a JSON `Status` with
`details.retryAfterSeconds`, or priority-and-fairness' plain-text reply), adds
latency, or drops the connection without an answer.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class FaultRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    verb: str | None = Field(default=None, description="get, list, watch, create, update, patch, delete; None: any")
    resource: str | None = Field(default=None, description="group-resource, e.g. 'secrets', 'widgets.example.com'")
    namespace: str | None = None
    name: str | None = Field(default=None, description="only requests for this object")
    subresource: str | None = None
    code: int | None = Field(default=None, description="HTTP status to answer, e.g. 429, 500, 503, 422")
    reason: str | None = Field(default=None, description="Status reason; derived from the code when None")
    message: str = "injected fault"
    causes: list[dict[str, str]] | None = Field(
        default=None,
        description=(
            "Status details.causes ({reason, message, field}), as kube-apiserver sends with a 422 "
            "(field.ErrorList: one cause per invalid field)"
        ),
    )
    retry_after: int | None = Field(default=None, description="seconds, sent as the Retry-After header")
    shape: Literal["status", "plain"] = Field(
        default="status", description="429 as a JSON Status (details.retryAfterSeconds) or as plain text"
    )
    latency: float = Field(default=0.0, ge=0, description="seconds to wait before answering")
    drop: bool = Field(default=False, description="close the connection without an answer")
    rate: float = Field(default=1.0, ge=0, le=1, description="probability that a matching request is hit")
    times: int | None = Field(default=None, ge=0, description="fire at most this many times; None: no limit")
    fired: int = 0

    def matches(self, *, verb: str, resource: str, namespace: str | None, name: str | None, sub: str | None) -> bool:
        return (
            (self.verb is None or self.verb == verb)
            and (self.resource is None or self.resource == resource)
            and (self.namespace is None or self.namespace == namespace)
            and (self.name is None or self.name == name)
            and (self.subresource is None or self.subresource == sub)
        )


_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


WRITE_VERBS = frozenset({"create", "update", "patch", "delete"})
#: Tenths of a second of write times kept per verb and resource (half an hour).
TIMELINE_TENTHS = 18_000


def reason_for(code: int) -> str:
    return _REASONS.get(code, "Unknown")


class Faults:
    """The rules in force and the counters, shared by the handler threads."""

    def __init__(self, *, seed: int | None = None) -> None:
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []
        self._random = random.Random(seed)
        self.requests: Counter[str] = Counter()
        self.requests_by_resource: Counter[str] = Counter()
        self.bytes_in = 0
        self.bytes_out = 0
        self.faults_fired = 0
        #: "verb resource" -> writes per tenth of a second (wall clock), for the write-budget
        #: judge: when the server saw each write, not when a client sampled a counter.
        self.write_times: dict[str, Counter[int]] = {}

    def set_rules(self, rules: list[FaultRule]) -> None:
        with self._lock:
            self._rules = list(rules)

    def rules(self) -> list[FaultRule]:
        with self._lock:
            return [r.model_copy() for r in self._rules]

    def pick(self, **match: Any) -> FaultRule | None:
        with self._lock:
            for rule in self._rules:
                if not rule.matches(**match):
                    continue
                if rule.times is not None and rule.fired >= rule.times:
                    continue
                if rule.rate < 1.0 and self._random.random() >= rule.rate:
                    continue
                rule.fired += 1
                self.faults_fired += 1
                return rule.model_copy()
        return None

    def count(self, verb: str, resource: str, *, bytes_in: int = 0) -> None:
        tenth = int(time.time() * 10)
        with self._lock:
            self.requests[verb] += 1
            if resource:
                self.requests_by_resource[f"{verb} {resource}"] += 1
                if verb in WRITE_VERBS:
                    times = self.write_times.setdefault(f"{verb} {resource}", Counter())
                    times[tenth] += 1
                    while len(times) > TIMELINE_TENTHS:  # keep the last half hour (oldest inserted first)
                        del times[next(iter(times))]
            self.bytes_in += bytes_in

    def sent(self, n: int) -> None:
        with self._lock:
            self.bytes_out += n

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": dict(self.requests),
                "requestsByResource": dict(self.requests_by_resource),
                "bytesIn": self.bytes_in,
                "bytesOut": self.bytes_out,
                "faultsFired": self.faults_fired,
            }

    def timeline(self) -> dict[str, list[list[int]]]:
        """Writes per tenth of a second: {"patch configmaps": [[tenth, n], ...]}, oldest first."""
        with self._lock:
            return {key: [[t, n] for t, n in sorted(times.items())] for key, times in self.write_times.items()}

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.requests_by_resource.clear()
            self.write_times.clear()
            self.bytes_in = self.bytes_out = self.faults_fired = 0
