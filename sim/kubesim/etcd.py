"""A real etcd for kubesim: the process we start, and the few KV calls we make.

kube-apiserver keeps objects in etcd and uses etcd's revisions as
resourceVersions; kubesim does the same so that tests can judge a migration by
reading etcd (DESIGN 6). We talk to etcd through the raw gRPC stubs of
`etcd-sdk-python` (import `pyetcd`) because we need range `limit`, `count`,
reads at a past revision (continue tokens) and compare-and-swap on
`mod_revision`, exactly the calls kube-apiserver's etcd3 store makes.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import urlparse

import grpc
import pyetcd
from pyetcd import etcdrpc
from pyetcd.events import DeleteEvent
from pyetcd.exceptions import RevisionCompactedError

ETCD_BINARY = "etcd"


class Compacted(Exception):
    """A read asked for a revision that etcd has compacted away."""


class EtcdUnavailable(Exception):
    """etcd did not answer."""


def _die_with_parent(args: list[str]) -> list[str]:
    """Linux: etcd gets SIGTERM when the process that started it dies, even by SIGKILL.

    Tests kill migrator and kubesim processes on purpose; their etcd must not outlive them.
    util-linux's `setpriv` (Essential in Debian) sets PR_SET_PDEATHSIG and execs etcd: no
    Python runs between fork and exec. A `preexec_fn` did, and made the child run gRPC's
    fork handlers, whose poller then lost its fd to `close_fds` and killed the child before
    etcd started ("epoll_wait error: Bad file descriptor"; seen once in a CI run).
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", *args] if setpriv else args


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prefix_end(prefix: bytes) -> bytes:
    """The exclusive end of the key range that starts with `prefix`."""
    ba = bytearray(prefix)
    for i in range(len(ba) - 1, -1, -1):
        if ba[i] < 0xFF:
            ba[i] += 1
            return bytes(ba[: i + 1])
    return b"\0"


class EtcdProcess:
    """An etcd server on free loopback ports with a throw-away data dir.

    Debian's etcd 3.4 has no `--unsafe-no-fsync`; a data dir on /dev/shm keeps
    fsync cheap (DESIGN 6).
    """

    def __init__(self, *, binary: str | None = None, extra_args: Sequence[str] = ()) -> None:
        """`extra_args`: more etcd flags, e.g. `--quota-backend-bytes` for the 10^6-object benchmark."""
        self.binary = binary or shutil.which(ETCD_BINARY) or "/usr/bin/etcd"
        self.extra_args = list(extra_args)
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.data_dir = tempfile.mkdtemp(prefix="kubesim-etcd-", dir=base)
        self.client_port = free_port()
        self.peer_port = free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path = os.path.join(self.data_dir, "etcd.log")

    @property
    def pid(self) -> int | None:
        """The etcd process's id while it runs (None: not started, or stopped)."""
        return None if self._proc is None else self._proc.pid

    def start(self, *, timeout: float = 30.0) -> EtcdProcess:
        if not os.path.exists(self.binary):
            raise RuntimeError(
                f"etcd not found at {self.binary}: install Debian's etcd-server "
                "(apt-get install -y etcd-server), or pass --etcd URL"
            )
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [
            self.binary,
            "--name", "kubesim",
            "--data-dir", os.path.join(self.data_dir, "data"),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"kubesim={peer}",
            "--log-level", "error",
            "--logger", "zap",
            # One member, so it leads once it has campaigned: half a second (of a second and
            # more with the defaults, 100 ms and 1 s) before the first read is answered (issue 29).
            "--heartbeat-interval", "50",
            "--election-timeout", "500",
            *self.extra_args,
        ]  # fmt: skip
        log = open(self._log_path, "wb")  # noqa: SIM115 - owned by the child
        self._proc = subprocess.Popen(_die_with_parent(args), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                with open(self._log_path, "rb") as fh:
                    tail = fh.read()[-2000:].decode(errors="replace")
                raise RuntimeError(f"etcd exited at start-up: {tail}")
            if self._answers():
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not answer on {self.url} in {timeout}s")
            time.sleep(0.02)

    def _answers(self) -> bool:
        """Whether etcd serves a read. Asked on a new gRPC channel once its port accepts: a
        channel whose first connection was refused waits out gRPC's reconnect backoff (a
        second) however soon etcd listens (issue 29: etcd listens within 20 ms of its start)."""
        try:
            socket.create_connection(("127.0.0.1", self.client_port), timeout=1.0).close()
        except OSError:
            return False
        store = EtcdStore(self.url)
        try:
            store.revision()
            return True
        except EtcdUnavailable:
            return False
        finally:
            store.close()

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EtcdProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class KV:
    key: bytes
    value: bytes
    mod_revision: int
    create_revision: int


@dataclass(frozen=True)
class RangeResult:
    kvs: list[KV]
    revision: int
    more: bool
    count: int


@dataclass(frozen=True)
class WatchEvent:
    type: str  # "PUT" or "DELETE"
    kv: KV
    prev: KV | None


def _kv(raw: object) -> KV:
    return KV(
        key=raw.key,  # type: ignore[attr-defined]
        value=raw.value,  # type: ignore[attr-defined]
        mod_revision=raw.mod_revision,  # type: ignore[attr-defined]
        create_revision=raw.create_revision,  # type: ignore[attr-defined]
    )


class EtcdStore:
    """The KV calls kubesim makes; every write is a compare-and-swap."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        parsed = urlparse(url)
        self.url = url
        self._client = pyetcd.client(host=parsed.hostname or "127.0.0.1", port=parsed.port or 2379, timeout=timeout)
        self._timeout = timeout
        self.writes = 0
        self._writes_lock = threading.Lock()

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a dead channel is fine
            self._client.close()

    def _call(self, fn: Callable[..., object], request: object) -> object:
        try:
            return fn(request, self._timeout)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            if code == grpc.StatusCode.OUT_OF_RANGE or "compacted" in (details or ""):
                raise Compacted(details) from exc
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise EtcdUnavailable(details) from exc
            raise

    def _count_write(self, n: int = 1) -> None:
        with self._writes_lock:
            self.writes += n

    def revision(self) -> int:
        resp = self._call(self._client.kvstub.Range, etcdrpc.RangeRequest(key=b"\0", count_only=True))
        return int(resp.header.revision)  # type: ignore[attr-defined]

    def get(self, key: bytes, *, revision: int = 0) -> tuple[KV | None, int]:
        resp = self._call(self._client.kvstub.Range, etcdrpc.RangeRequest(key=key, revision=revision))
        kvs = resp.kvs  # type: ignore[attr-defined]
        return (_kv(kvs[0]) if kvs else None), int(resp.header.revision)  # type: ignore[attr-defined]

    def range(
        self, start: bytes, end: bytes, *, limit: int = 0, revision: int = 0, keys_only: bool = False
    ) -> RangeResult:
        req = etcdrpc.RangeRequest(key=start, range_end=end, limit=limit, revision=revision, keys_only=keys_only)
        resp = self._call(self._client.kvstub.Range, req)
        return RangeResult(
            kvs=[_kv(k) for k in resp.kvs],  # type: ignore[attr-defined]
            revision=int(resp.header.revision),  # type: ignore[attr-defined]
            more=bool(resp.more),  # type: ignore[attr-defined]
            count=int(resp.count),  # type: ignore[attr-defined]
        )

    def _txn(self, compare: object, success: list[object], failure: list[object]) -> object:
        req = etcdrpc.TxnRequest(compare=[compare], success=success, failure=failure)
        return self._call(self._client.kvstub.Txn, req)

    def create(self, key: bytes, value: bytes) -> int | None:
        """Put `key` only if absent; returns the new revision, or None if it exists."""
        cmp = etcdrpc.Compare(key=key, result=etcdrpc.Compare.EQUAL, target=etcdrpc.Compare.CREATE, create_revision=0)
        put = etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=value))
        resp = self._txn(cmp, [put], [])
        if not resp.succeeded:  # type: ignore[attr-defined]
            return None
        self._count_write()
        return int(resp.header.revision)  # type: ignore[attr-defined]

    def update(self, key: bytes, value: bytes, *, mod_revision: int) -> int | None:
        """Put `key` only if it is still at `mod_revision`; None on a lost race."""
        cmp = etcdrpc.Compare(
            key=key, result=etcdrpc.Compare.EQUAL, target=etcdrpc.Compare.MOD, mod_revision=mod_revision
        )
        put = etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=value))
        resp = self._txn(cmp, [put], [])
        if not resp.succeeded:  # type: ignore[attr-defined]
            return None
        self._count_write()
        return int(resp.header.revision)  # type: ignore[attr-defined]

    def delete(self, key: bytes, *, mod_revision: int) -> int | None:
        cmp = etcdrpc.Compare(
            key=key, result=etcdrpc.Compare.EQUAL, target=etcdrpc.Compare.MOD, mod_revision=mod_revision
        )
        op = etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(key=key))
        resp = self._txn(cmp, [op], [])
        if not resp.succeeded:  # type: ignore[attr-defined]
            return None
        self._count_write()
        return int(resp.header.revision)  # type: ignore[attr-defined]

    def put(self, key: bytes, value: bytes) -> int:
        """An unconditional put: only for seeding and admin controls."""
        resp = self._call(self._client.kvstub.Put, etcdrpc.PutRequest(key=key, value=value))
        self._count_write()
        return int(resp.header.revision)  # type: ignore[attr-defined]

    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> int:
        """Unconditional puts in one transaction: only for seeding benchmarks in bulk
        (etcd refuses more than `--max-txn-ops` operations, 128 by default)."""
        ops = [etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=k, value=v)) for k, v in items]
        resp = self._call(self._client.kvstub.Txn, etcdrpc.TxnRequest(success=ops))
        self._count_write(len(items))
        return int(resp.header.revision)  # type: ignore[attr-defined]

    def compact(self, revision: int | None = None) -> int:
        rev = revision or self.revision()
        self._call(self._client.kvstub.Compact, etcdrpc.CompactionRequest(revision=rev, physical=True))
        return rev

    def watch(
        self, prefix: bytes, *, start_revision: int
    ) -> tuple[Iterator[list[WatchEvent] | Exception], Callable[[], None]]:
        """Events under `prefix` from `start_revision` on; Compacted if too old."""
        responses: queue.Queue[object] = queue.Queue()
        watch_id = self._client.add_watch_callback(
            prefix,
            responses.put,
            range_end=prefix_end(prefix),
            start_revision=start_revision,
            prev_kv=True,
        )
        stopped = threading.Event()

        def cancel() -> None:
            if not stopped.is_set():
                stopped.set()
                responses.put(None)
                with contextlib.suppress(Exception):  # the channel may be gone
                    self._client.cancel_watch(watch_id)

        def events() -> Iterator[list[WatchEvent] | Exception]:
            while not stopped.is_set():
                try:
                    resp = responses.get(timeout=0.5)
                except queue.Empty:
                    yield []
                    continue
                if resp is None:
                    return
                if isinstance(resp, RevisionCompactedError):
                    yield Compacted(f"required revision {start_revision} has been compacted")
                    return
                if isinstance(resp, Exception):
                    yield resp
                    return
                batch = []
                for ev in resp.events:  # type: ignore[attr-defined]
                    # pyetcd wraps raw events; the raw one is in `_event`.
                    raw = getattr(ev, "_event", ev)
                    kind = "DELETE" if isinstance(ev, DeleteEvent) else "PUT"
                    prev = _kv(raw.prev_kv) if raw.HasField("prev_kv") else None
                    batch.append(WatchEvent(type=kind, kv=_kv(raw.kv), prev=prev))
                yield batch

        return events(), cancel
