"""The HTTP plumbing every handler of kubesim's API shares: connections a stop
can drop, request bodies (JSON, YAML, protobuf), and answers.

Apart from the verbs (server_reads.py, server_writes.py, server_discovery.py)
so that each builds on the same sending and body decoding; `kubesim.server`
composes them into the handler it serves with.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import socket
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from cryptography import x509
from OpenSSL import SSL

from kubesim import protobuf
from kubesim.authn import SUPERUSER_GROUP, UserInfo
from kubesim.errors import StatusError, bad_request
from kubesim.tls_serving import TLSStreams

if TYPE_CHECKING:
    from kubesim.server import ApiServer

log = logging.getLogger("kubesim")


class HandlerBase(BaseHTTPRequestHandler):
    """One connection's requests, to one `ApiServer` (`api`, bound by the server)."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, the client's
    # delayed ACK costs 40 ms per request.
    disable_nagle_algorithm = True
    api: ApiServer
    server_version = "kubesim"
    #: Who sent the request being served (None: authentication is off).
    user: UserInfo | None = None
    #: The connection's TLS session (None: plain HTTP, or a failed handshake).
    tls: TLSStreams | None = None

    def setup(self) -> None:
        if self.api.tls_context is None:
            super().setup()
        else:
            self._setup_tls(self.api.tls_context)
        with self.api.connections_lock:
            self.api.connections.add(self.request)

    def _setup_tls(self, context: SSL.Context) -> None:
        """Handshake first; a client that does not speak TLS gets the connection closed."""
        self.connection = self.request
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        try:
            self.tls = TLSStreams(self.request, context)
        except (SSL.Error, OSError) as exc:
            log.debug("kubesim: TLS handshake from %s failed: %s", self.client_address, exc)
            self.rfile, self.wfile = io.BytesIO(), io.BytesIO()  # handle() reads EOF and returns
            return
        self.rfile, self.wfile = self.tls.rfile, self.tls.wfile

    def finish(self) -> None:
        with self.api.connections_lock:
            self.api.connections.discard(self.request)
        with contextlib.suppress(OSError):
            super().finish()
        if self.tls is not None:
            self.tls.close()

    def peer_certificates(self) -> list[x509.Certificate]:
        """The client certificate of this connection, with its chain ([] for none, or plain HTTP)."""
        return self.tls.peer_certificates() if self.tls is not None else []

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

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

    def _superuser(self) -> bool:
        """system:masters is allowed before RBAC's caches fill (kube-apiserver's privileged-groups authorizer)."""
        return self.user is not None and SUPERUSER_GROUP in self.user.groups
