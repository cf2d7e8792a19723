"""The e2e tier's one stack: `prefect.yaml` deployed on a real Prefect server (on
PostgreSQL, issue 13: the documented choice for a shared server) with a process worker,
against the session's kubesim. Every e2e test runs on it (issue 29: one server for the
tier, not one per file; a server, a deploy and a worker cost 30-40 s of CPU each time).

- test_deployments.py runs the deployments as an operator does;
- test_ui.py (issue 23) opens the server's UI in a browser;
- test_schedule.py has the server's scheduler fire the detection schedule;
- test_scale_out.py adds two workers of its own on queues the stack's worker does not read;
- test_fleet_pull.py adds two clusters in pull mode, each with a worker on a pool of its own;
- test_image.py (issue 38) runs the image of Dockerfile: its worker submits a run of the stack's
  server as a Job, and the Job's container migrates. The image is built in the background from
  the session's start (tests/e2e/image_build.py), while the other tests run.

The detection schedule (every 10 minutes) is paused from the start: a poll of the shared
cluster requests a migration of every resource there, and one that fired inside a test would
change what the test counts (CI, 2026-11-26: a scheduled poll requested resources while the
fleet test compared the worker's own cluster's requests before and after). test_schedule.py
resumes it for as long as it tests it. The stack's worker reads the `default` queue only.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import image_build
import pytest
from shared_stack import STACK_QUEUE, paused_detection

from devstack import PrefectStack
from devstack.postgres import Postgres, start_postgres

#: The module that runs last: it counts every write to the cluster (test_scale_out.py), so the
#: runs the other modules started (the UI's) are over by then.
LAST = ("test_scale_out.py",)
#: The module that runs just before it: the later, the likelier its image is built by then.
LATE = ("test_image.py",)


@pytest.fixture(scope="session")
def stack_postgres() -> Iterator[Postgres]:
    """The PostgreSQL server of the stack's Prefect server (its database: a test dumps it)."""
    postgres = start_postgres()
    try:
        yield postgres
    finally:
        postgres.stop()


@pytest.fixture(scope="session")
def deployed_stack(kubesim_session: Any, migration_crds: None, stack_postgres: Postgres,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectStack]:  # fmt: skip
    """`prefect deploy --all` on a server of its own (PostgreSQL), and one process worker."""
    postgres = stack_postgres
    stack = PrefectStack(
        tmp_path_factory.mktemp("prefect-home"),
        server_env={"PREFECT_API_DATABASE_CONNECTION_URL": postgres.url},
        worker_env={
            "STORAGE_MIGRATOR_KUBECONFIG": kubesim_session.kubeconfig,
            "STORAGE_MIGRATOR_WRITE_RATE_PER_SECOND": "500",
            # The real thing: one write budget shared by every run, in the cluster (issue 37: Leases).
            "STORAGE_MIGRATOR_SHARED_WRITE_BUDGET": "true",
        },
    )
    try:
        stack.start_server()
        stack.deploy()
        paused_detection(stack)
        stack.start_worker(queues=(STACK_QUEUE,))
        yield stack
    finally:
        stack.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """test_image.py then test_scale_out.py last (see LATE and LAST); the others in their order."""
    items.sort(key=lambda item: (item.path.name in LAST, item.path.name in LATE))


def pytest_collection_finish(session: pytest.Session) -> None:
    """The image's build started now, in the background, if a test of it is to run."""
    if any(item.path.name == "test_image.py" for item in session.items):
        image_build.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    image_build.stop()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """`item.rep_setup`, `item.rep_call`: whether the test failed, for fixtures that keep
    evidence when it did (test_ui.py's screenshots)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
