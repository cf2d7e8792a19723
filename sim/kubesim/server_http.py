"""The HTTP plumbing every handler of kubesim's API shares: connections a stop
can drop, request heads and bodies (JSON, YAML, protobuf), and answers.

Apart from the verbs (server_reads.py, server_writes.py, server_discovery.py)
so that each builds on the same sending and body decoding; `kubesim.server`
composes them into the handler it serves with.

Issue 29 (kubesim cheaper per request over TLS): the standard library's handler
parses a request's headers with the `email` package's feed parser (a sixth of
kubesim's CPU for a GET, py-spy --gil) and sends an answer's head and body in
two writes, two TLS records. Here the head is parsed line by line into the same
`http.client.HTTPMessage`, with the standard library's limits and answers, and
an answer goes out in one write; the Date header is formatted once a second.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import logging
import socket
import sys
import time
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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

#: http.client's limits on a request head: a line's length, and the number of header lines.
_MAXLINE = 65536
_MAXHEADERS = 100
_END_OF_HEAD = (b"\r\n", b"\n", b"")


def read_head(rfile: io.BufferedIOBase, message_class: type[http.client.HTTPMessage]) -> http.client.HTTPMessage:
    """The header lines up to the blank one, as `http.client.parse_headers` reads them
    (its limits and errors, names and values as its compat32 policy keeps them: the
    value stripped of leading blanks and the line end, folded lines joined), without
    the `email` feed parser."""
    lines: list[bytes] = []
    while True:
        line = rfile.readline(_MAXLINE + 1)
        if len(line) > _MAXLINE:
            raise http.client.LineTooLong("header line")
        if line in _END_OF_HEAD:
            break
        lines.append(line)
        if len(lines) >= _MAXHEADERS:
            raise http.client.HTTPException(f"got more than {_MAXHEADERS} headers")
    message = message_class()
    name: str | None = None
    value = ""
    for raw in lines:
        text = raw.decode("iso-8859-1")
        if text[:1] in (" ", "\t") and name is not None:  # an obsolete folded line continues the value
            value += text
            continue
        if name is not None:
            message[name] = value.rstrip("\r\n")
        name, colon, rest = text.partition(":")
        if not colon:  # not a header line: the email parser ends the head here too
            name = None
            break
        value = rest.lstrip(" \t")
    if name is not None:
        message[name] = value.rstrip("\r\n")
    return message


_date_cache: tuple[int, str] = (0, "")


def http_date() -> str:
    """The Date header's value (RFC 7231 IMF-fixdate), formatted once a second."""
    global _date_cache
    now = int(time.time())
    second, text = _date_cache
    if second != now:
        text = formatdate(now, usegmt=True)
        _date_cache = (now, text)
    return text


class Listener(ThreadingHTTPServer):
    """The listening socket: a daemon thread per connection (a stop drops them)."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that resets its connection (one that closes it with an answer unread, or a
        dropped-connection fault) is not an error of the server: no traceback on stderr."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            log.debug("kubesim: connection from %s reset", client_address)
            return
        super().handle_error(request, client_address)


class HandlerBase(BaseHTTPRequestHandler):
    """One connection's requests, to one `ApiServer` (`api`, bound by the server)."""

    protocol_version = "HTTP/1.1"
    # A watch's chunks and the standard library's error pages still go out in
    # several writes; with Nagle on, the client's delayed ACK costs 40 ms each.
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
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s " + format, self.address_string(), *args)

    def date_time_string(self, timestamp: float | None = None) -> str:
        return http_date() if timestamp is None else super().date_time_string(timestamp)

    def parse_request(self) -> bool:
        """The standard library's `parse_request` (request line, HTTP version, Connection and
        Expect headers, and its error answers), with the head read by `read_head`."""
        self.command = None  # type: ignore[assignment]  # set in case of an error on the first line
        self.request_version = version = self.default_request_version
        self.close_connection = True
        requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")  # type: ignore[attr-defined]
        self.requestline = requestline
        words = requestline.split()
        if not words:
            return False
        if len(words) >= 3:  # enough to determine the protocol version
            version = words[-1]
            try:
                if not version.startswith("HTTP/"):
                    raise ValueError
                base_version_number = version.split("/", 1)[1]
                numbers = base_version_number.split(".")
                if len(numbers) != 2 or not all(n.isdigit() and len(n) <= 10 for n in numbers):
                    raise ValueError
                version_number = int(numbers[0]), int(numbers[1])
            except (ValueError, IndexError):
                self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request version ({version!r})")
                return False
            if version_number >= (1, 1) and self.protocol_version >= "HTTP/1.1":
                self.close_connection = False
            if version_number >= (2, 0):
                self.send_error(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"Invalid HTTP version ({base_version_number})")
                return False
            self.request_version = version
        if not 2 <= len(words) <= 3:
            self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request syntax ({requestline!r})")
            return False
        command, path = words[:2]
        if len(words) == 2:
            self.close_connection = True
            if command != "GET":
                self.send_error(HTTPStatus.BAD_REQUEST, f"Bad HTTP/0.9 request type ({command!r})")
                return False
        self.command, self.path = command, path
        if self.path.startswith("//"):  # gh-87389: never an absolute URI without a scheme
            self.path = "/" + self.path.lstrip("/")
        try:
            self.headers = read_head(self.rfile, self.MessageClass)
        except http.client.LineTooLong as err:
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long", str(err))
            return False
        except http.client.HTTPException as err:
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers", str(err))
            return False
        conntype = self.headers.get("Connection", "").lower()
        if conntype == "close":
            self.close_connection = True
        elif conntype == "keep-alive" and self.protocol_version >= "HTTP/1.1":
            self.close_connection = False
        expect = self.headers.get("Expect", "").lower()
        if expect == "100-continue" and self.protocol_version >= "HTTP/1.1" and self.request_version >= "HTTP/1.1":
            return self.handle_expect_100()
        return True

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
        """The answer, head and body in one write: one TLS record, one system call (issue 29)."""
        data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        # What end_headers() would flush (nothing for HTTP/0.9), then the body.
        head: list[bytes] = getattr(self, "_headers_buffer", [])
        self._headers_buffer: list[bytes] = []
        if self.request_version != "HTTP/0.9":
            head.append(b"\r\n")
        self.wfile.write(b"".join([*head, b"" if self.command == "HEAD" else data]))
        self.api.faults.sent(len(data))

    def _send_error(self, err: StatusError) -> None:
        self._send(err.code, err.body(), headers=err.headers)

    def _superuser(self) -> bool:
        """system:masters is allowed before RBAC's caches fill (kube-apiserver's privileged-groups authorizer)."""
        return self.user is not None and SUPERUSER_GROUP in self.user.groups
