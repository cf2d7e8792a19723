"""The product's wheel and image hold the product only (issue 21).

kubesim and the dev stack are a distribution of their own (`sim/`, a uv workspace
member the dev group installs), so neither the product's wheel nor its image carries
the simulator. Judged here by building the wheels; the image by building it and looking
inside (tests/e2e/test_image.py, issue 38: it replaced a replay of the Dockerfile's steps).
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = {"storage_migrator", "flows", "tasks", "flow_runner"}
SIM = {"kubesim", "devstack"}


def _top_level(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name.split("/")[0] for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")}


def _build(tmp_path: Path, *args: str) -> Path:
    out = tmp_path / "dist"
    subprocess.run(["uv", "build", "--wheel", "--out-dir", str(out), *args], cwd=ROOT, check=True,
                   capture_output=True, text=True, timeout=300)  # fmt: skip
    (wheel,) = out.glob("*.whl")
    return wheel


def test_the_product_wheel_holds_the_product_and_the_sim_wheel_the_simulator(tmp_path: Path) -> None:
    product = _build(tmp_path / "product")
    assert product.name.startswith("storage_migrator-")
    assert _top_level(product) == PRODUCT
    sim = _build(tmp_path / "sim", "--package", "storage-migrator-sim")
    assert sim.name.startswith("storage_migrator_sim-")
    assert _top_level(sim) == SIM


@pytest.mark.parametrize("member", ["kubesim", "devstack"])
def test_the_dev_environment_gets_the_simulator_from_its_own_distribution(member: str) -> None:
    """The dev group installs `storage-migrator-sim`; its packages come from sim/, not the root."""
    from importlib import import_module
    from importlib.metadata import distribution

    module = import_module(member)
    assert Path(module.__file__ or "").resolve().is_relative_to(ROOT / "sim" / member)
    assert distribution("storage-migrator-sim").version == "0.1.0"


def test_the_dev_stack_runs_prefect_from_the_projects_root() -> None:
    """devstack runs `prefect deploy --all` and the workers in `devstack.REPO`: the root that
    holds prefect.yaml and the flows, two levels above sim/devstack/ (it was one before the move,
    and every e2e test then failed with "Unable to read the specified config file")."""
    import devstack

    assert devstack.REPO == ROOT
    assert (devstack.REPO / "prefect.yaml").is_file() and (devstack.REPO / "flows").is_dir()
