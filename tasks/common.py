"""What every task of ours shares: how it connects, and that nothing it sees is kept.

Design decision (DESIGN 8, PREFECT.md "Secrets and results"): a task that may
see object bodies must never persist or cache its inputs or result, so every
task is declared with `NO_CACHE` and `persist_result=False`, whatever the
Prefect defaults are on the machine that runs it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kubernetes.client import ApiClient
from prefect.cache_policies import NO_CACHE

from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.settings import Settings

#: Keyword arguments of every @task: no cache key (inputs are never hashed), no persisted result.
PRIVATE: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}


@contextmanager
def connected(settings: Settings) -> Iterator[ApiClient]:
    api = api_client_from_settings(settings)
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]
