"""Whether a flow-run process may run what the Prefect API asks (issue 35), as a table.

Issue 35, item 2: the runner "refuses to run (in one line, with the flow run marked Failed)
unless all of these hold: the entrypoint is one of the flows the image ships; the pull steps
are exactly those our `prefect.yaml` makes (a change of working directory in the image), and
none is run beyond that; the parameters validate against the flow's own signature; the
`cluster` parameter is this cluster's, read from the install's ConfigMap, never from the API."
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from storage_migrator.fleet.run_admission import (
    SET_WORKING_DIRECTORY,
    Install,
    RunAsked,
    expected_pull_steps,
    one_line,
    refusal,
)

MIGRATE = "flows/migrate_resource.py:migrate_resource"
DETECT = "flows/detect_storage_changes.py:detect_storage_changes"
HOME = "/opt/prefect"
PULL_A = Install(flows=(MIGRATE, DETECT), directory=HOME, cluster="a")
PUSH = Install(flows=(MIGRATE, DETECT), directory=HOME, cluster=None)
OURS = [{SET_WORKING_DIRECTORY: {"directory": HOME}}]


def asked(**changes: Any) -> RunAsked:
    base: dict[str, Any] = {"deployment": "migrate-resource/a", "entrypoint": MIGRATE, "pull_steps": OURS,
                            "parameters": {"resource": "configmaps", "cluster": "a"}}  # fmt: skip
    return RunAsked(**{**base, **changes})


def signature(entrypoint: str, parameters: Mapping[str, Any]) -> str | None:
    """Stands for the flow's own validation: migrate-resource takes no `bogus`, and `chunk_size` is an int."""
    assert entrypoint in (MIGRATE, DETECT), "asked only about a shipped flow"
    if "bogus" in parameters:
        return "Function expects parameters [...] but was provided with parameters ['bogus']"
    if not isinstance(parameters.get("chunk_size", 0), int):
        return "chunk_size: Input should be a valid integer"
    return None


CASES: list[tuple[str, RunAsked, Install, str | None]] = [
    ("our deployment, this cluster", asked(), PULL_A, None),
    ("cluster left out in push mode: the environment's", asked(parameters={"resource": "secrets"}), PUSH, None),
    ("push mode: cluster names a block", asked(parameters={"cluster": "prod"}), PUSH, None),
    ("push mode may name its kubeconfig (the worker's own files)", asked(parameters={"kubeconfig": "/k"}), PUSH, None),
    ("a flow run of no deployment", asked(deployment=None, entrypoint=None), PULL_A,
     "the flow run belongs to no deployment with an entrypoint"),
    ("a storage block: remote code", asked(storage_block=True), PULL_A,
     "the deployment migrate-resource/a names a storage block: no code is fetched here"),
    ("an entrypoint of the attacker's", asked(entrypoint="/tmp/evil.py:run"), PULL_A,
     "names the entrypoint '/tmp/evil.py:run', which is not one of the flows this install ships "
     f"({MIGRATE}, {DETECT})"),
    ("a module path to a flow of ours is still not prefect.yaml's entrypoint",
     asked(entrypoint="flows.migrate_resource.migrate_resource"), PULL_A, "which is not one of the flows"),
    ("a pull step added", asked(pull_steps=[*OURS, {"prefect.deployments.steps.run_shell_script": {"script": "x"}}]),
     PULL_A, "has the pull steps [prefect.deployments.steps.set_working_directory, "
     "prefect.deployments.steps.run_shell_script], and prefect.yaml makes one"),
    ("a git clone instead", asked(pull_steps=[{"prefect.deployments.steps.git_clone": {"repository": "r"}}]),
     PULL_A, "has the pull steps [prefect.deployments.steps.git_clone]"),
    ("no pull step: Prefect would copy deployment.path", asked(pull_steps=None), PULL_A, "has the pull steps [none]"),
    ("the working directory elsewhere", asked(pull_steps=[{SET_WORKING_DIRECTORY: {"directory": "/tmp/x"}}]),
     PULL_A, "changes into '/tmp/x', and this install's flows are in '/opt/prefect'"),
    ("a parameter naming another cluster", asked(parameters={"resource": "configmaps", "cluster": "b"}), PULL_A,
     "this flow run is for cluster 'b', and the worker that took it serves cluster 'a'"),
    ("cluster left out in pull mode: the default cluster, not this one", asked(parameters={}), PULL_A,
     "this flow run is for cluster 'default', and the worker that took it serves cluster 'a'"),
    ("a cluster name no block can have", asked(parameters={"cluster": "B/../x"}), PULL_A,
     "the parameter cluster: cluster 'B/../x' is not a KubernetesClusterConfig block name"),
    ("credentials named by the API in pull mode", asked(parameters={"cluster": "a", "kubeconfig": "/root/.kube"}),
     PULL_A, "the parameters kubeconfig would choose credentials"),
    ("a parameter the flow does not take", asked(parameters={"cluster": "a", "bogus": 1}), PULL_A,
     "the parameters do not fit the flow: Function expects parameters"),
    ("a parameter of the wrong type", asked(parameters={"cluster": "a", "chunk_size": "x"}), PULL_A,
     "chunk_size: Input should be a valid integer"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "run", "install", "expected"), CASES, ids=[c[0] for c in CASES])
def test_refusal(case: str, run: RunAsked, install: Install, expected: str | None) -> None:
    found = refusal(run, install, check_parameters=signature)
    if expected is None:
        assert found is None, found
        return
    assert found is not None and expected in found, found
    # "Where it is refused, the flow run says why, in one line."
    assert "\n" not in found and found.startswith("refused by storage-migrator-run (issue 35): ")
    assert found.endswith("; nothing of it was run")


def test_the_first_problem_is_the_one_said_and_parameters_are_checked_last() -> None:
    """An attacker's entrypoint with bad parameters: the entrypoint is named, and the flow's validation
    (which imports the flow) is never asked about a flow the install does not ship."""
    asked_about: list[str] = []

    def spy(entrypoint: str, parameters: Mapping[str, Any]) -> str | None:
        asked_about.append(entrypoint)
        return None

    found = refusal(asked(entrypoint="evil.py:x", parameters={"bogus": 1}), PULL_A, check_parameters=spy)
    assert found is not None and "evil.py:x" in found
    assert asked_about == []
    assert refusal(asked(), PULL_A, check_parameters=spy) is None and asked_about == [MIGRATE]


def test_expected_pull_steps_are_what_prefect_deploy_records() -> None:
    # prefect deploy (3.9.1, cli/deploy/_actions.py): one set_working_directory step, {"directory": ...}.
    assert expected_pull_steps(PULL_A) == [{"prefect.deployments.steps.set_working_directory": {"directory": HOME}}]


def test_one_line() -> None:
    assert one_line("a\n  b\tc ") == "a b c"
