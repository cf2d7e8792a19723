"""The TLS side of one accepted connection: handshake, and the byte streams the
HTTP handler reads and writes.

Design decision: pyOpenSSL rather than the standard `ssl` module, because
kube-apiserver *requests* a client certificate without letting TLS judge it
(Go's `tls.RequestClientCert`): a certificate from an unknown CA still
completes the handshake, and the x509 authenticator then refuses it with 401
(or another authenticator, a bearer token, admits the request). The standard
module can only ask for a certificate that OpenSSL verifies, which turns an
unknown CA into a handshake alert. Here every certificate is accepted at the
TLS level and `kubesim.authn.CertificateAuthenticator` judges it.
"""

from __future__ import annotations

import contextlib
import io
import socket
from typing import Any

from cryptography import x509
from OpenSSL import SSL

from kubesim.tls import Authority

__all__ = ["TLSStreams", "server_context"]


def _accept_any(*_: Any) -> bool:
    return True  # judged by the authenticator, as kube-apiserver's RequestClientCert


def server_context(authority: Authority) -> SSL.Context:
    """TLS 1.2+ with the authority's serving certificate; asks for (never requires) a client certificate."""
    ctx = SSL.Context(SSL.TLS_SERVER_METHOD)
    ctx.set_min_proto_version(SSL.TLS1_2_VERSION)
    ctx.use_certificate(authority.serving_cert)
    ctx.use_privatekey(authority.serving_key)
    ctx.set_verify(SSL.VERIFY_PEER, _accept_any)
    ctx.set_session_id(b"kubesim")
    return ctx


class _Reader(io.RawIOBase):
    """Decrypted bytes of the connection; EOF when the peer closes (cleanly or not)."""

    def __init__(self, conn: SSL.Connection) -> None:
        self._conn = conn

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            return int(self._conn.recv_into(buffer))
        except SSL.ZeroReturnError:
            return 0
        except SSL.SysCallError as exc:
            if exc.args and exc.args[0] == -1:  # unexpected EOF
                return 0
            raise ConnectionResetError(str(exc)) from exc
        except SSL.Error as exc:
            raise ConnectionResetError(str(exc)) from exc


class _Writer(io.BufferedIOBase):
    """Unbuffered writes, each one sent whole (as socketserver's _SocketWriter)."""

    def __init__(self, conn: SSL.Connection) -> None:
        self._conn = conn

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        try:
            self._conn.sendall(view)
        except SSL.Error as exc:
            raise BrokenPipeError(str(exc)) from exc
        return len(view)


class TLSStreams:
    """One accepted socket after a server-side handshake: `rfile`, `wfile` and the peer's certificate."""

    def __init__(self, sock: socket.socket, context: SSL.Context) -> None:
        self._conn = SSL.Connection(context, sock)
        self._conn.set_accept_state()
        self._conn.do_handshake()  # raises SSL.Error: not TLS, or no common ground
        self.rfile = io.BufferedReader(_Reader(self._conn), 65536)
        self.wfile = _Writer(self._conn)
        self._chain: list[x509.Certificate] | None = None

    def peer_certificates(self) -> list[x509.Certificate]:
        """The certificates the client presented, its own first ([] for none); read once per connection.

        Its own is the one whose key it proved in the handshake (SSL_get_peer_certificate): on
        the server side OpenSSL's chain leaves it out and may hold what the client added (its CA)."""
        if self._chain is None:
            leaf = self._conn.get_peer_certificate(as_cryptography=True)
            rest = self._conn.get_peer_cert_chain(as_cryptography=True) or []
            self._chain = [leaf, *(c for c in rest if c != leaf)] if leaf is not None else []
        return self._chain

    def close(self) -> None:
        """Send close_notify when the peer still listens; never raises."""
        with contextlib.suppress(SSL.Error, OSError):
            self._conn.shutdown()
