"""devstack.ui (issue 23): the check that a local Prefect server's UI would reach its API,
against a stand-in for the server's `/ui-settings` and page on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from devstack.ui import UiNotReady, ui_server_settings, wait_for_ui


class _Ui(BaseHTTPRequestHandler):
    api_url = ""
    page = "<html><head><title>Prefect Server</title></head></html>"

    def do_GET(self) -> None:
        if self.path == "/ui-settings":
            body, kind = json.dumps({"api_url": self.api_url, "default_ui": "v2"}).encode(), "application/json"
        else:
            body, kind = self.page.encode(), "text/html"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def ui() -> Iterator[tuple[str, type[_Ui]]]:
    handler = type("Ui", (_Ui,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_a_ui_that_names_its_own_api_is_ready(ui: tuple[str, type[_Ui]]) -> None:
    url, handler = ui
    handler.api_url = f"{url}/api"
    wait_for_ui(url, f"{url}/api", timeout=5)


def test_a_ui_that_calls_port_4200_is_refused_at_once_naming_the_setting(ui: tuple[str, type[_Ui]]) -> None:
    """What `prefect server start --port P` answered before issue 23."""
    url, handler = ui
    handler.api_url = "http://127.0.0.1:4200/api"
    with pytest.raises(UiNotReady, match=r"4200/api.*PREFECT_UI_API_URL"):
        wait_for_ui(url, f"{url}/api", timeout=30)


def test_a_server_without_its_page_is_not_ready(ui: tuple[str, type[_Ui]]) -> None:
    url, handler = ui
    handler.api_url, handler.page = f"{url}/api", '{"detail":"Not Found"}'
    with pytest.raises(UiNotReady, match="without its page"):
        wait_for_ui(url, f"{url}/api", timeout=5)


def test_nothing_listening_is_waited_for_then_reported() -> None:
    with pytest.raises(UiNotReady, match="did not answer within 1 s"):
        wait_for_ui("http://127.0.0.1:9", "http://127.0.0.1:9/api", timeout=1)


def test_the_server_settings_name_one_address_for_the_api_the_ui_and_the_links() -> None:
    assert ui_server_settings(host="127.0.0.1", port=43123) == {
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": "43123",
        "PREFECT_UI_API_URL": "http://127.0.0.1:43123/api",
        "PREFECT_UI_URL": "http://127.0.0.1:43123",
    }
