"""The session's Prefect server for the tests that run flows in-process: Prefect's test
harness, on PostgreSQL.

Issue 29: Prefect's own harness (`prefect.testing.utilities.prefect_test_harness`) keeps
its database in SQLite. Under load two of its writes meet on the file's lock ("database is
locked"), the server answers 503 and the client waits 2, 4, then 8 s before it tries again:
seconds of nothing in a test that runs flows, and once a failed CI run. PostgreSQL, the
documented choice for a shared server (issue 13), has no such lock. The rest is the harness's
recipe: the server a subprocess on a free port, this process's settings pointed at it
(tasks never cache), Prefect's log and event workers drained before it stops.

The server asks for an auth string, as every server we start does (issue 30; devstack): this
process's settings carry it (PREFECT_API_AUTH_STRING), and so does its environment, which the
tests' own subprocesses (`prefect deploy`, the CLI, flows in processes of their own) inherit.

The flows run here send no heartbeats: Prefect 3.9 gives every flow run a heartbeat thread
that sleeps in steps of a second and is joined when the run ends, so each flow called
in-process took a second at least (12 polls of one test: 7.5 of its 11.9 s). Nothing in
these tests watches heartbeats (run-migrations keeps a lease of its own); the e2e tier's
deployed runs keep Prefect's default.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from devstack import CLIENT_AUTH_SETTING, free_port, new_auth_string


@contextmanager
def prefect_server(database_url: str, *, timeout: int = 180) -> Iterator[str]:
    """A Prefect server on `database_url` (SQLAlchemy, asyncpg) for this process, asking for a new
    auth string (which this process's settings and environment carry); yields its API URL."""
    import prefect.context
    from prefect.logging.handlers import APILogWorker
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import (
        PREFECT_API_AUTH_STRING,
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_SERVER_API_AUTH_STRING,
        PREFECT_SERVER_DATABASE_CONNECTION_URL,
        temporary_settings,
    )
    from prefect.utilities.asyncutils import run_coro_as_sync

    os.environ["PREFECT_TASKS_DEFAULT_NO_CACHE"] = "true"
    auth_string = new_auth_string()
    prior_auth = os.environ.get(CLIENT_AUTH_SETTING)
    os.environ[CLIENT_AUTH_SETTING] = auth_string
    with ExitStack() as stack:
        stack.callback(_restore_env, CLIENT_AUTH_SETTING, prior_auth)
        stack.enter_context(temporary_settings(updates={PREFECT_SERVER_DATABASE_CONNECTION_URL: database_url,
                                                        PREFECT_API_AUTH_STRING: auth_string}))  # fmt: skip
        server = SubprocessASGIServer(port=free_port())
        # Flows that would start a temporary server of their own find this one (as the harness does).
        prior = SubprocessASGIServer._instances.get(None)
        SubprocessASGIServer._instances[None] = server
        # The server's subprocess takes this process's settings (SubprocessASGIServer): the server's
        # string only while it starts, as no client holds it (a worker passes its settings to its runs).
        with temporary_settings(updates={PREFECT_SERVER_API_AUTH_STRING: auth_string}):
            server.start(timeout=timeout)
        try:
            stack.enter_context(temporary_settings(updates={PREFECT_API_URL: server.api_url,
                                                            PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))  # fmt: skip
            # Threads and contexts made before this point see the server too (Prefect's harness does so).
            stack.enter_context(
                prefect.context._temporary_global_settings_context(prefect.context.get_settings_context())
            )
            yield server.api_url

            async def drain() -> None:
                from prefect.events.worker import EventsWorker

                try:
                    drained = APILogWorker.instance().drain()
                    if inspect.isawaitable(drained):
                        await drained
                except RuntimeError:
                    pass  # never started
                drained = EventsWorker.drain_all()
                if inspect.isawaitable(drained):
                    await drained

            run_coro_as_sync(drain())
        finally:
            server.stop()
            if prior is not None:
                SubprocessASGIServer._instances[None] = prior
            else:
                SubprocessASGIServer._instances.pop(None, None)


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
