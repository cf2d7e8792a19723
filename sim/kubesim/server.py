"""The HTTP front of one simulated API server: routing, content negotiation,
faults, counters, and the admin API under `/_kubesim/`.

It speaks enough of the Kubernetes REST API that the official Python client and
kubectl work against it unchanged (DESIGN 6): discovery, OpenAPI documents for
kubectl's validation, GET/LIST/WATCH, POST, PUT, PATCH (merge, JSON,
strategic), DELETE, the status subresource, metadata-only answers
(`as=PartialObjectMetadata[List]`) and server-side tables (`as=Table`, with a
CRD's printer columns), and `/metrics` (sim/kubesim/metrics.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from kubesim import aggregation, encryption, health, leases, metrics, openapi, openapi_v2, protobuf, storageversions
from kubesim.access import AccessConfig, AccessControl
from kubesim.admin_ops import AdminOperations
from kubesim.authn import SUPERUSER_GROUP, UserInfo
from kubesim.discovery import KUBE_VERSION, api_group, api_group_list, api_versions, resource_list
from kubesim.dryrun import dry_run_requested
from kubesim.errors import StatusError, bad_request, method_not_allowed, resource_not_found
from kubesim.faults import FaultRule, Faults, reason_for
from kubesim.registry import Registry
from kubesim.resources import ResourceType
from kubesim.routing import META_GV, VERSION_RE, Request, negotiate, partial
from kubesim.selectors import field_selector, label_selector
from kubesim.tables import to_table

log = logging.getLogger("kubesim")

_WATCH_TIMEOUT_DEFAULT = 1800.0


class ApiServer(AdminOperations):
    """One simulated kube-apiserver: a registry, faults and an HTTP listener."""

    #: Its identity lease and garbage collectors, while started (sim/kubesim/leases.py).
    identity: leases.IdentityLease | None = None

    def __init__(
        self,
        registry: Registry,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        authz_warmup_seconds: float = 0.0,
        access: AccessConfig | None = None,
    ) -> None:
        self.registry = registry
        #: Authentication and RBAC (sim/kubesim/access.py), when a token file is given.
        self.access_config = access if access is not None and access.authenticating else None
        self.access: AccessControl | None = None
        self.faults = Faults()
        self.aggregated = aggregation.AggregatedCache()
        self.started_at = time.time()
        #: After a start, 403 to every API request for this long (sim/kubesim/health.py).
        self.authz_warmup_seconds = authz_warmup_seconds
        self.warmup = health.Warmup(authz_warmup_seconds)
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        handler = type("BoundHandler", (Handler,), {"api": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.host, self.port = str(self.httpd.server_address[0]), int(self.httpd.server_address[1])
        self._thread: threading.Thread | None = None
        self.stopping = threading.Event()
        #: Polls the --encryption-provider-config file while started, with automatic reload on.
        self.encryption_reloader: encryption.Reloader | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, *, identity_lease_seconds: int = leases.LEASE_SECONDS) -> ApiServer:
        """Take an identity lease, publish StorageVersions, then serve.

        In this order (seed 001): "An API server needs to establish its membership
        in the list of participating API servers before updating storageVersion"
        (or the garbage collector takes its fresh entries for stale ones), and "the
        API server [updates] the storageVersion before accepting API requests".
        """
        try:
            self._read_encryption_file()
            if self.access_config is not None:
                self.access = AccessControl(self.access_config, self.registry)
                self.access.start()
        except (encryption.ConfigError, ValueError):
            self.httpd.server_close()
            raise
        self.identity = leases.IdentityLease(
            self.registry.etcd.url, self.registry.config, lease_seconds=identity_lease_seconds
        ).start()
        storageversions.publish(self.registry)
        self._start_encryption_reload()
        self._thread = threading.Thread(target=self.httpd.serve_forever, name=f"kubesim-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self, *, lease_seconds: int | None = None) -> None:
        """Stop serving and renewing. The identity lease and the StorageVersion entries stay
        (kube-apiserver deletes neither): the garbage collectors of the servers still up remove
        them once the lease has expired, `lease_seconds` from now when given (sim/kubesim/leases.py)."""
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        # A stopped server drops the connections in flight (keep-alive ones too).
        with self.connections_lock:
            open_connections = list(self.connections)
        for conn in open_connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.identity is not None:
            self.identity.stop(lease_seconds=lease_seconds)
            self.identity = None
        if self.encryption_reloader is not None:
            self.encryption_reloader.stop()
            self.encryption_reloader = None

    def _read_encryption_file(self) -> None:
        """kube-apiserver reads --encryption-provider-config at every start (a restart too):
        an invalid file raises encryption.ConfigError and the server does not start."""
        enc = self.registry.config.encryption
        if enc.file_path is not None:
            enc.file = encryption.load(enc.file_path)
            enc.reload_error = None

    def _start_encryption_reload(self) -> None:
        """kube-apiserver's --encryption-provider-config-automatic-reload: poll the file."""
        enc = self.registry.config.encryption
        if enc.file is None or enc.file_path is None or enc.reload_interval is None:
            return

        def apply(config: encryption.EncryptionConfiguration) -> None:
            with self.registry.lock:
                enc.file = config

        def report(error: str | None) -> None:
            enc.reload_error = error

        self.encryption_reloader = encryption.Reloader(
            path=enc.file_path, interval=enc.reload_interval, current_hash=enc.file.hash, apply=apply,
            report_error=report,
        )  # fmt: skip
        self.encryption_reloader.start()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, the client's
    # delayed ACK costs 40 ms per request.
    disable_nagle_algorithm = True
    api: ApiServer
    server_version = "kubesim"
    #: Who sent the request being served (None: authentication is off).
    user: UserInfo | None = None

    def setup(self) -> None:
        super().setup()
        with self.api.connections_lock:
            self.api.connections.add(self.connection)

    def finish(self) -> None:
        with self.api.connections_lock:
            self.api.connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # Every method goes through one dispatcher.
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # ----- plumbing -------------------------------------------------------
    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json_body(self, raw: bytes) -> Any:
        if not raw:
            return None
        if (self.headers.get("Content-Type") or "").startswith(protobuf.CONTENT_TYPE):
            return protobuf.decode(raw)
        try:
            return json.loads(raw)
        except ValueError:
            ctype = (self.headers.get("Content-Type") or "").split(";")[0]
            if "yaml" in ctype:
                import yaml

                try:
                    return yaml.safe_load(raw)
                except yaml.YAMLError as exc:
                    raise bad_request(f"the body of the request was not valid YAML: {exc}") from exc
            raise bad_request(
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json, application/yaml"
            ) from None

    def _send(
        self, code: int, doc: Any, *, headers: dict[str, str] | None = None, ctype: str = "application/json"
    ) -> None:
        data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.api.faults.sent(len(data))

    def _send_error(self, err: StatusError) -> None:
        self._send(err.code, err.body(), headers=err.headers)

    def _dispatch(self, method: str) -> None:
        split = urlsplit(self.path)
        split = split._replace(path=unquote(split.path))  # Go's URL.Path is decoded: `system%3Adiscovery`
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        raw = self._body()
        try:
            if split.path.startswith("/_kubesim"):
                self._admin(method, split.path, raw)
                return
            if self.api.access is not None:
                self.user = self.api.access.admit(method, split.path, query, self.headers.get("Authorization"))
            self._serve(method, split.path, query, raw)
        except StatusError as err:
            self._send_error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:
            log.exception("kubesim: %s %s failed", method, split.path)
            self._send_error(StatusError(500, "InternalError", f"kubesim: {type(exc).__name__}: {exc}", details={}))

    # ----- admin API --------------------------------------------------------
    def _admin(self, method: str, path: str, raw: bytes) -> None:
        body = self._json_body(raw) or {}
        self._send(200, self.api.route(method, path[len("/_kubesim") :].strip("/"), body))

    # ----- the Kubernetes API -------------------------------------------
    def _serve(self, method: str, path: str, query: dict[str, str], raw: bytes) -> None:
        registry = self.api.registry
        if method == "GET" and path.rstrip("/") in health.HEALTH_PATHS:
            code, text = health.health_answer(path, warming=self.api.warmup.active(), verbose="verbose" in query)
            self._send(code, text, headers={"X-Content-Type-Options": "nosniff"}, ctype="text/plain; charset=utf-8")
            return
        if method == "GET" and path == metrics.PATH:  # sim/kubesim/metrics.py
            self.api.faults.count("metrics", "", bytes_in=len(raw))
            if self.api.warmup.active() and not self._superuser():
                raise metrics.warmup_forbidden(self.user.name if self.user else None)
            self._send(
                200, metrics.exposition(registry.config, started_at=self.api.started_at), ctype=metrics.CONTENT_TYPE
            )
            return
        parts = [x for x in path.split("/") if x]
        if parts[:1] == ["apis"] and len(parts) >= 3 and aggregation.find(self._aggregated(), parts[1], parts[2]):
            # kubesim proxies nothing: an aggregated API answers as one whose server is down,
            # discovery included (kubectl: "unable to retrieve the complete list of server APIs").
            self.api.faults.count("discovery" if len(parts) == 3 else "aggregated", "", bytes_in=len(raw))
            self._send(503, aggregation.UNAVAILABLE_BODY, ctype="text/plain; charset=utf-8")
            return
        if method == "GET":
            doc = self._static(path)
            if doc is not None:
                self.api.faults.count("discovery", "", bytes_in=len(raw))
                # bytes: the protobuf form of /openapi/v2, the only one kubectl reads. kube-openapi labels
                # it octet-stream: the protobuf media type (with its "@") is no valid Content-Type for Go.
                self._send(200, doc, ctype="application/octet-stream" if isinstance(doc, bytes) else "application/json")
                return
        req = Request(method, path, query)
        if self.api.warmup.active() and not self._superuser():  # authorization runs before the lookup
            self.api.faults.count(req.verb, f"{req.resource}.{req.group}" if req.group else req.resource)
            raise health.forbidden(verb=req.verb, group=req.group, resource=req.resource, subresource=req.subresource,
                                   namespace=req.namespace, name=req.name, user=self.user.name if self.user else None)  # fmt: skip
        if not VERSION_RE.match(req.version):
            raise resource_not_found()
        rt = registry.lookup(req.group, req.version, req.resource)
        gr = rt.group_resource
        self.api.faults.count(req.verb, gr, bytes_in=len(raw))
        fault = self.api.faults.pick(
            verb=req.verb, resource=gr, namespace=req.namespace, name=req.name, sub=req.subresource
        )
        if fault is not None and self._inject(fault):
            return
        self._check_verb(rt, req)
        if req.namespace is None and rt.namespaced and req.verb not in ("list", "watch"):
            raise resource_not_found()
        if not rt.namespaced and req.namespace is not None:
            raise resource_not_found()
        self._handle(rt, req, raw)

    def _superuser(self) -> bool:
        """system:masters is allowed before RBAC's caches fill (kube-apiserver's privileged-groups authorizer)."""
        return self.user is not None and SUPERUSER_GROUP in self.user.groups

    def _inject(self, fault: FaultRule) -> bool:
        """Apply a fault; True when it answered (or dropped) the request."""
        if fault.latency:
            time.sleep(fault.latency)
        if fault.drop:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return True
        if fault.code is None:
            return False
        headers = {}
        if fault.retry_after is not None:
            headers["Retry-After"] = str(fault.retry_after)
        if fault.code == 429 and fault.shape == "plain":
            # priority-and-fairness rejects with plain text, not a Status
            self._send(429, b"Too many requests, please try again later.\n", headers=headers, ctype="text/plain")
            return True
        details: dict[str, Any] = {}
        if fault.retry_after is not None:
            details["retryAfterSeconds"] = fault.retry_after
        if fault.causes:
            details["causes"] = fault.causes
        err = StatusError(
            fault.code, fault.reason or reason_for(fault.code), fault.message, details=details, headers=headers
        )
        self._send_error(err)
        return True

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

    def do_HEAD(self) -> None:
        self._dispatch("GET")

    def _check_verb(self, rt: ResourceType, req: Request) -> None:
        if req.subresource:
            if req.subresource not in rt.subresources or req.verb not in ("get", "update", "patch"):
                raise resource_not_found() if req.subresource not in rt.subresources else method_not_allowed()
            return
        verbs = (
            rt.verbs
            if not rt.is_custom
            else ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        )
        if req.verb not in verbs:
            raise method_not_allowed()

    def _manager(self, req: Request) -> str:
        if req.query.get("fieldManager"):
            return req.query["fieldManager"]
        agent = self.headers.get("User-Agent") or "unknown"
        return agent.split("/")[0] or "unknown"

    def _handle(self, rt: ResourceType, req: Request, raw: bytes) -> None:
        registry = self.api.registry
        options = self._json_body(raw) if req.verb in ("delete", "deletecollection") and raw else None
        dry_run = dry_run_requested(req.verb, req.query, options)
        manager = self._manager(req)
        accept = self.headers.get("Accept") or "application/json"
        if req.verb == "get":
            assert req.name is not None
            obj = registry.get(rt, req.version, req.namespace, req.name)
            self._send_object(rt, obj, accept, req)
        elif req.verb == "list":
            self._list(rt, req, accept)
        elif req.verb == "watch":
            self._watch(rt, req, accept)
        elif req.verb == "create":
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
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype not in (
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
                "application/json-patch+json",
            ):
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
            obj = registry.patch(
                rt, req.version, req.namespace, req.name, ctype, self._json_body(raw),
                subresource=req.subresource, manager=manager, dry_run=dry_run,
            )  # fmt: skip
            self._send_object(rt, obj, accept, req)
        elif req.verb == "delete":
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
        elif req.verb == "deletecollection":
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
        else:
            raise method_not_allowed()

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
