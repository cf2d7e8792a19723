"""The Prefect flows of storage-migrator (DESIGN 3: orchestration only).

An empty `PREFECT_API_URL` means "no server" here (issue 12, item 5). Prefect
disagrees with itself about it: the flow engine takes it for unset and starts
a temporary server, while the events worker takes it for a server at "" and
fails to start (`ValueError: api_url must be provided`), again for every event
(`Service 'EventsWorker' failed`, `RuntimeError: Cannot put items in a stopped
service instance`), so no event, and no task run, reaches the temporary
server. `export PREFECT_API_URL=` is a natural way to "turn the server off";
importing our flows removes the empty variable, and when Prefect has already
read its settings, has it read the environment again
(`prefect.context.refresh_global_settings_context`, the call Prefect itself
makes after its plugins change the environment).
"""

from __future__ import annotations

import os
import sys


def _forget_empty_api_url() -> None:
    if os.environ.get("PREFECT_API_URL") != "":
        return
    del os.environ["PREFECT_API_URL"]
    if "prefect.context" in sys.modules:
        from prefect.context import refresh_global_settings_context

        refresh_global_settings_context()


_forget_empty_api_url()
