"""What kubesim serves outside the resource paths: health checks, `/metrics`,
discovery and OpenAPI documents, and the 503 of an aggregated API.

Apart from the verbs because none of these is a resource request: no lookup,
no fault injection, no verb check; each is counted as `discovery` (or
`metrics`, `aggregated`) in the request counters.
"""

from __future__ import annotations

from typing import Any

from kubesim import aggregation, health, metrics, openapi, openapi_v2
from kubesim.discovery import KUBE_VERSION, api_group, api_group_list, api_versions, resource_list
from kubesim.errors import resource_not_found
from kubesim.server_http import HandlerBase


class DiscoveryServing(HandlerBase):
    """The non-resource paths of the Kubernetes API."""

    def _serve_non_resource(self, method: str, path: str, query: dict[str, str], raw: bytes) -> bool:
        """Answer a non-resource path; False when the path is a resource request."""
        registry = self.api.registry
        if method == "GET" and path.rstrip("/") in health.HEALTH_PATHS:
            code, text = health.health_answer(path, warming=self.api.warmup.active(), verbose="verbose" in query)
            self._send(code, text, headers={"X-Content-Type-Options": "nosniff"}, ctype="text/plain; charset=utf-8")
            return True
        if method == "GET" and path == metrics.PATH:  # sim/kubesim/metrics.py
            self.api.faults.count("metrics", "", bytes_in=len(raw))
            if self.api.warmup.active() and not self._superuser():
                raise metrics.warmup_forbidden(self.user.name if self.user else None)
            self._send(
                200, metrics.exposition(registry.config, started_at=self.api.started_at), ctype=metrics.CONTENT_TYPE
            )
            return True
        parts = [x for x in path.split("/") if x]
        if parts[:1] == ["apis"] and len(parts) >= 3 and aggregation.find(self._aggregated(), parts[1], parts[2]):
            # kubesim proxies nothing: an aggregated API answers as one whose server is down,
            # discovery included (kubectl: "unable to retrieve the complete list of server APIs").
            self.api.faults.count("discovery" if len(parts) == 3 else "aggregated", "", bytes_in=len(raw))
            self._send(503, aggregation.UNAVAILABLE_BODY, ctype="text/plain; charset=utf-8")
            return True
        if method == "GET":
            doc = self._static(path)
            if doc is not None:
                self.api.faults.count("discovery", "", bytes_in=len(raw))
                # bytes: the protobuf form of /openapi/v2, the only one kubectl reads. kube-openapi labels
                # it octet-stream: the protobuf media type (with its "@") is no valid Content-Type for Go.
                self._send(200, doc, ctype="application/octet-stream" if isinstance(doc, bytes) else "application/json")
                return True
        return False

    def _static(self, path: str) -> dict[str, Any] | bytes | None:
        registry = self.api.registry
        p = path.rstrip("/") or "/"
        if p == "/version":
            return dict(KUBE_VERSION)
        if p == "/api":
            return api_versions(f"{self.api.host}:{self.api.port}")
        if p == "/apis":
            return api_group_list(registry.resource_types(), self._aggregated_pairs())
        if p == "/openapi/v2":
            types = registry.resource_types()
            if openapi_v2.wants_protobuf(self.headers.get("Accept", "")):
                return openapi_v2.protobuf(types)
            return openapi_v2.document(types)
        if p.startswith("/openapi/"):
            doc = openapi.document(registry.resource_types(), p)
            if doc is None:
                raise resource_not_found()
            return doc
        parts = [x for x in p.split("/") if x]
        if parts[:1] == ["api"] and len(parts) == 2:
            doc = resource_list(registry.resource_types(), "", parts[1])
            if doc is None:
                raise resource_not_found()
            return doc
        if parts[:1] == ["apis"] and len(parts) == 2:
            doc = api_group(registry.resource_types(), parts[1], self._aggregated_pairs())
            if doc is None:
                raise resource_not_found()
            return doc
        if parts[:1] == ["apis"] and len(parts) == 3:
            doc = resource_list(registry.resource_types(), parts[1], parts[2])
            if doc is None:
                raise resource_not_found()
            return doc
        return None

    def _aggregated(self) -> list[aggregation.AggregatedGroupVersion]:
        return self.api.aggregated.get(self.api.registry)

    def _aggregated_pairs(self) -> list[tuple[str, str]]:
        return [(a.group, a.version) for a in self._aggregated()]
