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


#: Issue 29: "Import what a flow needs when it needs it: the ledger's SQLAlchemy only where a row is
#: written, the CLI's libraries only in the CLI." A deployed run imports its flow's module before its
#: first task; these load later (the ledger's writer thread) or never (the CLI, etcd's client).
NOT_BEFORE_THE_FIRST_TASK = ("sqlalchemy", "alembic", "psycopg", "typer", "pyetcd", "grpc", "prefect_kubernetes")


def test_a_flow_run_process_imports_no_ledger_or_cli_library_with_its_flow() -> None:
    """Every deployed flow's module, imported in a fresh process as the engine imports it."""
    import json
    import subprocess
    import sys

    modules = sorted({d["entrypoint"].split(":")[0].removesuffix(".py").replace("/", ".") for d in DEPLOYMENTS})
    probe = (f"import importlib, json, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
             f"print(json.dumps(sorted(m for m in {list(NOT_BEFORE_THE_FIRST_TASK)!r} if m in sys.modules)))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=True)  # fmt: skip
    assert json.loads(done.stdout.splitlines()[-1]) == []
