"""Calls to Prefect a migration can do without (issue 31): artifacts, labels.

A run's writes need the cluster and, on the shared budget, the budget's server; its
progress bar does not. Such a call is tried once (the client's retries, 2 + 4 + 8 + 16 +
32 s, would hold the chunk loop for a minute), and a failure is a warning in the run's log,
never the run's end: the server may be restarting (`docs/operator-guide.md`, "When the
Prefect server goes down").
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from tasks.single_try import single_try

log = logging.getLogger(__name__)


@contextmanager
def best_effort(what: str) -> Iterator[None]:
    """Run the body's Prefect calls once each; on any error, warn naming `what` and go on."""
    try:
        with single_try():
            yield
    except Exception as exc:  # noqa: BLE001 - bookkeeping, not the migration
        log.warning("could not update %s (%s: %s); the migration goes on", what, type(exc).__name__, exc)
