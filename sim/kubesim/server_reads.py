"""The read verbs of the Kubernetes API: GET, LIST and WATCH, in the form the
client asks for (JSON, `as=PartialObjectMetadata[List]`, `as=Table`).

Apart from the writes because a read answers what the registry holds, shaped
by content negotiation (routing.py) and label and field selectors; the write
verbs answer with the same shapes (`_send_object`, `_list_doc`).
"""

from __future__ import annotations

import json
import time
from typing import Any

from kubesim.errors import bad_request
from kubesim.resources import ResourceType
from kubesim.routing import META_GV, Request, negotiate, partial
from kubesim.selectors import field_selector, label_selector
from kubesim.server_http import HandlerBase
from kubesim.tables import to_table

_WATCH_TIMEOUT_DEFAULT = 1800.0


class ReadVerbs(HandlerBase):
    """GET, LIST and WATCH of a resource."""

    def _serve_read(self, rt: ResourceType, req: Request, accept: str) -> None:
        if req.verb == "get":
            assert req.name is not None
            obj = self.api.registry.get(rt, req.version, req.namespace, req.name)
            self._send_object(rt, obj, accept, req)
        elif req.verb == "list":
            self._list(rt, req, accept)
        else:
            self._watch(rt, req, accept)

    def _send_object(self, rt: ResourceType, obj: dict[str, Any], accept: str, req: Request, code: int = 200) -> None:
        mode = negotiate(accept)
        if mode == "metadata":
            self._send(code, partial(obj))
        elif mode == "table":
            self._send(code, to_table(rt, [obj], include=req.query.get("includeObject", "Metadata")))
        else:
            self._send(code, obj)

    def _predicate(self, rt: ResourceType, req: Request) -> Any:
        labels = label_selector(req.query.get("labelSelector"))
        fields = field_selector(req.query.get("fieldSelector"), kind=rt.kind)
        if not req.query.get("labelSelector") and not req.query.get("fieldSelector"):
            return None
        return lambda obj: labels(obj) and fields(obj)

    def _list(self, rt: ResourceType, req: Request, accept: str) -> None:
        mode = negotiate(accept)
        try:
            limit = int(req.query.get("limit") or 0)
        except ValueError as exc:
            raise bad_request(f"limit must be an integer: {req.query.get('limit')!r}") from exc
        listed = self.api.registry.list(
            rt,
            req.version,
            req.namespace,
            limit=max(limit, 0),
            continue_token=req.query.get("continue") or None,
            resource_version=req.query.get("resourceVersion"),
            resource_version_match=req.query.get("resourceVersionMatch"),
            predicate=self._predicate(rt, req),
        )
        doc = self._list_doc(
            rt, req, listed.items, listed.resource_version, listed.continue_token, listed.remaining, mode
        )
        self._send(200, doc)

    def _list_doc(
        self,
        rt: ResourceType,
        req: Request,
        items: list[dict[str, Any]],
        rv: str,
        token: str | None,
        remaining: int | None,
        mode: str,
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": rv}
        if token:
            meta["continue"] = token
        if remaining is not None:
            meta["remainingItemCount"] = remaining
        if mode == "table":
            table = to_table(rt, items, include=req.query.get("includeObject", "Metadata"))
            table["metadata"] = meta
            return table
        if mode == "metadata":
            return {"kind": "PartialObjectMetadataList", "apiVersion": META_GV, "metadata": meta,
                    "items": [partial(o) for o in items]}  # fmt: skip
        # Items of a list carry no apiVersion/kind (reference/list-page1-limit2.json).
        return {
            "kind": f"{rt.kind}List",
            "apiVersion": rt.group_version(req.version),
            "metadata": meta,
            "items": [{k: v for k, v in o.items() if k not in ("apiVersion", "kind")} for o in items],
        }

    def _watch(self, rt: ResourceType, req: Request, accept: str) -> None:
        mode = negotiate(accept)
        predicate = self._predicate(rt, req) or (lambda obj: True)
        timeout = float(req.query.get("timeoutSeconds") or _WATCH_TIMEOUT_DEFAULT)
        events, cancel = self.api.registry.watch(
            rt,
            req.version,
            req.namespace,
            resource_version=req.query.get("resourceVersion"),
            predicate=predicate,
            send_initial=req.query.get("sendInitialEvents") == "true",
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        deadline = time.monotonic() + timeout
        try:
            for event in events:
                if self.api.stopping.is_set() or time.monotonic() > deadline:
                    break
                if event is None:
                    continue
                obj = event.obj
                if event.type in ("ADDED", "MODIFIED", "DELETED"):
                    if mode == "metadata":
                        obj = partial(obj)
                    elif mode == "table":
                        obj = to_table(rt, [obj], include=req.query.get("includeObject", "Metadata"))
                line = json.dumps({"type": event.type, "object": obj}).encode() + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()
                self.api.faults.sent(len(line))
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass
        finally:
            cancel()
            self.close_connection = True
