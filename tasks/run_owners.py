"""Which requests' claiming flow runs Prefect shows ended (issue 31).

A run claims its request as it starts (`OWNER_ANNOTATION`) and holds its lease while it
lives. When the Prefect server knows the run ended (a worker reported it Crashed after
its process died, it failed on an outage) while the request still shows a live lease,
nothing writes for that request: the dispatcher resumes it at once, and the budget's
healer does not count it as a writer.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from storage_migrator.migration.dispatch import lease_owners
from storage_migrator.models import StorageVersionMigration

__all__ = ["ended_owners"]


def ended_owners(client: Any, migrations: Sequence[StorageVersionMigration], *,
                 lease_seconds: float) -> dict[str, str]:  # fmt: skip
    """Request name -> the final state's name of its claiming run, for the requests whose live
    lease a run holds that Prefect shows ended. A run Prefect cannot tell about (unreachable,
    deleted, a claim that is no flow run id) is not known dead: its lease holds."""
    ended: dict[str, str] = {}
    for name, owner in lease_owners(migrations, now=datetime.now(UTC), lease_seconds=lease_seconds).items():
        try:
            state = client.read_flow_run(UUID(owner)).state
        except Exception:  # noqa: BLE001 - not known dead: its lease holds
            continue
        if state is not None and state.is_final():
            ended[name] = str(state.name)
    return ended
