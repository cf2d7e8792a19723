"""The write verbs of the Kubernetes API: POST, PUT, PATCH, DELETE and
deletecollection, with their options (`dryRun`, `fieldManager`, a DELETE's
preconditions).

Apart from the reads because a write carries a body and options to check
before the registry sees it (the patch types a resource takes, dryrun.py);
what the body must be is the registry's admission (registry_admission.py).
"""

from __future__ import annotations

from typing import Any

from kubesim.dryrun import dry_run_requested
from kubesim.errors import StatusError, method_not_allowed
from kubesim.resources import ResourceType
from kubesim.routing import Request
from kubesim.server_reads import ReadVerbs

_PATCH_TYPES = (
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/json-patch+json",
)


class WriteVerbs(ReadVerbs):
    """Writes, answering with the read verbs' shapes."""

    def _manager(self, req: Request) -> str:
        if req.query.get("fieldManager"):
            return req.query["fieldManager"]
        agent = self.headers.get("User-Agent") or "unknown"
        return agent.split("/")[0] or "unknown"

    def _serve_write(self, rt: ResourceType, req: Request, raw: bytes, accept: str) -> None:
        registry = self.api.registry
        options = self._json_body(raw) if req.verb in ("delete", "deletecollection") and raw else None
        dry_run = dry_run_requested(req.verb, req.query, options)
        manager = self._manager(req)
        if req.verb == "create":
            if req.name is not None:
                raise method_not_allowed()
            obj = registry.create(
                rt, req.version, req.namespace, self._json_body(raw), manager=manager, dry_run=dry_run
            )
            self._send_object(rt, obj, accept, req, code=201)
        elif req.verb == "update":
            assert req.name is not None
            body = self._json_body(raw)
            obj = registry.update(
                rt, req.version, req.namespace, req.name, lambda _current: body,
                subresource=req.subresource, manager=manager, dry_run=dry_run,
            )  # fmt: skip
            self._send_object(rt, obj, accept, req)
        elif req.verb == "patch":
            assert req.name is not None
            ctype = self._patch_type(rt)
            obj = registry.patch(
                rt, req.version, req.namespace, req.name, ctype, self._json_body(raw),
                subresource=req.subresource, manager=manager, dry_run=dry_run,
            )  # fmt: skip
            self._send_object(rt, obj, accept, req)
        elif req.verb == "delete":
            self._delete(rt, req, options, dry_run)
        elif req.verb == "deletecollection":
            self._delete_collection(rt, req, dry_run)
        else:
            raise method_not_allowed()

    def _patch_type(self, rt: ResourceType) -> str:
        """The request's patch type; 415 for one kube-apiserver does not take for this resource."""
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype not in _PATCH_TYPES:
            raise StatusError(
                415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                f"accepted media types include: application/json-patch+json, application/merge-patch+json, "
                f"application/strategic-merge-patch+json ({ctype})", details={},
            )  # fmt: skip
        if ctype == "application/strategic-merge-patch+json" and rt.is_custom:
            raise StatusError(
                415, "UnsupportedMediaType",
                "strategic merge patch is not supported for custom resources; use a merge patch", details={},
            )  # fmt: skip
        return ctype

    def _delete(self, rt: ResourceType, req: Request, options: Any, dry_run: bool) -> None:
        registry = self.api.registry
        assert req.name is not None
        opts = options or {}
        pre = (opts.get("preconditions") if isinstance(opts, dict) else None) or {}
        deleted = registry.delete(rt, req.version, req.namespace, req.name, preconditions=pre, dry_run=dry_run)
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": req.name,
                **({"group": rt.group} if rt.group else {}),
                "kind": rt.resource,
                "uid": deleted["metadata"].get("uid"),
            },
        }
        self._send(200, deleted if rt.is_custom else status)

    def _delete_collection(self, rt: ResourceType, req: Request, dry_run: bool) -> None:
        registry = self.api.registry
        predicate = self._predicate(rt, req)
        listed = registry.list(rt, req.version, req.namespace, predicate=predicate)
        for obj in listed.items:
            meta = obj["metadata"]
            try:
                registry.delete(rt, req.version, meta.get("namespace"), meta["name"], dry_run=dry_run)
            except StatusError as exc:
                if exc.code != 404:
                    raise
        self._send(200, self._list_doc(rt, req, listed.items, listed.resource_version, None, None, "json"))
