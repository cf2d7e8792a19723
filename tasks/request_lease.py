"""A run's request Lease in its process: taken by the flow, asked by each chunk (issue 37).

Design decision: the Lease (`storage_migrator/migration/request_lease.py`) is the request's
lock and the run's place among the cluster's writers; nothing of it is Prefect's, and nothing
of it waits on Prefect. The flow holds it around the run (`held_request`) and enters the write
budget around its chunks (`write_share`: the one seam an engine that is not bound by our budget
leaves out); each chunk task finds it here by the request's uid (task arguments stay plain
values) and paces through it (`chunk_pacer`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from uuid import uuid4

from storage_migrator.migration.pacing import Pacer
from storage_migrator.migration.request_lease import LeasePacer, RequestLease
from storage_migrator.settings import Settings
from tasks.common import api_client

__all__ = ["WriteShare", "chunk_pacer", "held_request", "holder_identity", "write_share"]

_HELD: dict[str, RequestLease] = {}
_HELD_LOCK = threading.Lock()


def holder_identity(flow_run: str | None) -> str:
    """`<flow run id>/<8 hex>`: the run, and this process of it (two processes of one flow run, a
    run started twice by a worker, must never pass for one holder)."""
    return f"{flow_run or uuid4()}/{uuid4().hex[:8]}"


@contextmanager
def held_request(settings: Settings, *, name: str, uid: str, flow_run: str | None) -> Iterator[RequestLease]:
    """The request's Lease held while the body runs, deleted after (`RequestHeld` if another run holds
    it: nothing is written; `InstallNamespaceMissing` without the install's namespace)."""
    lease = RequestLease.take(lambda: api_client(settings), namespace=settings.namespace, request=name,
                              holder=holder_identity(flow_run))  # fmt: skip
    with _HELD_LOCK:
        _HELD[uid] = lease
    try:
        yield lease
    finally:
        with _HELD_LOCK:
            _HELD.pop(uid, None)
        lease.release()


class WriteShare:
    """The run's place among the cluster's writers: `join` before its writes, `leave` after its last."""

    def __init__(self, settings: Settings, lease: RequestLease) -> None:
        self._rate = settings.write_rate_per_second
        self._shared = settings.shared_write_budget
        self._lease = lease

    def join(self) -> None:
        if self._shared:
            self._lease.join(self._rate)

    def leave(self) -> None:
        if self._shared:
            self._lease.leave()


@contextmanager
def write_share(settings: Settings, lease: RequestLease) -> Iterator[WriteShare]:
    """Inside, the run counts among the writers (its Lease carries its rate) and paces at its share;
    with `shared_write_budget` false it paces alone at its rate. Left at the end (or at `leave`)."""
    share = WriteShare(settings, lease)
    share.join()
    try:
        yield share
    finally:
        share.leave()


def chunk_pacer(settings: Settings, uid: str) -> Pacer:
    """The pacer of the run's next chunk, checked first: a run that lost its request raises here
    (`MigrationCancelled`, TakenOver) before the chunk writes anything."""
    with _HELD_LOCK:
        lease = _HELD.get(uid)
    if lease is None:
        raise RuntimeError(f"no request Lease held for request uid {uid} in this process: a chunk runs inside "
                           "the flow's held_request")  # fmt: skip
    pacer: LeasePacer = lease.pacer(local_rate=None if settings.shared_write_budget else settings.write_rate_per_second)
    pacer.check()
    return pacer
