"""The next LIST page, asked for while the current page is being written.

Design decision (issue 13, known problem 3; DESIGN 4.5): the next page's
continue token is known as soon as a LIST returns, so its LIST need not wait
for the current page's writes, the checkpoint and the seed-001 agreement check.
`PageAhead` starts it on a thread of its own and hands it to the next chunk if
that chunk starts from the same token. Nothing else changes: the next chunk
writes nothing before it starts (so after the checkpoint), and the checkpoint
still records a token only once every object before it has settled, so a crash
re-does at most one chunk. A page asked for ahead is the same page: every page
of a chunked LIST is served from the snapshot of the first one.

Only metadata-only pages are asked for ahead: a full page (PUT mode) holds whole
objects, which are kept no longer than their own chunk (DESIGN 8). A failed LIST
ahead is forgotten: the chunk LISTs again itself, with its retries and verdicts.
The LIST ahead uses a client of its own (``connect``) when given one: the chunk's
client is closed when its task ends, which may be before the page arrives.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

from kubernetes.client import ApiClient

from storage_migrator.kube.listing import ListPage

__all__ = ["PageAhead"]

#: A page asked for ahead and the LISTs it took (the 410 re-LISTs counted by the chunk).
Listed = tuple[ListPage, int]


class PageAhead:
    """At most one page asked for ahead, for one migration; thread-safe."""

    def __init__(self, connect: Callable[[], ApiClient] | None = None) -> None:
        #: A client for the LIST ahead, closed after it; None: the caller's own.
        self.connect = connect
        self._lock = threading.Lock()
        self._token: str | None = None
        self._future: Future[Listed] | None = None

    def start(self, token: str, fetch: Callable[[], Listed]) -> None:
        """LIST the page at `token` on a thread of its own (forgetting any other page asked for)."""
        future: Future[Listed] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fetch())
            except BaseException as exc:  # noqa: BLE001 - handed to take(), which forgets it
                future.set_exception(exc)

        with self._lock:
            self._token, self._future = token, future
        threading.Thread(target=run, name="page-ahead", daemon=True).start()

    def take(self, token: str | None) -> Listed | None:
        """The page at `token` if it was asked for (waiting for it); None: LIST it yourself."""
        with self._lock:
            future, asked = self._future, self._token
            self._token, self._future = None, None
        if future is None or token is None or asked != token:
            return None
        try:
            return future.result()
        except Exception:  # noqa: BLE001 - the chunk LISTs again, with its own retries and verdicts
            return None

    def forget(self) -> None:
        """Drop a page asked for and not taken (the run stopped, or starts a new pass)."""
        with self._lock:
            self._token, self._future = None, None
