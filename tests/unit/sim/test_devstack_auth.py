"""devstack's auth strings (issue 30): a stack's server asks for one made for it, every client
process of the stack gets it, and the tests' direct calls send the header Prefect's client sends."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack import CLIENT_AUTH_SETTING, SERVER_AUTH_SETTING, PrefectStack, basic_auth_header


def test_a_stack_makes_its_own_string_and_its_clients_get_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Whatever the caller's environment holds (another server's string) is not this stack's.
    monkeypatch.setenv(CLIENT_AUTH_SETTING, "admin:another-servers")
    monkeypatch.setenv(SERVER_AUTH_SETTING, "admin:another-servers")
    one, two = PrefectStack(tmp_path / "one"), PrefectStack(tmp_path / "two")
    assert one.auth_string and two.auth_string and one.auth_string != two.auth_string
    user, _, password = one.auth_string.partition(":")
    assert user == "admin" and len(password) >= 32
    assert one.env[CLIENT_AUTH_SETTING] == one.auth_string
    assert SERVER_AUTH_SETTING not in one.env  # clients never hold the server's setting (a worker passes it on)
    assert PrefectStack(tmp_path, auth_string="ops:given").env[CLIENT_AUTH_SETTING] == "ops:given"
    with pytest.raises(ValueError, match="user:password"):
        PrefectStack(tmp_path, auth_string="no-colon")


def test_a_stack_without_auth_gives_its_clients_no_string(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CLIENT_AUTH_SETTING, "admin:another-servers")
    stack = PrefectStack(tmp_path, auth=False)
    assert stack.auth_string is None and stack.auth_header == {}
    assert CLIENT_AUTH_SETTING not in stack.env


def test_the_header_is_the_one_prefects_client_sends() -> None:
    from prefect.client.orchestration import SyncPrefectClient

    string = "admin:p@ss:with:colons"
    with SyncPrefectClient("http://127.0.0.1:9/api", auth_string=string) as client:
        sent = client._client.headers["Authorization"]
    assert basic_auth_header(string) == {"Authorization": sent}
