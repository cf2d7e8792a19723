"""The options every command shares (``--kubeconfig``, ``--context``) and what they build.

Design decision: the global options only override the ``STORAGE_MIGRATOR_*``
settings (DESIGN 5), so a command reads the cluster exactly as the flows do,
through the same access layer (storage_migrator/kube/).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer
from pydantic import BaseModel

from storage_migrator.kube.connection import connected
from storage_migrator.settings import Settings

__all__ = ["EngineOption", "GlobalOptions", "kube_api", "settings_of"]


class EngineOption(StrEnum):
    """What ``--engine`` accepts (issue 36): the values of the setting STORAGE_MIGRATOR_ENGINE."""

    client = "client"
    in_tree = "in-tree"
    auto = "auto"


class GlobalOptions(BaseModel):
    """What the top-level options say; ``None`` leaves the setting to the environment."""

    kubeconfig: Path | None = None
    context: str | None = None


def settings_of(ctx: typer.Context) -> Settings:
    """The settings with the global options applied."""
    options = ctx.find_object(GlobalOptions) or GlobalOptions()
    return Settings(**options.model_dump(exclude_none=True))


#: An API client for the command, closed afterwards (the access layer's, as the tasks use).
kube_api = connected
