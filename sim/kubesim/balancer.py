"""A TCP load balancer in front of kubesim's API servers: one connection, one server, in turn.

Clusters put their API servers behind one address (HAProxy, a cloud load balancer,
kube-proxy's `kubernetes` Service), which spreads *connections*, not requests: a
client that keeps its connection alive talks to one server until it reconnects.
kubesim's servers each have their own port; this stands for that one address,
so that a client's behaviour behind a balancer (issue 19: sampling /metrics until
every server has answered) can be tested. Bytes are copied as they are, both ways:
TLS passes through (as a layer-4 balancer does), so the client verifies the
server's certificate, which names 127.0.0.1 as the balancer's address does.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from collections.abc import Sequence

__all__ = ["RoundRobinBalancer"]


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy until either side ends, then end both directions."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _relay(client: socket.socket, upstream: socket.socket) -> None:
    """One connection both ways; both sockets closed once it is over."""
    back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    back.start()
    _pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


class RoundRobinBalancer:
    """Listens on 127.0.0.1; each accepted connection goes to the next of `targets` ((host, port))."""

    def __init__(self, targets: Sequence[tuple[str, int]], *, scheme: str = "https") -> None:
        """`scheme`: what the targets speak (kubesim serves https unless started with plain HTTP)."""
        self.scheme = scheme
        self._targets = itertools.cycle(list(targets))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"kubesim-balancer-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self) -> RoundRobinBalancer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._listener.close()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(next(self._targets))
            except OSError:
                client.close()
                continue
            threading.Thread(target=_relay, args=(client, upstream), daemon=True).start()

    def __enter__(self) -> RoundRobinBalancer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
