"""The e2e tier's shared server: `prefect.yaml` deployed on a real Prefect server
(on PostgreSQL, issue 13: the documented choice for a shared server) with a process
worker, against the session's kubesim.

test_deployments.py runs the deployments on it; test_ui.py (issue 23) opens the UI
of the same server in a browser, so the browser tests start no server of their own.
The tests that use it run last in the session: its worker and its 10-minute
detection schedule then run beside no other test's server and workers
(test_scale_out.py counts every write to the cluster, test_schedule.py every
detection poll).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import pytest

from devstack import PrefectStack
from devstack.postgres import start_postgres

SHARED = "deployed_stack"


@pytest.fixture(scope="session")
def deployed_stack(kubesim_session: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectStack]:
    """`prefect deploy --all` on a server of its own (PostgreSQL), and one process worker."""
    postgres = start_postgres()
    stack = PrefectStack(
        tmp_path_factory.mktemp("prefect-home"),
        server_env={"PREFECT_API_DATABASE_CONNECTION_URL": postgres.url},
        worker_env={
            "STORAGE_MIGRATOR_KUBECONFIG": kubesim_session.kubeconfig,
            "STORAGE_MIGRATOR_WRITE_RATE_PER_SECOND": "500",
            # The real thing: one write budget shared through the server.
            "STORAGE_MIGRATOR_SHARED_WRITE_BUDGET": "true",
        },
    )
    try:
        stack.start_server()
        stack.deploy()
        stack.start_worker()
        yield stack
    finally:
        stack.stop()
        postgres.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The shared server's tests last, in their order (see the module docstring)."""
    items.sort(key=lambda item: SHARED in getattr(item, "fixturenames", ()))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """`item.rep_setup`, `item.rep_call`: whether the test failed, for fixtures that keep
    evidence when it did (test_ui.py's screenshots)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
