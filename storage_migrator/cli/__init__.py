"""The ``storage-migrator`` command line (typer + rich); ``main`` is the console script."""

from storage_migrator.cli.app import app, main

__all__ = ["app", "main"]
