"""One operation across a fleet: a verdict per cluster, and one for all (issue 20, item 4).

Design decision: each cluster's run is judged on its own (its own verdict, its
own message), and the fleet's verdict is only their conjunction: a cluster that
failed or could not be reached never changes another cluster's verdict, and the
summary says, cluster by cluster, which is which.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ClusterOutcome", "FleetVerdict", "fleet_verdict"]


class ClusterOutcome(BaseModel):
    """How one cluster's run ended: the name of its final state and its message."""

    model_config = ConfigDict(frozen=True)

    cluster: str = Field(min_length=1)
    state: str = Field(description="The final state of the cluster's run: Completed, Failed, Crashed, Cancelled.")
    message: str = ""
    flow_run: str | None = Field(default=None, description="The id of the cluster's flow run, when there is one.")

    @property
    def completed(self) -> bool:
        return self.state == "Completed"


class FleetVerdict(BaseModel):
    completed: bool
    message: str
    rows: list[dict[str, str]] = Field(description="The summary table: one row per cluster.")


def fleet_verdict(what: str, outcomes: Sequence[ClusterOutcome]) -> FleetVerdict:
    """Completed only when every cluster's run completed; the message names the others."""
    if not outcomes:
        raise ValueError(f"{what}: no cluster given")
    failed = [o for o in outcomes if not o.completed]
    rows = [{"cluster": o.cluster, "verdict": o.state, "message": o.message[:500], "flow run": o.flow_run or "-"}
            for o in outcomes]  # fmt: skip
    done = len(outcomes) - len(failed)
    if not failed:
        return FleetVerdict(completed=True, rows=rows,
                            message=f"{what}: Completed on all {len(outcomes)} clusters")  # fmt: skip
    named = "; ".join(f"{o.cluster}: {o.state}" + (f" ({o.message[:300]})" if o.message else "") for o in failed)
    return FleetVerdict(completed=False, rows=rows,
                        message=f"{what}: Completed on {done} of {len(outcomes)} clusters; not on {named}")  # fmt: skip
