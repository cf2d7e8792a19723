"""Whether a flow-run process may run what the Prefect API asks of it (issue 35).

Design decision: "Prefect orders, shows and records; the cluster decides." Whoever holds
the Prefect API (one auth string, no roles) can rewrite a deployment's entrypoint and pull
steps, and a flow run's parameters; Prefect's engine runs them as given. Our runner
(`storage-migrator-run`, package `flow_runner`) asks this pure function first and runs
nothing the install does not ship:

- the run belongs to a deployment (a run without one has no entrypoint of ours);
- no storage block (remote code) is named;
- the entrypoint is one of the flows the image ships (prefect.yaml's, the runner's table);
- the pull steps are exactly prefect.yaml's: one change of working directory into the
  install's directory (`prefect deploy` records it); the runner runs none of them;
- in pull mode (the install names its cluster, STORAGE_MIGRATOR_CLUSTER from its own
  ConfigMap or worker environment, never from the API) the run is for this cluster, and
  names no credentials (`kubeconfig`, `context`): its own are the install's;
- the parameters validate against the flow's own signature (`check_parameters`, which the
  runner computes with the flow's own validation).

The answer is None (run it) or the one line that says why not, which the runner makes the
flow run's Failed message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.fleet.identity import judge_worker
from storage_migrator.fleet.names import block_of, cluster_name

__all__ = [
    "CREDENTIAL_PARAMETERS",
    "SET_WORKING_DIRECTORY",
    "Install",
    "RunAsked",
    "expected_pull_steps",
    "one_line",
    "refusal",
]

#: The one pull step prefect.yaml's deployments carry (recorded by `prefect deploy`).
SET_WORKING_DIRECTORY: Final = "prefect.deployments.steps.set_working_directory"
#: Parameters that would choose the credentials; in pull mode they are the install's alone.
CREDENTIAL_PARAMETERS: Final = ("kubeconfig", "context")
_REFUSED: Final = "refused by storage-migrator-run (issue 35): "
_NOTHING_RAN: Final = "; nothing of it was run"


class RunAsked(BaseModel):
    """What the Prefect API says a flow run is: its deployment's code and the run's parameters."""

    model_config = ConfigDict(frozen=True)

    deployment: str | None = Field(description="The deployment's name (flow/deployment); None: no deployment.")
    entrypoint: str | None = None
    pull_steps: list[dict[str, Any]] | None = None
    storage_block: bool = Field(default=False, description="The deployment names a storage block (remote code).")
    parameters: dict[str, Any] = Field(default_factory=dict)


class Install(BaseModel):
    """What this install is, read from the install itself (the image, its ConfigMap), never from the API."""

    model_config = ConfigDict(frozen=True)

    flows: tuple[str, ...] = Field(description="The entrypoints of the flows the image ships.")
    directory: str = Field(description="Where the flows are installed: the only working directory accepted.")
    cluster: str | None = Field(default=None, description="Pull mode: this cluster's name; None otherwise.")


def expected_pull_steps(install: Install) -> list[dict[str, Any]]:
    """prefect.yaml's pull steps, as `prefect deploy` records them for this install."""
    return [{SET_WORKING_DIRECTORY: {"directory": install.directory}}]


def one_line(text: str) -> str:
    """A message on one line (a state message, a log line): whitespace runs collapsed."""
    return " ".join(str(text).split())


def _step_names(steps: list[dict[str, Any]]) -> str:
    names = [next(iter(s), "?") if isinstance(s, dict) and s else repr(s) for s in steps]
    return ", ".join(str(n) for n in names) or "none"


def _pull_steps_problem(asked: RunAsked, install: Install) -> str | None:
    if asked.pull_steps == expected_pull_steps(install):
        return None
    steps = asked.pull_steps or []
    if len(steps) == 1 and isinstance(steps[0], dict) and set(steps[0]) == {SET_WORKING_DIRECTORY}:
        where = (steps[0][SET_WORKING_DIRECTORY] or {}).get("directory")
        return (f"the deployment {asked.deployment} changes into {where!r}, and this install's flows are in "
                f"{install.directory!r}: deploy from the install's directory (prefect.yaml's header)")  # fmt: skip
    return (f"the deployment {asked.deployment} has the pull steps [{_step_names(steps)}], and prefect.yaml "
            f"makes one: {SET_WORKING_DIRECTORY} into {install.directory!r}; no other is run here")  # fmt: skip


def _cluster_problem(asked: RunAsked, install: Install) -> str | None:
    if install.cluster is None:  # push mode, or one cluster: `cluster` names a block, the worker's own way in
        return None
    given = [p for p in CREDENTIAL_PARAMETERS if asked.parameters.get(p) is not None]
    if given:
        return (f"the parameters {', '.join(given)} would choose credentials, and this worker reaches cluster "
                f"{install.cluster!r} with the install's own (pull mode): leave them out")  # fmt: skip
    try:
        wanted = cluster_name(block_of(asked.parameters.get("cluster")))
    except ValueError as exc:
        return f"the parameter cluster: {exc}"
    return judge_worker(wanted, worker=install.cluster)


def refusal(asked: RunAsked, install: Install, *,
            check_parameters: Callable[[str, Mapping[str, Any]], str | None]) -> str | None:  # fmt: skip
    """None: run it. Else the one line that says why not (the flow run's Failed message).

    `check_parameters(entrypoint, parameters)` validates the parameters against the shipped
    flow's own signature (None: valid); it is asked only about an entrypoint of `install.flows`."""
    problem: str | None
    if asked.deployment is None or asked.entrypoint is None:
        problem = "the flow run belongs to no deployment with an entrypoint: only the install's flows run here"
    elif asked.storage_block:
        problem = f"the deployment {asked.deployment} names a storage block: no code is fetched here"
    elif asked.entrypoint not in install.flows:
        problem = (f"the deployment {asked.deployment} names the entrypoint {asked.entrypoint!r}, which is not "
                   f"one of the flows this install ships ({', '.join(install.flows)})")  # fmt: skip
    else:
        problem = _pull_steps_problem(asked, install) or _cluster_problem(asked, install)
        if problem is None:
            invalid = check_parameters(asked.entrypoint, asked.parameters)
            problem = None if invalid is None else f"the parameters do not fit the flow: {invalid}"
    return None if problem is None else one_line(_REFUSED + problem + _NOTHING_RAN)
