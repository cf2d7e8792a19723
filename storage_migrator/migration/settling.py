"""A settling API server, and the one retry policy for a failed request.

Design decision (issue 9, "A restarting API server fails objects for good"): a
kube-apiserver that has just started denies (401/403) what it allows a moment
later, until its authentication and RBAC caches fill. Such an answer is taken
as "the server is settling", not as an answer about the object, when this
migration saw the server fail (no answer, or a 5xx) within a window, or when
`/readyz` does not answer 200 right now. `retry_step` holds the whole policy:
transient answers are ordinary attempts, a settling server is waited out on a
budget of its own, anything else fails (upstream issue #83: no endless retries).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

from storage_migrator.kube.errors import is_retriable, is_server_trouble, is_settling_answer

__all__ = ["RetryStep", "ServerTrouble", "retry_step"]

#: What to do with a failed request: send it again as an ordinary attempt, wait
#: for a settling server (not counted as an attempt), or give up.
RetryStep = Literal["retry", "settle", "fail"]


class ServerTrouble:
    """When this migration last saw the API server fail; shared by the writer threads.

    "Trouble" is no answer at all or a 5xx (`is_server_trouble`), and a `/readyz`
    that did not answer 200. A 401/403 within `window_seconds` of it is taken as
    the server settling after a restart (issue: "A 403 or 401 right after
    connection errors or a /readyz failure is not an answer about the object").
    """

    def __init__(self, *, window_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_seconds = window_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._last: float | None = None

    def saw(self, error: BaseException) -> None:
        """Remember `error` if it says the server failed."""
        if is_server_trouble(error):
            self.note()

    def note(self) -> None:
        with self._lock:
            self._last = self._clock()

    def recent(self) -> bool:
        with self._lock:
            return self._last is not None and self._clock() - self._last <= self.window_seconds


def retry_step(
    error: BaseException,
    *,
    attempt: int,
    max_attempts: int,
    settled_for: float,
    settle_timeout: float,
    server_settling: Callable[[], bool],
) -> RetryStep:
    """The one policy for a failed request: send it again now, and on which budget?

    Transient answers (`is_retriable`) are ordinary attempts, `attempt` counting
    from 0 up to `max_attempts`. A 401/403 (`is_settling_answer`) is waited out
    while `server_settling()` says the server is settling (asked last: it may
    probe `/readyz`), for at most `settle_timeout` seconds in all
    (`settled_for` so far). Anything else is an answer about the object: fail
    (upstream issue #83: no endless retries).
    """
    if is_retriable(error):
        return "retry" if attempt + 1 < max_attempts else "fail"
    if is_settling_answer(error) and settled_for < settle_timeout and server_settling():
        return "settle"
    return "fail"
