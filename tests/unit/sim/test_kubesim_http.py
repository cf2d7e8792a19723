"""kubesim's HTTP plumbing (issue 29): a request head read without the `email` feed
parser must give what the standard library's `http.client.parse_headers` gives, and
an answer sent in one write must be the answer the standard library would send."""

from __future__ import annotations

import http.client
import io
import socket
import ssl
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubesim import tls
from kubesim.admin import Admin
from kubesim.server_http import read_head

HEADS = [
    b"Host: x\r\nAccept: application/json\r\n\r\n",
    b"Host: x\r\nAuthorization:   Bearer abc  \r\nContent-Length: 3\r\n\r\n",
    b"Accept: a\r\naccept: b\r\n\r\n",  # repeated, names as sent
    b"X-Folded: first\r\n  second line\r\n\tthird\r\nHost: y\r\n\r\n",  # obsolete line folding
    b"Host: x\nUser-Agent: bare-newlines\n\n",
    b"Empty:\r\nHost: x\r\n\r\n",
    b"Host: x\r\nnot a header line\r\nAfter: lost\r\n\r\n",  # the head ends at a line without a colon
    b"Host: x\r\n",  # the connection closed before the blank line
    b"\r\n",
]


def stdlib(head: bytes) -> list[tuple[str, str]]:
    return list(http.client.parse_headers(io.BytesIO(head)).items())


def ours(head: bytes) -> list[tuple[str, str]]:
    return list(read_head(io.BytesIO(head), http.client.HTTPMessage).items())


@pytest.mark.parametrize("head", HEADS)
def test_a_head_reads_as_the_standard_library_reads_it(head: bytes) -> None:
    assert ours(head) == stdlib(head)


_NAME = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=":"), min_size=1,
                max_size=12)  # fmt: skip
_VALUE = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=30)


@given(st.lists(st.tuples(_NAME, _VALUE), max_size=20))
def test_any_head_of_header_lines_reads_as_the_standard_library_reads_it(pairs: list[tuple[str, str]]) -> None:
    head = b"".join(f"{name}: {value}\r\n".encode() for name, value in pairs) + b"\r\n"
    assert ours(head) == stdlib(head)


@pytest.mark.parametrize(
    ("head", "error"),
    [
        (b"X: " + b"a" * 70000 + b"\r\n\r\n", http.client.LineTooLong),
        (b"".join(b"X-%d: v\r\n" % i for i in range(100)) + b"\r\n", http.client.HTTPException),
    ],
    ids=["line-too-long", "too-many-headers"],
)
def test_the_standard_librarys_limits_hold(head: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        http.client.parse_headers(io.BytesIO(head))
    with pytest.raises(error):
        read_head(io.BytesIO(head), http.client.HTTPMessage)
    ninety_nine = b"".join(b"X-%d: v\r\n" % i for i in range(99)) + b"\r\n"
    assert ours(ninety_nine) == stdlib(ninety_nine)


@pytest.fixture
def cluster() -> Iterator[object]:
    from kubesim.cluster import Cluster

    with Cluster() as running:
        yield running


def raw_exchange(port: int, request: bytes) -> bytes:
    """`request` sent as is on a new TLS connection; everything answered until the server closes."""
    context = tls.client_context()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
    ):
        conn.sendall(request)
        chunks = []
        while True:
            try:
                chunk = conn.recv(65536)
            except (ssl.SSLError, ConnectionResetError):
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def test_answers_keep_their_shape_one_write_each(cluster: object) -> None:
    """Two requests on one kept-alive connection, a HEAD, and the standard library's own error
    pages: each answer is its status line, its headers, a blank line and exactly its body."""
    from kubesim.cluster import Cluster

    assert isinstance(cluster, Cluster)
    conn = tls.connection(cluster.server.url)
    try:
        for _ in range(2):
            conn.request("GET", "/version")
            resp = conn.getresponse()
            body = resp.read()
            assert resp.status == 200 and int(resp.headers["Content-Length"]) == len(body) > 0
            assert resp.headers["Content-Type"] == "application/json" and resp.headers["Date"].endswith(" GMT")
            assert resp.headers["Server"].startswith("kubesim ")
        conn.request("HEAD", "/version")
        head = conn.getresponse()
        assert head.status == 200 and head.read() == b"" and int(head.headers["Content-Length"]) > 0
    finally:
        conn.close()
    too_many = raw_exchange(cluster.server.port, b"GET /version HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n")
    assert too_many.startswith(b"HTTP/1.1 431 Too many headers\r\n"), too_many[:100]
    # A request line the version of which cannot be read is answered as HTTP/0.9 (no status
    # line), as the standard library answers it.
    for version, code in ((b"HTTP/x.y", b"400"), (b"HTTP/2.0", b"505")):
        page = raw_exchange(cluster.server.port, b"GET /version " + version + b"\r\n\r\n")
        assert page.startswith(b"<!DOCTYPE HTML>") and b"Error code: " + code in page, page[:300]


def test_the_admin_client_keeps_its_connection_and_follows_a_restart(cluster: object) -> None:
    """One connection for every call; a call after the server dropped it (a restart) is sent again."""
    from kubesim.cluster import Cluster

    assert isinstance(cluster, Cluster)
    accepted: list[object] = []
    server = cluster.server
    original = server.httpd.process_request

    def counting(request: object, client_address: object) -> None:
        accepted.append(client_address)
        original(request, client_address)  # type: ignore[arg-type]

    server.httpd.process_request = counting  # type: ignore[method-assign]
    admin = Admin(server.url)
    try:
        for _ in range(5):
            assert admin.config()["storageVersions"]["configmaps"] == "v1"
        assert len(accepted) == 1
        restarted = cluster.restart_server(0)
        assert restarted.port == server.port
        assert admin.set_storage_version("configmaps", "v1")["storageVersions"]["configmaps"] == "v1"
    finally:
        admin.close()
