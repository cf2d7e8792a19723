"""``storage-migrator check-prefect``: whether the Prefect API answers and accepts our credentials.

Issue 30: a worker started without the server's auth string ends in a stack trace whose
last line is an HTTP 401 (`prefect worker start`, Prefect 3.9). `storage-migrator worker`
(deployments/worker/'s, and the off-cluster one) runs this first and starts only when it
passes, so a missing or stale string is one line in its log that names PREFECT_API_AUTH_STRING.
"""

from __future__ import annotations

import sys

import typer

from storage_migrator.cli.prefect_api import PrefectApiError, api_url, prefect_client

__all__ = ["command"]


def command() -> None:
    """Whether the Prefect API (PREFECT_API_URL) answers and accepts this process's credentials (PREFECT_API_AUTH_STRING, or PREFECT_API_KEY for Prefect Cloud): run it before a worker starts.

    Reads nothing but Prefect's /health and /hello. Exit codes: 0 it does; 1 it does not, and the message says what to set.
    """
    url = api_url()
    if not url:
        print("storage-migrator: PREFECT_API_URL is not set: point it at the Prefect server the workers use "
              "(export PREFECT_API_URL=http://HOST:4200/api)", file=sys.stderr)  # fmt: skip
        raise typer.Exit(1)
    try:
        with prefect_client() as client:
            unhealthy = client.api_healthcheck()  # /health asks for no credentials: is it there at all
            if unhealthy is not None:
                print(f"storage-migrator: the Prefect API at {url} does not answer: {unhealthy}", file=sys.stderr)
                raise typer.Exit(1)
            client.hello()  # a call that needs the credentials: Prefect's client raises on 401
    except PrefectApiError:
        raise  # main() prints it
    except typer.Exit:
        raise
    except Exception as exc:
        print(f"storage-migrator: the Prefect API at {url} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise typer.Exit(1) from exc
    print(f"the Prefect API at {url} answers and accepts this process's credentials")
