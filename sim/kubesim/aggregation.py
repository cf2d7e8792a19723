"""Aggregated APIs: APIServices whose group version another server serves.

kube-apiserver's aggregator lists the group of every APIService in `/apis`,
and proxies `/apis/<group>/<version>/...` to the service named in
`spec.service`. kubesim proxies nothing, so such a group version behaves as on
a real cluster whose aggregated API server is down (a broken metrics-server is
the everyday case): listed in `/apis`, and every request under it, discovery
included, answers 503 with the aggregator's plain-text "service unavailable".
That is what makes `kubectl api-resources` print "unable to retrieve the
complete list of server APIs", and what our discovery must survive.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from kubesim.registry import Registry
from kubesim.resources import ResourceType

#: What the aggregator's proxy answers when the APIService's backend is not available.
UNAVAILABLE_BODY = b"service unavailable\n"


@dataclass(frozen=True)
class AggregatedGroupVersion:
    group: str
    version: str
    service: str  # "<namespace>/<name>", for messages


def _apiservice_type(registry: Registry) -> ResourceType:
    return next(rt for rt in registry.builtin_types() if rt.resource == "apiservices")


def aggregated_group_versions(registry: Registry, served: list[ResourceType]) -> list[AggregatedGroupVersion]:
    """APIServices with a service whose group version no local resource serves."""
    local = {(rt.group, v) for rt in served for v in rt.served_versions}
    out = []
    for obj in registry.list(_apiservice_type(registry), "v1", None).items:
        spec: dict[str, Any] = obj.get("spec") or {}
        service = spec.get("service")
        group, version = str(spec.get("group") or ""), str(spec.get("version") or "")
        if not isinstance(service, dict) or not group or not version or (group, version) in local:
            continue
        out.append(AggregatedGroupVersion(group, version, f"{service.get('namespace')}/{service.get('name')}"))
    return sorted(out, key=lambda a: (a.group, a.version))


def find(aggregated: list[AggregatedGroupVersion], group: str, version: str) -> AggregatedGroupVersion | None:
    return next((a for a in aggregated if (a.group, a.version) == (group, version)), None)


class AggregatedCache:
    """`aggregated_group_versions` re-read at most every quarter second.

    Every request under `/apis/` asks; reading the APIServices from etcd each time
    would halve kubesim's throughput. A new APIService takes as long to show as a
    new CRD does (a real aggregator also needs a moment).
    """

    TTL_SECONDS = 0.25

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = -1.0
        self._value: list[AggregatedGroupVersion] = []

    def get(self, registry: Registry) -> list[AggregatedGroupVersion]:
        with self._lock:
            if time.monotonic() - self._at > self.TTL_SECONDS:
                self._value = aggregated_group_versions(registry, registry.resource_types())
                self._at = time.monotonic()
            return self._value
