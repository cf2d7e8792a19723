"""The ``storage-migrator`` command: the typer app, its global options and its commands.

Design decision: typer + rich, Prefect's own CLI stack. One module per command
(``storage_migrator/cli/<command>.py``, a function named ``command`` whose
docstring is its help); adding a command is that module, imported and registered below.
A group of commands (``fleet``) is a module with a typer ``app`` of its own, added below.
A command ends with ``typer.Exit(code)`` when it fails; ``main`` returns the
exit code, maps what the access layer raises, and the Prefect API's refusal
(cli/prefect_api.py), to exit 1 with the error on stderr, and leaves usage errors to typer (exit 2, as argparse did).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from storage_migrator.cli import (
    check_prefect,
    discover,
    fleet,
    history,
    metrics,
    plan,
    rbac,
    status,
    verify_etcd,
    worker,
)
from storage_migrator.cli.options import GlobalOptions
from storage_migrator.cli.prefect_api import PrefectApiError
from storage_migrator.kube.connection import ConnectionConfigError
from storage_migrator.kube.errors import KubeError

__all__ = ["app", "main"]

app = typer.Typer(
    name="storage-migrator",
    help="Kubernetes storage version migration as Prefect flows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _global_options(
    ctx: typer.Context,
    kubeconfig: Annotated[
        Path | None, typer.Option(help="kubeconfig file (default: STORAGE_MIGRATOR_KUBECONFIG, KUBECONFIG)")
    ] = None,
    context: Annotated[str | None, typer.Option(help="kubeconfig context (default: the current one)")] = None,
) -> None:
    ctx.obj = GlobalOptions(kubeconfig=kubeconfig, context=context)


# One line per command (docs/cli.md documents each).
app.command("discover")(discover.command)
app.command("verify-etcd")(verify_etcd.command)
app.command("status")(status.command)
app.command("plan")(plan.command)
app.command("rbac")(rbac.command)
app.command("history")(history.command)
app.command("metrics")(metrics.command)
app.command("check-prefect")(check_prefect.command)
app.command("worker")(worker.command)
app.add_typer(fleet.app, name="fleet")


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: run one command, return its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        app(args=args, prog_name="storage-migrator")
    except SystemExit as exc:  # typer ends every run so, 0 included
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except (KubeError, ConnectionConfigError, PrefectApiError) as exc:
        print(f"storage-migrator: {exc}", file=sys.stderr)
        return 1
    return 0
