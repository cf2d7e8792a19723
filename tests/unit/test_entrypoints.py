"""Every `prefect.yaml` entrypoint loads the flow it names (issue 21: modules moved, and
`prefect deploy --all` reads these paths; a stale one fails only at deploy time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect.flows import Flow, load_flow_from_entrypoint

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENTS: list[dict[str, Any]] = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]


def test_every_flow_module_is_deployed() -> None:
    """A flow module with no deployment is a flow users cannot run with `prefect deployment run`."""
    deployed = {d["entrypoint"].split(":")[0] for d in DEPLOYMENTS}
    flows = {f"flows/{p.name}" for p in (ROOT / "flows").glob("*.py")
             if "@flow" in p.read_text() and not p.name.startswith("_")}  # fmt: skip
    assert flows - deployed == set()


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=[d["name"] for d in DEPLOYMENTS])
def test_the_entrypoint_loads_its_flow_with_the_parameters_given(
    deployment: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # prefect deploy resolves entrypoints from the project's root
    flow = load_flow_from_entrypoint(deployment["entrypoint"])
    assert isinstance(flow, Flow)
    assert flow.name == deployment["entrypoint"].split(":")[1].replace("_", "-")
    unknown = set(deployment.get("parameters") or {}) - set(flow.parameters.properties)
    assert not unknown, f"{deployment['name']}: parameters the flow does not take: {unknown}"
