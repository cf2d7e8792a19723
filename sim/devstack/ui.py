"""The Prefect UI of a local server: the settings that point it at the API the
server really serves, and the check that it does before anyone is sent there.

The UI is a single-page app that asks `GET /ui-settings` where the API is and
then talks to that address from the browser. Prefect (3.8, 3.9) answers with
`PREFECT_UI_API_URL`, which defaults to `PREFECT_API_URL` or else to
`http://{PREFECT_SERVER_API_HOST}:{PREFECT_SERVER_API_PORT}/api`; `prefect server
start --port P` changes neither setting, so a server on any port but 4200 sends
the browser to port 4200 and every page says "Can't connect to Server API"
(issue 23; ../shared/PREFECT.md). `PREFECT_UI_URL` is the address the server
puts in links (automations' notifications) and the CLI prints.
"""

from __future__ import annotations

import json
import time
import urllib.request

__all__ = ["UiNotReady", "ui_server_settings", "wait_for_ui"]


class UiNotReady(RuntimeError):
    """The UI does not answer, or would send the browser to another API than the served one."""


def ui_server_settings(*, host: str, port: int) -> dict[str, str]:
    """What `prefect server start --host HOST --port PORT` needs in its environment for
    its UI to reach its own API (and for its links to name its own address)."""
    return {
        "PREFECT_SERVER_API_HOST": host,
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_UI_API_URL": f"http://{host}:{port}/api",
        "PREFECT_UI_URL": f"http://{host}:{port}",
    }


def _get(url: str, *, accept: str) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=5) as resp:  # follows the UI's redirect to /v2/
        return int(resp.status), resp.read().decode(errors="replace")


def _check(ui_url: str, api_url: str) -> None:
    status, body = _get(f"{ui_url}/ui-settings", accept="application/json")
    served = json.loads(body).get("api_url") if status == 200 else None
    if served != api_url:
        raise UiNotReady(
            f"the Prefect UI at {ui_url} would call its API at {served!r}, not at {api_url!r} where the server "
            'answers: every page would say "Can\'t connect to Server API". Set PREFECT_UI_API_URL (devstack.ui).'
        )
    status, body = _get(f"{ui_url}/", accept="text/html")
    if status != 200 or "<title>Prefect" not in body:
        raise UiNotReady(f"the Prefect UI at {ui_url}/ answered {status} without its page")


def wait_for_ui(ui_url: str, api_url: str, *, timeout: float = 60) -> None:
    """Return once `ui_url` serves the UI's page and its `/ui-settings` names `api_url`.

    A wrong API address fails at once (waiting would not change it); a UI that
    does not answer yet is asked again until `timeout`.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            _check(ui_url, api_url)
            return
        except UiNotReady:
            raise
        except (OSError, ValueError) as exc:
            if time.monotonic() > deadline:
                raise UiNotReady(f"the Prefect UI at {ui_url} did not answer within {timeout:.0f} s: {exc}") from exc
        time.sleep(0.5)
