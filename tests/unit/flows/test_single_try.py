"""`single_try` (tasks/single_try.py) and `best_effort` (flows/best_effort.py): the calls a
migration can do without are sent once (issue 31), in the settings otherwise in force."""

from __future__ import annotations

import logging
import socket

import pytest
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, get_current_settings, temporary_settings

from flows.best_effort import best_effort
from tasks.single_try import single_try


def test_inside_the_block_the_client_retries_nothing_and_keeps_every_other_setting() -> None:
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:1/api", PREFECT_CLIENT_MAX_RETRIES: 4}):
        with single_try():
            assert PREFECT_CLIENT_MAX_RETRIES.value() == 0
            assert PREFECT_API_URL.value() == "http://127.0.0.1:1/api"
        assert PREFECT_CLIENT_MAX_RETRIES.value() == 4


def test_the_settings_made_once_follow_a_change_of_the_settings_in_force() -> None:
    """Made once per settings object (the CPU it saves), never the settings of another block."""
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:1/api"}):
        with single_try():
            first = get_current_settings()
        with single_try():
            assert get_current_settings() is first
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:2/api"}), single_try():
        assert PREFECT_API_URL.value() == "http://127.0.0.1:2/api"
        assert PREFECT_CLIENT_MAX_RETRIES.value() == 0


def test_a_best_effort_call_to_a_server_that_is_not_there_fails_at_once_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the default retries (2 + 4 + 8 + 16 + 32 s) this call would take a minute."""
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    unreachable = {PREFECT_API_URL: f"http://127.0.0.1:{port}/api", PREFECT_CLIENT_MAX_RETRIES: 5}
    with (
        temporary_settings(unreachable),
        caplog.at_level(logging.WARNING),
        best_effort("the progress artifact"),
        get_client(sync_client=True) as client,
    ):
        client.read_flow_runs(limit=1)
    [record] = [r for r in caplog.records if "could not update the progress artifact" in r.getMessage()]
    assert "the migration goes on" in record.getMessage()
