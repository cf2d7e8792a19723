"""The Prefect API as the command line reaches it, and the one way it says why it could not (issue 30).

A Prefect server started with PREFECT_SERVER_API_AUTH_STRING (Prefect's basic auth, on
wherever we start a server) answers 401 to every call without the same string, which a
client sends from PREFECT_API_AUTH_STRING; Prefect's client then raises an HTTP error of
three lines that names neither setting, and Prefect's own CLI a stack trace. Every command
that reads or writes the Prefect workspace goes through here: the blocks and the recorded
clusters (clusters.py), the fleet's deployments (fleet.py) and ``check-prefect``, the check
our worker runs before it starts. So a 401 is one line that names the setting, whichever
command met it. Prefect is imported inside the functions: it is slow to import, and most
commands never need it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient

__all__ = ["PrefectApiError", "api_url", "prefect_client", "prefect_failure"]

#: The settings of Prefect's basic auth: every client's, and the server's.
CLIENT_SETTING = "PREFECT_API_AUTH_STRING"
SERVER_SETTING = "PREFECT_SERVER_API_AUTH_STRING"


class PrefectApiError(Exception):
    """The Prefect API could not be used; the message says which server and what to set."""


def api_url() -> str:
    """The Prefect API this process talks to (PREFECT_API_URL), "" when none is set."""
    from prefect.settings import PREFECT_API_URL

    return str(PREFECT_API_URL.value() or "")


def prefect_failure(exc: BaseException) -> str | None:
    """One line saying why the Prefect API refused this process, when that is what `exc` is
    (a 401 anywhere in its chain of causes); None for any other failure."""
    import httpx
    from prefect.settings import PREFECT_API_AUTH_STRING

    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, httpx.HTTPStatusError) and cause.response.status_code == 401:
            where = api_url() or str(cause.request.url)
            if PREFECT_API_AUTH_STRING.value():
                return (f"the Prefect API at {where} refused our credentials (401 Unauthorized): {CLIENT_SETTING} "
                        f"is set but is not the server's {SERVER_SETTING}; set it to the server's string "
                        "(user:password; after a rotation, the new one)")  # fmt: skip
            return (f"the Prefect API at {where} asks for credentials (401 Unauthorized): set {CLIENT_SETTING} "
                    f"to the server's {SERVER_SETTING} (user:password)")  # fmt: skip
        cause = cause.__cause__ or cause.__context__
    return None


@contextmanager
def prefect_client() -> Iterator[SyncPrefectClient]:
    """Prefect's client of PREFECT_API_URL (with PREFECT_API_AUTH_STRING); a 401 met inside the
    block is a PrefectApiError naming the setting, every other failure goes through unchanged."""
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            yield client
    except Exception as exc:
        refused = prefect_failure(exc)
        if refused is None:
            raise
        raise PrefectApiError(refused) from exc
