"""Our own loggers' warnings in the flow run's log, where an operator reads it (issue 12).

The ledger writer and the run's writer Lease log from threads of their own, on
loggers of their own (`storage_migrator.ledger`, `storage_migrator.migration.request_lease`):
"ledger unreachable, retrying in the background", "the API server did not answer; writes
pause", "taken over: this run writes nothing more". Prefect sends a record to the run's log only from inside the run's
context, so these reached the worker's console and not the Prefect UI. For a
flow run's lifetime, Prefect's API log handler is attached to those loggers
with the run's id put on each record (WARNING and above: what needs a person).
Nested flows leave it to the outermost one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from uuid import UUID

from prefect.logging.handlers import APILogHandler
from prefect.runtime import flow_run

__all__ = ["OUR_LOGGERS", "our_logs_in_the_run"]

#: Loggers of ours that log outside Prefect's run context (background threads).
OUR_LOGGERS = ("storage_migrator", "tasks")

_attached: ContextVar[bool] = ContextVar("storage_migrator_run_logs", default=False)


class _ThisRun(logging.Filter):
    """Puts the run's id on records that carry none (those from background threads)."""

    def __init__(self, run_id: UUID) -> None:
        super().__init__()
        self.run_id = run_id

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "flow_run_id", None):
            record.flow_run_id = self.run_id
        return True


@contextmanager
def our_logs_in_the_run() -> Iterator[None]:
    """Around a flow's body (see the module docstring)."""
    run_id = flow_run.id
    if run_id is None or _attached.get():
        yield
        return
    handler = APILogHandler(level=logging.WARNING)
    handler.addFilter(_ThisRun(UUID(str(run_id))))
    loggers = [logging.getLogger(name) for name in OUR_LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    token = _attached.set(True)
    try:
        yield
    finally:
        _attached.reset(token)
        for logger in loggers:
            logger.removeHandler(handler)
