"""What every task of ours shares: how it connects, and that nothing it sees is kept.

Design decision (DESIGN 8, PREFECT.md "Secrets and results"): a task that may
see object bodies must never persist or cache its inputs or result, so every
task is declared with `NO_CACHE` and `persist_result=False`, whatever the
Prefect defaults are on the machine that runs it.
"""

from __future__ import annotations

from typing import Any

from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from storage_migrator.kube.connection import connected
from storage_migrator.kube.errors import KubeError, is_retriable, is_settling_answer

__all__ = ["PRIVATE", "REQUEST_RETRIES", "connected", "transient_or_settling"]

#: Keyword arguments of every @task: no cache key (inputs are never hashed), no persisted result.
PRIVATE: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}


def transient_or_settling(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a task whose request met a transient answer or a restarting API server.

    An API server restarts during every upgrade, which is when migrations run; for
    a few seconds after it starts it answers 403 to what it allows a moment later
    (issue 9). Each retried task is idempotent (a read, a status write of the same
    values). Anything else, a verdict about the migration included, is final.
    """
    try:
        state.result()
    except KubeError as exc:
        return is_retriable(exc) or is_settling_answer(exc)
    except Exception:  # noqa: BLE001 - not a request failure: not ours to retry
        return False
    return False


#: Keyword arguments of the tasks that read or write our own objects around a migration:
#: 5 retries 1, 2, 4, 8 and 16 s apart (with jitter) outlast an API server restart.
REQUEST_RETRIES: dict[str, Any] = {
    "retries": 5,
    "retry_delay_seconds": exponential_backoff(backoff_factor=1),
    "retry_jitter_factor": 0.5,
    "retry_condition_fn": transient_or_settling,
}
