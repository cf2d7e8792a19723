"""The product's wheel and image hold the product only (issue 21).

kubesim and the dev stack are a distribution of their own (`sim/`, a uv workspace
member the dev group installs), so neither the product's wheel nor its image carries
the simulator. Judged by building the wheels and by installing what the Dockerfile
copies, with the Dockerfile's own `uv sync` commands, into an environment of its own.
"""

from __future__ import annotations

import os
import shlex
import shutil
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


def _dockerfile_steps() -> list[tuple[str, list[str]]]:
    """The Dockerfile's COPY and RUN instructions, in order (continuation lines joined)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    steps = []
    for line in text.splitlines():
        words = line.split(None, 1)
        if words and words[0] in ("COPY", "RUN"):
            steps.append((words[0], shlex.split(words[1]) if words[0] == "COPY" else [words[1]]))
    return steps


def test_the_images_uv_sync_installs_the_product_and_nothing_of_the_simulator(tmp_path: Path) -> None:
    """What the Dockerfile copies, synced as it syncs (`--frozen --no-dev`): the flows import,
    the CLI answers, and kubesim, devstack and kubesim's own dependencies are absent."""
    context = tmp_path / "image"
    context.mkdir()
    syncs = []
    for kind, args in _dockerfile_steps():
        if kind == "COPY":
            *sources, dest = args
            for source in sources:
                target = context / dest / Path(source).name if dest.endswith("/") else context / dest
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(ROOT / source, target)
        elif "uv sync" in args[0]:
            syncs.append(args[0].split("&&")[0].strip())
    assert len(syncs) == 2, syncs  # the dependencies' layer, then the project's
    assert not (context / "sim" / "kubesim").exists() and not (context / "sim" / "devstack").exists()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")}
    env |= {"UV_PYTHON_DOWNLOADS": "never", "PREFECT_HOME": str(tmp_path / "prefect"), "DO_NOT_TRACK": "1"}
    for command in syncs:
        # The cache is the machine's (no network needed); the image's build uses none.
        argv = [word for word in shlex.split(command) if word != "--no-cache"]
        done = subprocess.run(argv, cwd=context, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
    python = context / ".venv" / "bin" / "python"

    def run(code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(python), "-c", code], cwd=context, env=env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip

    assert run("import flows.migrate_resource, flows.detect_storage_changes, prefect_kubernetes").returncode == 0
    cli = subprocess.run([str(context / ".venv" / "bin" / "storage-migrator"), "--help"], cwd=context, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert cli.returncode == 0 and "verify-etcd" in cli.stdout, cli.stderr
    # Issue 35: the Jobs' command, the runner, is in the image (without a flow run it says what it needs).
    runner = subprocess.run([str(context / ".venv" / "bin" / "storage-migrator-run")], cwd=context, env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert runner.returncode == 2 and "PREFECT__FLOW_RUN_ID" in runner.stderr, runner.stderr
    # The runner accepts one pull step: into the install's directory, which must be the image's WORKDIR
    # (where `prefect deploy --job-variable image=...` records the runs' working directory).
    where = run("from flow_runner.shipped import INSTALL_DIRECTORY; print(INSTALL_DIRECTORY)")
    assert where.stdout.strip() == str(context.resolve()), where.stdout + where.stderr
    for module in ("kubesim", "devstack", "celpy", "playwright", "pytest"):
        missing = run(f"import {module}")
        assert missing.returncode != 0 and "ModuleNotFoundError" in missing.stderr, (module, missing.stderr)


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
