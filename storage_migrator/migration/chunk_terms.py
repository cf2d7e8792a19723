"""The terms of one chunk: what it is asked (options), what it answers (counters and
tokens, never an object), and what ends the whole migration (DESIGN 4.5, 8).

Shared by the chunk (:mod:`storage_migrator.migration.chunks`), the tasks that run
it, the ledger that records its result and the RBAC that depends on its write mode.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.models import MigrationProgress, ObjectFailure

__all__ = [
    "ChunkOptions",
    "ChunkResult",
    "MigrationAborted",
    "Outcome",
    "WriteMode",
    "add_progress",
]

Outcome = Literal["rewritten", "unchanged", "gone", "conflicted", "failed"]
WriteMode = Literal["patch", "put"]


class MigrationAborted(Exception):
    """The migration cannot go on (resource gone, not writable, LIST failing); the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (MigrationAborted, (self.reason, self.message))


class ChunkOptions(BaseModel):
    """How to migrate a chunk; built from the settings by the flow."""

    model_config = ConfigDict(frozen=True)

    limit: int = Field(default=500, ge=1, description="Objects per LIST page.")
    write_mode: WriteMode = Field(default="patch", description="Merge patch, or PUT as read (fallback).")
    write_concurrency: int = Field(default=8, ge=1, description="Writes in flight at once.")
    max_write_attempts: int = Field(default=6, ge=1, description="Attempts per object for transient answers.")
    max_list_attempts: int = Field(default=6, ge=1, description="Attempts per LIST for transient answers.")
    backoff_base_seconds: float = Field(default=0.5, gt=0)
    backoff_max_seconds: float = Field(default=30.0, gt=0)
    request_timeout_seconds: float = Field(default=60.0, gt=0)
    settle_window_seconds: float = Field(
        default=60.0, ge=0, description="A 401/403 this soon after a connection error or 5xx is the server settling."
    )
    settle_timeout_seconds: float = Field(
        default=120.0, ge=0, description="Longest wait for a settling server, per request (not counted as attempts)."
    )


class ChunkResult(BaseModel):
    """What one chunk did: counters and tokens, never object contents."""

    model_config = ConfigDict(frozen=True)

    token_in: str | None = Field(description="The continue token the chunk started from (None: the beginning).")
    token_out: str | None = Field(description="The token of the next chunk; None when the LIST is complete.")
    listed: int = 0
    rewritten: int = 0
    unchanged: int = 0
    gone: int = 0
    conflicted: int = 0
    failed: int = 0
    failures: list[ObjectFailure] = Field(default_factory=list, description="The first failed objects.")
    remaining_item_count: int | None = None
    list_resource_version: str = Field(
        default="", description="The list resourceVersion of the page this chunk wrote (its LIST's snapshot)."
    )
    relisted: int = Field(default=0, description="LISTs answered 410 and re-issued.")
    retries: int = Field(default=0, description="Transient answers retried (LIST and writes).")
    settle_waits: int = Field(default=0, description="401/403 answers of a settling server waited out.")
    second_tries: int = Field(default=0, description="Failed objects tried once more at the end of the chunk.")
    bytes_received: int = 0

    @property
    def pass_resource_version(self) -> str | None:
        """The list resourceVersion a pass records (status.resourceVersion, issue 36): the first
        chunk's, the one that began from no token; None for every later chunk."""
        return (self.list_resource_version or None) if self.token_in is None else None


def add_progress(progress: MigrationProgress, chunk: ChunkResult) -> MigrationProgress:
    """The progress after one more settled chunk."""
    return MigrationProgress(
        listed=progress.listed + chunk.listed,
        rewritten=progress.rewritten + chunk.rewritten,
        unchanged=progress.unchanged + chunk.unchanged,
        gone=progress.gone + chunk.gone,
        conflicted=progress.conflicted + chunk.conflicted,
        failed=progress.failed + chunk.failed,
        chunks=progress.chunks + 1,
        remaining_item_count=chunk.remaining_item_count,
    )
