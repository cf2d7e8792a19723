"""One way to print a command's answer: ``-o table|json|yaml``.

Design decision: a command builds its answer once as plain data (JSON types,
stable keys: docs/cli.md lists them) and a table view of the same data; this
module prints one of the three. ``json`` and ``yaml`` carry the same data, a
list of objects (or one object where the command answers with one), so that
scripts never parse a table. The table is rich's, drawn like ``kubectl get``:
upper-case headers, no borders, three spaces between columns, never wrapped or
truncated (a hash cut short is worse than a wide line).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

__all__ = ["Output", "OutputFormat", "emit", "render_table"]


class OutputFormat(StrEnum):
    """What ``-o`` accepts."""

    table = "table"
    json = "json"
    yaml = "yaml"


Output = Annotated[
    OutputFormat,
    typer.Option(
        "-o",
        "--output",
        help="table (like kubectl get), json or yaml; json and yaml carry the same stable keys (docs/cli.md)",
        case_sensitive=False,
    ),
]

# Wide enough that rich never wraps nor truncates a cell; lines are stripped after.
_UNBOUNDED = 100_000


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A ``kubectl get``-like table; bold headers only on a terminal (rich decides)."""
    table = Table(box=None, pad_edge=False, padding=(0, 3, 0, 0), show_edge=False, header_style="bold")
    for header in headers:
        table.add_column(header, no_wrap=True, overflow="ignore")
    for row in rows:
        table.add_row(*row)
    console = Console(file=sys.stdout, width=_UNBOUNDED, highlight=False, soft_wrap=False)
    with console.capture() as captured:
        console.print(table)
    return "\n".join(line.rstrip() for line in captured.get().splitlines())


def emit(output: OutputFormat, data: Any, table: Callable[[], str]) -> None:
    """Print ``data`` as JSON or YAML, or the ``table()`` view of it."""
    if output is OutputFormat.json:
        print(json.dumps(data, indent=2))
    elif output is OutputFormat.yaml:
        print(yaml.safe_dump(data, sort_keys=False), end="")
    else:
        print(table())
