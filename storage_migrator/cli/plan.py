"""``storage-migrator plan``: being built on branch cli (issue 12 item 2, issue 14 item 3)."""

from __future__ import annotations

import sys

import typer

__all__ = ["command"]


def command() -> None:
    """Not yet: being built on branch cli."""
    print("storage-migrator: plan is not built yet", file=sys.stderr)
    raise typer.Exit(1)
