"""A migration's calls to Prefect: those it can do without, and the one it waits for (issues 31, 37).

A run's writes need only the cluster (its request and its writer Lease: issue 37); its
progress bar, labels and events do not need to arrive. Such a call is tried once (the
client's retries, 2 + 4 + 8 + 16 + 32 s, would hold the chunk loop for a minute), and a
failure is a warning in the run's log, never the run's end: the server may be restarting
(`docs/operator-guide.md`, "When the Prefect server goes down"). Even one try of a server
that refuses connections costs 1.5 s (Prefect 3.9.1 sets the transport's connection retries
to 3, httpcore waits 0.5 s before each), so the progress bar, updated between chunks, is
shown by a thread of its own (`ProgressBar`): the chunk loop never waits on Prefect.

What a run cannot leave out is its end: Prefect 3.9.1's engine proposes the final state
once, through the client's retries (about a minute), and a run that ended during a longer
outage would show Running for ever. So the run's body is followed by a wait until the
server answers (`reported_end`), bounded by `prefect_outage_seconds`.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import update_progress_artifact
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL

from tasks.single_try import single_try

log = logging.getLogger(__name__)

#: Seconds between two asks of a Prefect server that does not answer, at the end of a run.
ASK_SECONDS = 3.0
#: Seconds before the progress bar tries again to show its newest figure to a server that did not answer.
SHOW_AGAIN_SECONDS = 5.0


@contextmanager
def best_effort(what: str) -> Iterator[None]:
    """Run the body's Prefect calls once each; on any error, warn naming `what` and go on."""
    try:
        with single_try():
            yield
    except Exception as exc:  # noqa: BLE001 - bookkeeping, not the migration
        log.warning("could not update %s (%s: %s); the migration goes on", what, type(exc).__name__, exc)


class ProgressBar:
    """A run's progress artifact, updated by a thread of its own (issue 37): `show` hands it the
    newest figure and returns at once; a figure the server did not take is shown again, the newest
    then, every SHOW_AGAIN_SECONDS until it answers. The thread runs in the caller's context (its
    Prefect settings and run)."""

    def __init__(self, artifact: UUID) -> None:
        self._artifact = artifact
        self._newest: float | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=contextvars.copy_context().run, args=(self._run,),
                                        name="progress-artifact", daemon=True)  # fmt: skip
        self._thread.start()

    def show(self, percent: float) -> None:
        self._newest = percent
        self._wake.set()

    def close(self) -> None:
        """No more figures: the thread ends (a call under way is left to finish on its own)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=2 * SHOW_AGAIN_SECONDS)

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            value = self._newest
            if value is None or self._stop.is_set():
                continue
            try:
                with single_try():
                    update_progress_artifact(artifact_id=self._artifact, progress=value)
            except Exception as exc:  # noqa: BLE001 - bookkeeping, not the migration
                if not failing:
                    log.warning("could not update the progress artifact (%s: %s); the migration goes on, and the "
                                "bar is shown again once the server answers", type(exc).__name__, exc)  # fmt: skip
                failing = True
                if not self._stop.wait(SHOW_AGAIN_SECONDS):
                    self._wake.set()
                continue
            if failing:
                log.warning("the progress artifact is shown again: the Prefect server answers")
                failing = False
            if self._newest == value:
                self._newest = None


def _unanswered() -> BaseException | None:
    """Why the Prefect server does not answer its health check now (None: it answers)."""
    try:
        with single_try(), get_client(sync_client=True) as client:
            return client.api_healthcheck()
    except Exception as exc:  # noqa: BLE001 - any failure is "not answering"
        return exc


@contextmanager
def reported_end(within: float) -> Iterator[None]:
    """Around a flow's body: once it is over, wait (at most `within` seconds) until the Prefect
    server answers, so that the engine's report of the final state reaches it (issue 37: "its
    flow run reports its end once the server is back"). No wait without a server of its own."""
    try:
        yield
    finally:
        if PREFECT_API_URL.value():
            _await_server(within)


def _await_server(within: float) -> None:
    deadline = time.monotonic() + within
    first = _unanswered()
    if first is None:
        return
    logger = get_run_logger()
    logger.warning("the Prefect server does not answer (%s: %s): this run's work is done, and it reports its end "
                   "once the server answers (asked every %.0f s, for at most %.0f s: prefect_outage_seconds)",
                   type(first).__name__, first, ASK_SECONDS, within)  # fmt: skip
    began = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(min(ASK_SECONDS, max(0.0, deadline - time.monotonic())))
        if _unanswered() is None:
            logger.warning("the Prefect server answers again after %.0f s: the run reports its end",
                           time.monotonic() - began)  # fmt: skip
            return
    logger.warning("the Prefect server did not answer for %.0f s (prefect_outage_seconds): the run ends without "
                   "waiting longer; its request's verdict is in the cluster", within)  # fmt: skip
