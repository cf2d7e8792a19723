"""What an HTTP request to the Kubernetes API asks for: which resource, object and
verb (from the path and method), and in which form the answer is wanted (from
the Accept header: JSON, metadata only, or a server-side table).
"""

from __future__ import annotations

import re
from typing import Any

from kubesim.errors import StatusError, method_not_allowed, resource_not_found

META_GV = "meta.k8s.io/v1"
#: A Kubernetes API version: v1, v2beta1, v1alpha1.
VERSION_RE = re.compile(r"^v\d+((alpha|beta)\d+)?$")


def _media_types(accept: str) -> list[tuple[str, dict[str, str]]]:
    out = []
    for part in (accept or "application/json").split(","):
        bits = [b.strip() for b in part.split(";")]
        params = {}
        for b in bits[1:]:
            if "=" in b:
                k, v = b.split("=", 1)
                params[k.strip()] = v.strip()
        out.append((bits[0].lower(), params))
    return out


def negotiate(accept: str) -> str:
    """'json', 'table', 'metadata' (PartialObjectMetadata[List]); raise 406 otherwise."""
    for media, params in _media_types(accept):
        if media not in ("application/json", "*/*", "application/*"):
            continue
        as_ = params.get("as")
        if as_ is None:
            return "json"
        if as_ == "Table" and params.get("g") == "meta.k8s.io" and params.get("v") in ("v1", "v1beta1"):
            return "table"
        if as_ in ("PartialObjectMetadata", "PartialObjectMetadataList") and params.get("g") == "meta.k8s.io":
            return "metadata"
    raise StatusError(406, "NotAcceptable", f"only the following media types are accepted: application/json ({accept})")


def partial(obj: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "PartialObjectMetadata", "apiVersion": META_GV, "metadata": obj.get("metadata", {})}


class Request:
    """A parsed API path: which resource, which object, which verb."""

    def __init__(self, method: str, path: str, query: dict[str, str]) -> None:
        self.method = method
        self.query = query
        self.group = ""
        self.version = ""
        self.resource = ""
        self.namespace: str | None = None
        self.name: str | None = None
        self.subresource: str | None = None
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["api"] and len(parts) >= 2:
            self.version, rest = parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            self.group, self.version, rest = parts[1], parts[2], parts[3:]
        else:
            raise resource_not_found()
        if not rest:
            raise resource_not_found()
        if rest[0] == "namespaces" and len(rest) >= 3 and not (self.group == "" and rest[2] in ("status", "finalize")):
            self.namespace, rest = rest[1], rest[2:]
        self.resource = rest[0]
        if len(rest) >= 2:
            self.name = rest[1]
        if len(rest) >= 3:
            self.subresource = rest[2]
        if len(rest) > 3:
            raise resource_not_found()
        self.watch = query.get("watch") in ("true", "1")
        self.verb = self._verb()

    def _verb(self) -> str:
        m = self.method
        if m == "GET":
            if self.watch:
                return "watch"
            return "get" if self.name else "list"
        if m == "POST":
            return "create"
        if m == "PUT":
            return "update"
        if m == "PATCH":
            return "patch"
        if m == "DELETE":
            return "delete" if self.name else "deletecollection"
        raise method_not_allowed()
