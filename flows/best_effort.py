"""A migration's calls to Prefect: those it can do without, and the one it waits for (issues 31, 37).

A run's writes need only the cluster (its request and its writer Lease: issue 37); its
progress bar, labels and events do not need to arrive. Such a call is tried once (the
client's retries, 2 + 4 + 8 + 16 + 32 s, would hold the chunk loop for a minute), and a
failure is a warning in the run's log, never the run's end: the server may be restarting
(`docs/operator-guide.md`, "When the Prefect server goes down").

What a run cannot leave out is its end: Prefect 3.9.1's engine proposes the final state
once, through the client's retries (about a minute), and a run that ended during a longer
outage would show Running for ever. So the run's body is followed by a wait until the
server answers (`reported_end`), bounded by `prefect_outage_seconds`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL

from tasks.single_try import single_try

log = logging.getLogger(__name__)

#: Seconds between two asks of a Prefect server that does not answer, at the end of a run.
ASK_SECONDS = 3.0


@contextmanager
def best_effort(what: str) -> Iterator[None]:
    """Run the body's Prefect calls once each; on any error, warn naming `what` and go on."""
    try:
        with single_try():
            yield
    except Exception as exc:  # noqa: BLE001 - bookkeeping, not the migration
        log.warning("could not update %s (%s: %s); the migration goes on", what, type(exc).__name__, exc)


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
