"""A Prefect server outage as a migration sees it: wait, go on, or give up (issue 31).

Design decision: the shared write budget lives on the Prefect server, so a run cannot
write its share while the server is down (several workers pacing alone would exceed the
budget). Its request is in the cluster, which is up: the run keeps its checkpoint there
and refreshes its lease while it waits, so no dispatcher starts a second run beside it.
After `prefect_outage_seconds` it gives up, leaving the request Running=False, neither
Succeeded nor Failed: seed 002 "Failure recovery" resumes it from its token, and the
dispatcher has no lease to wait for (`dispatch.plan_dispatch`: anything not finished and
not held by a live lease is pending).
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = [
    "HOLD_SECONDS",
    "PREFECT_UNREACHABLE",
    "WAITING_FOR_PREFECT",
    "MigrationSuspended",
    "OutageAction",
    "decide_outage",
    "gave_up_message",
    "waiting_message",
]

#: The reason of the Running condition while the run waits (Running=True, lease refreshed).
WAITING_FOR_PREFECT = "WaitingForPrefect"
#: The reason once it gave up (Running=False, checkpoint kept).
PREFECT_UNREACHABLE = "PrefectUnreachable"
#: How often a waiting run refreshes its request's lease: well inside lease_seconds (600 s).
HOLD_SECONDS = 30.0

OutageAction = Literal["go", "wait", "give_up"]


class MigrationSuspended(Exception):
    """The run stops without a verdict; its request is left for the next dispatch."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (MigrationSuspended, (self.reason, self.message))


def decide_outage(silent_seconds: float, *, give_up_after: float) -> OutageAction:
    """`silent_seconds`: since the budget last answered (0: it answers now)."""
    if silent_seconds <= 0:
        return "go"
    return "give_up" if silent_seconds >= give_up_after else "wait"


def waiting_message(silent_seconds: float, give_up_after: float) -> str:
    return (f"waiting for the Prefect server (the write budget has not answered for {silent_seconds:.0f} s); "
            f"nothing is written meanwhile; the run gives up after {give_up_after:.0f} s "
            "(prefect_outage_seconds)")  # fmt: skip


def gave_up_message(silent_seconds: float) -> str:
    return (f"the Prefect server did not answer for {silent_seconds:.0f} s (prefect_outage_seconds): the run "
            "stopped, its checkpoint kept; the next run-migrations resumes it at once (or start one: "
            "prefect deployment run 'run-migrations/run-migrations' once the server is back)")  # fmt: skip
