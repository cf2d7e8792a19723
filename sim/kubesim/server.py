"""The HTTP front of one simulated API server: routing, content negotiation,
faults, counters, and the admin API under `/_kubesim/`.

It speaks enough of the Kubernetes REST API that the official Python client and
kubectl work against it unchanged (DESIGN 6): discovery, OpenAPI documents for
kubectl's validation, GET/LIST/WATCH, POST, PUT, PATCH (merge, JSON,
strategic), DELETE, the status subresource, metadata-only answers
(`as=PartialObjectMetadata[List]`) and server-side tables (`as=Table`, with a
CRD's printer columns), and `/metrics` (sim/kubesim/metrics.py).

The handler is composed by verb family: the HTTP plumbing (server_http.py),
the read verbs (server_reads.py), the write verbs (server_writes.py) and the
non-resource paths (server_discovery.py); here, the server's lifecycle and the
routing of a request to the admin API (admin_ops.py) or to a resource's verb.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from kubesim import admission_policies, aggregation, encryption, health, leases, storageversions, tls_serving
from kubesim.access import AccessConfig, AccessControl
from kubesim.admin_ops import AdminOperations
from kubesim.errors import StatusError, method_not_allowed, resource_not_found
from kubesim.faults import FaultRule, Faults, reason_for
from kubesim.registry import Registry
from kubesim.resources import ResourceType
from kubesim.routing import VERSION_RE, Request
from kubesim.server_discovery import DiscoveryServing
from kubesim.server_http import Listener
from kubesim.server_writes import WriteVerbs
from kubesim.svm_controller import SvmController
from kubesim.tls import Authority

log = logging.getLogger("kubesim")


class ApiServer(AdminOperations):
    """One simulated kube-apiserver: a registry, faults and an HTTP listener."""

    #: Its identity lease and garbage collectors, while started (sim/kubesim/leases.py).
    identity: leases.IdentityLease | None = None
    #: The cluster's kube-controller-manager storage version migrator (sim/kubesim/svm_controller.py),
    #: driven through this server's admin API; None for a server outside a Cluster.
    svm_controller: SvmController | None = None

    def __init__(
        self,
        registry: Registry,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        authz_warmup_seconds: float = 0.0,
        access: AccessConfig | None = None,
        tls: Authority | None = None,
    ) -> None:
        """`tls`: serve HTTPS with this authority's serving certificate (and take its CA as the
        client CA); None: plain HTTP."""
        self.registry = registry
        self.tls = tls
        self.tls_context = tls_serving.server_context(tls) if tls is not None else None
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
        self.httpd = Listener((host, port), handler)
        self.host, self.port = str(self.httpd.server_address[0]), int(self.httpd.server_address[1])
        self._thread: threading.Thread | None = None
        self.stopping = threading.Event()
        #: Polls the --encryption-provider-config file while started, with automatic reload on.
        self.encryption_reloader: encryption.Reloader | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls is not None else 'http'}://{self.host}:{self.port}"

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
                client_ca = self.tls.ca_cert if self.tls is not None else None
                self.access = AccessControl(self.access_config, self.registry, client_ca=client_ca)
                self.access.start()
        except (encryption.ConfigError, ValueError):
            self.httpd.server_close()
            raise
        self.identity = leases.IdentityLease(
            self.registry.etcd.url, self.registry.config, lease_seconds=identity_lease_seconds
        ).start()
        storageversions.publish(self.registry)
        self._start_encryption_reload()
        # The loop looks for a stop every 50 ms: stop() (every test cluster's, every restart) waits
        # for it, half a second with serve_forever's default (issue 29).
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"kubesim-{self.port}", daemon=True)  # fmt: skip
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


class Handler(WriteVerbs, DiscoveryServing):
    """Routes each request: the admin API, a non-resource path, or a resource's verb."""

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

    def do_HEAD(self) -> None:
        self._dispatch("GET")

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
                self.user = self.api.access.admit(
                    method, split.path, query, self.headers.get("Authorization"), self.peer_certificates()
                )
            admission_policies.request_context.set(admission_policies.RequestContext(user=self.user))
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
        if self._serve_non_resource(method, path, query, raw):
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

    def _inject(self, fault: FaultRule) -> bool:
        """Apply a fault; True when it answered (or dropped) the request."""
        if fault.latency:
            time.sleep(fault.latency)
        if fault.drop:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.request.shutdown(socket.SHUT_RDWR)
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

    def _handle(self, rt: ResourceType, req: Request, raw: bytes) -> None:
        accept = self.headers.get("Accept") or "application/json"
        if req.verb in ("get", "list", "watch"):
            self._serve_read(rt, req, accept)
        else:
            self._serve_write(rt, req, raw, accept)
