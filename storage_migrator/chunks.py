"""Migrating one chunk of one resource: a LIST page, then a no-op write of each item.

Design decision (DESIGN 4.5, seed 002 "Alpha workflow"): the unit of work, of
retry and of checkpointing is the chunk. `migrate_chunk` LISTs one page from a
continue token (metadata only), rewrites every item with a conditional merge
patch (or, where the API serves no patch, a PUT of the object exactly as
listed), settles each item into one outcome of the DESIGN 4.5 table, and
returns counters and the next token only: never an object body (DESIGN 8).

What ends a whole migration is raised (`MigrationAborted`): the resource is no
longer served (404 on the LIST), cannot be written at all (405), or the LIST
keeps failing after bounded retries. Everything about one object is settled
inside the chunk: a 404 or 409 is fine, transient answers are retried with
backoff (server hints win), anything else is recorded as a failure with the
object's name and the API's reason, and the chunk goes on (upstream issue #83:
no endless retries).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from kubernetes.client import ApiClient
from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.backoff import retry_delay
from storage_migrator.kube.errors import (
    Conflict,
    Expired,
    KubeError,
    MethodNotAllowed,
    NotFound,
    is_retriable,
)
from storage_migrator.kube.listing import ListPage, list_page
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.writing import WriteResult, rewrite_with_patch, rewrite_with_put
from storage_migrator.models import MAX_RECORDED_FAILURES, MigrationProgress, ObjectFailure
from storage_migrator.pacing import NoPacing, Pacer

__all__ = [
    "ChunkOptions",
    "ChunkResult",
    "MigrationAborted",
    "Outcome",
    "WriteMode",
    "add_progress",
    "migrate_chunk",
]

Outcome = Literal["rewritten", "unchanged", "gone", "conflicted", "failed"]
WriteMode = Literal["patch", "put"]

#: A chunk LIST that keeps answering 410 without progress is restarted at most this often.
MAX_EXPIRED_RELISTS = 5


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
    relisted: int = Field(default=0, description="LISTs answered 410 and re-issued.")
    retries: int = Field(default=0, description="Transient answers retried (LIST and writes).")
    bytes_received: int = 0


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


class _Tally:
    """Thread-safe counters of one chunk."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {"rewritten": 0, "unchanged": 0, "gone": 0, "conflicted": 0, "failed": 0}
        self.failures: list[ObjectFailure] = []
        self.retries = 0
        self.bytes = 0

    def settle(self, outcome: Outcome, failure: ObjectFailure | None = None, *, size: int = 0) -> None:
        with self.lock:
            self.counts[outcome] += 1
            self.bytes += size
            if failure is not None and len(self.failures) < MAX_RECORDED_FAILURES:
                self.failures.append(failure)

    def retried(self) -> None:
        with self.lock:
            self.retries += 1


def _list(
    api: ApiClient,
    ref: ResourceRef,
    token: str | None,
    options: ChunkOptions,
    sleep: Callable[[float], None],
    tally: _Tally,
) -> tuple[ListPage, int]:
    relisted = 0
    attempt = 0
    while True:
        try:
            page = list_page(
                api, ref, limit=options.limit, continue_token=token,
                metadata_only=options.write_mode == "patch", timeout=options.request_timeout_seconds,
            )  # fmt: skip
            return page, relisted
        except Expired as exc:
            # A 410 with a token continues inconsistently from the same key; without
            # one the LIST restarts (objects re-done are only "unchanged", none skipped).
            relisted += 1
            if relisted > MAX_EXPIRED_RELISTS:
                raise MigrationAborted("ListExpired", f"LIST {ref} kept answering 410 Expired: {exc.message}") from exc
            token = exc.continue_token
        except NotFound as exc:
            raise MigrationAborted(
                "ResourceNotServed", f"resource no longer served: LIST {ref} answered 404 ({exc.message})"
            ) from exc
        except KubeError as exc:
            if not is_retriable(exc):
                raise MigrationAborted(
                    "ListFailed", f"LIST {ref} failed: {exc.code} {exc.reason}: {exc.message}"
                ) from exc
            attempt += 1
            if attempt >= options.max_list_attempts:
                raise MigrationAborted(
                    "ListFailed",
                    f"LIST {ref} failed {attempt} times, last: {exc.code} {exc.reason}: {exc.message}",
                ) from exc
            tally.retried()
            sleep(retry_delay(exc, attempt=attempt - 1, base=options.backoff_base_seconds,
                              cap=options.backoff_max_seconds))  # fmt: skip


def _put_body(page: ListPage, item: dict[str, Any], ref: ResourceRef) -> bytes:
    # Items of a full LIST carry no apiVersion/kind; the object is otherwise sent as read.
    kind = page.kind[: -len("List")] if page.kind.endswith("List") else page.kind
    return json.dumps({"apiVersion": ref.api_version, "kind": kind, **item}, separators=(",", ":")).encode()


def _write_one(
    api: ApiClient,
    ref: ResourceRef,
    page: ListPage,
    item: dict[str, Any],
    options: ChunkOptions,
    before_write: Callable[[], None],
    sleep: Callable[[float], None],
    tally: _Tally,
    stop: threading.Event,
) -> None:
    meta = item.get("metadata") or {}
    name = str(meta.get("name", ""))
    namespace = meta.get("namespace") or None
    attempt = 0
    while True:
        if stop.is_set():
            return
        before_write()
        try:
            result: WriteResult
            if options.write_mode == "patch":
                result = rewrite_with_patch(
                    api, ref, name=name, namespace=namespace, resource_version=str(meta.get("resourceVersion", "")),
                    timeout=options.request_timeout_seconds,
                )  # fmt: skip
            else:
                result = rewrite_with_put(
                    api, ref, body=_put_body(page, item, ref), timeout=options.request_timeout_seconds
                )
            tally.settle("rewritten" if result.rewritten else "unchanged", size=result.response_bytes)
            return
        except NotFound:
            tally.settle("gone")  # deleted since the LIST: nothing to migrate
            return
        except Conflict:
            tally.settle("conflicted")  # written since the LIST: that write re-encoded it
            return
        except MethodNotAllowed as exc:
            stop.set()
            raise MigrationAborted(
                "MethodNotAllowed", f"{ref} cannot be written ({exc.what}: 405 {exc.message})"
            ) from exc
        except KubeError as exc:
            if is_retriable(exc) and attempt + 1 < options.max_write_attempts:
                tally.retried()
                sleep(retry_delay(exc, attempt=attempt, base=options.backoff_base_seconds,
                                  cap=options.backoff_max_seconds))  # fmt: skip
                attempt += 1
                continue
            tally.settle(
                "failed",
                ObjectFailure(namespace=namespace, name=name, code=exc.code, reason=exc.reason,
                              message=exc.message[:300]),
            )  # fmt: skip
            return


def migrate_chunk(
    api: ApiClient,
    ref: ResourceRef,
    *,
    continue_token: str | None,
    options: ChunkOptions,
    pacer: Pacer | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> ChunkResult:
    """LIST one page from `continue_token` and settle every item in it.

    The shared write budget is taken here, on the caller's thread, a batch at a
    time before the batch's writes are queued; the writing threads only pace.
    """
    pace = pacer or NoPacing()
    tally = _Tally()
    page, relisted = _list(api, ref, continue_token, options, sleep, tally)
    stop = threading.Event()
    items: list[dict[str, Any]] = page.items
    with ThreadPoolExecutor(max_workers=options.write_concurrency, thread_name_prefix="rewrite") as pool:
        futures = []
        for i, item in enumerate(items):
            if stop.is_set():
                break
            if i % pace.batch == 0:
                pace.admit(min(pace.batch, len(items) - i))
            futures.append(
                pool.submit(_write_one, api, ref, page, item, options, pace.before_write, sleep, tally, stop)
            )
        errors = [f.exception() for f in futures]
    aborted = next((e for e in errors if isinstance(e, MigrationAborted)), None)
    if aborted is not None:
        raise aborted
    unexpected = next((e for e in errors if e is not None), None)
    if unexpected is not None:
        raise unexpected
    counts = tally.counts
    return ChunkResult(
        token_in=continue_token,
        token_out=page.continue_token,
        listed=len(page.items),
        rewritten=counts["rewritten"],
        unchanged=counts["unchanged"],
        gone=counts["gone"],
        conflicted=counts["conflicted"],
        failed=counts["failed"],
        failures=list(tally.failures),
        remaining_item_count=page.remaining_item_count,
        relisted=relisted,
        retries=tally.retries,
        bytes_received=page.response_bytes + tally.bytes,
    )
