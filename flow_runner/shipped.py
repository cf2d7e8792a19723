"""What this install ships and is, read from the install itself, never from the Prefect API (issue 35).

- `SHIPPED`: the flows the image ships, by the entrypoint prefect.yaml gives each
  (tests/unit/flow_runner keeps the two equal), and where each is imported from: the runner
  imports from this table, never from a path the API names.
- `install()`: the entrypoints, the install's directory (where `flows` is installed: the
  image's /opt/prefect, a checkout's root) and, in pull mode, this cluster's name
  (STORAGE_MIGRATOR_CLUSTER, which the install gives: the ConfigMap `storage-migrator-cluster`
  in a Job, the worker's own environment off-cluster).
- `parameter_problem`: the parameters against the shipped flow's own signature.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from prefect import Flow
from pydantic import ValidationError

import flows
from storage_migrator.fleet.run_admission import Install, one_line
from storage_migrator.settings import Settings

__all__ = ["SHIPPED", "InstallUnreadable", "install", "load", "parameter_problem"]

#: entrypoint (as prefect.yaml and `prefect deploy` write it) -> (module, flow object's name).
SHIPPED: Final[Mapping[str, tuple[str, str]]] = {
    "flows/detect_storage_changes.py:detect_storage_changes": ("flows.detect_storage_changes", "detect_storage_changes"),
    "flows/migrate_resource.py:migrate_resource": ("flows.migrate_resource", "migrate_resource"),
    "flows/run_migrations.py:run_migrations": ("flows.run_migrations", "run_migrations"),
    "flows/initialize.py:initialize": ("flows.initialize", "initialize"),
    "flows/rotate_encryption_key.py:rotate_encryption_key": ("flows.rotate_encryption_key", "rotate_encryption_key"),
    "flows/rotation_runbook.py:key_rotation_runbook": ("flows.rotation_runbook", "key_rotation_runbook"),
}  # fmt: skip
#: Where the flows are installed: the directory holding the `flows` package.
INSTALL_DIRECTORY: Final = Path(flows.__file__).resolve().parent.parent


class InstallUnreadable(Exception):
    """This install's own settings cannot be read (a STORAGE_MIGRATOR_* variable is invalid)."""


def install() -> Install:
    """This install, from its own environment: pull mode when it names its cluster and no block."""
    try:
        settings = Settings()
    except ValidationError as exc:
        raise InstallUnreadable(
            f"this install's STORAGE_MIGRATOR_* settings are invalid: {one_line(str(exc))}"
        ) from exc
    cluster = settings.cluster if settings.cluster_config_block is None else None
    return Install(flows=tuple(SHIPPED), directory=str(INSTALL_DIRECTORY), cluster=cluster)


def load(entrypoint: str) -> Flow[..., Any]:
    """The shipped flow of `entrypoint` (KeyError for one the install does not ship)."""
    module, name = SHIPPED[entrypoint]
    found = getattr(importlib.import_module(module), name)
    if not isinstance(found, Flow):
        raise TypeError(f"{module}.{name} is not a Prefect flow")
    return found


def parameter_problem(entrypoint: str, parameters: Mapping[str, Any]) -> str | None:
    """None when `parameters` bind to the flow's signature and validate against its annotations."""
    try:
        load(entrypoint).validate_parameters(dict(parameters))
    except Exception as exc:  # noqa: BLE001 - Prefect raises its own errors and pydantic's: each is the answer
        return one_line(str(exc)) or type(exc).__name__
    return None
