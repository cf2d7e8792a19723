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

A restarting API server denies (401/403) what it allows a moment later: such
answers are waited out (`storage_migrator.migration.settling` holds the policy). And
before a chunk's result (so its checkpoint) is produced, every object that
ended `failed` is tried once more, after `/readyz` answers 200 (bounded): only
what still fails is `failed`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from kubernetes.client import ApiClient

from storage_migrator.kube.errors import (
    RBAC_FIX,
    Conflict,
    Expired,
    Forbidden,
    KubeError,
    MethodNotAllowed,
    NotFound,
    is_retriable,
)
from storage_migrator.kube.health import READYZ_TIMEOUT_SECONDS, is_ready
from storage_migrator.kube.listing import ListPage, list_page
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.writing import WriteResult, rewrite_with_patch, rewrite_with_put
from storage_migrator.migration.backoff import retry_delay
from storage_migrator.migration.chunk_terms import (
    ChunkOptions,
    ChunkResult,
    MigrationAborted,
    Outcome,
)
from storage_migrator.migration.failures import answer_summary, object_failure
from storage_migrator.migration.lookahead import PageAhead
from storage_migrator.migration.pacing import NoPacing, Pacer
from storage_migrator.migration.settling import RetryStep, ServerTrouble, retry_step
from storage_migrator.models import MAX_RECORDED_FAILURES, ObjectFailure

__all__ = ["migrate_chunk"]

#: A chunk LIST that keeps answering 410 without progress is restarted at most this often.
MAX_EXPIRED_RELISTS = 5


class _Tally:
    """Thread-safe counters of one chunk."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {"rewritten": 0, "unchanged": 0, "gone": 0, "conflicted": 0, "failed": 0}
        self.failures: list[ObjectFailure] = []
        self.retries = 0
        self.settle_waits = 0
        self.bytes = 0

    def settle(self, outcome: Outcome, failure: ObjectFailure | None = None, *, size: int = 0) -> None:
        with self.lock:
            self.counts[outcome] += 1
            self.bytes += size
            if failure is not None and len(self.failures) < MAX_RECORDED_FAILURES:
                self.failures.append(failure)

    def retried(self, step: RetryStep = "retry") -> None:
        with self.lock:
            if step == "settle":
                self.settle_waits += 1
            else:
                self.retries += 1


@dataclass(frozen=True)
class _Context:
    """What every request of one chunk needs (shared by the writer threads)."""

    api: ApiClient
    ref: ResourceRef
    options: ChunkOptions
    sleep: Callable[[float], None]
    tally: _Tally
    trouble: ServerTrouble

    def server_settling(self) -> bool:
        """Recent trouble, or `/readyz` failing now (remembered, so other threads skip the probe)."""
        if self.trouble.recent():
            return True
        if is_ready(self.api, timeout=min(self.options.request_timeout_seconds, READYZ_TIMEOUT_SECONDS)):
            return False
        self.trouble.note()
        return True

    def next_step(self, exc: KubeError, *, attempt: int, max_attempts: int, settled_for: float) -> RetryStep:
        self.trouble.saw(exc)
        return retry_step(exc, attempt=attempt, max_attempts=max_attempts, settled_for=settled_for,
                          settle_timeout=self.options.settle_timeout_seconds,
                          server_settling=self.server_settling)  # fmt: skip

    def wait(self, exc: KubeError, step: RetryStep, *, attempt: int) -> float:
        """Back off before sending again; the seconds waited."""
        self.tally.retried(step)
        delay = retry_delay(exc, attempt=attempt, base=self.options.backoff_base_seconds,
                            cap=self.options.backoff_max_seconds)  # fmt: skip
        self.sleep(delay)
        return delay

    def await_ready(self) -> None:
        """Wait (bounded by the settle budget) until `/readyz` answers 200."""
        waited, attempt = 0.0, 0
        while waited < self.options.settle_timeout_seconds and not is_ready(
            self.api, timeout=min(self.options.request_timeout_seconds, READYZ_TIMEOUT_SECONDS)
        ):
            delay = min(self.options.backoff_max_seconds, self.options.backoff_base_seconds * 2.0 ** min(attempt, 64))
            self.sleep(delay)
            waited += delay
            attempt += 1


def _list(ctx: _Context, token: str | None) -> tuple[ListPage, int]:
    ref, options = ctx.ref, ctx.options
    relisted = 0
    attempt = 0
    settled_for = 0.0
    settles = 0
    while True:
        try:
            page = list_page(
                ctx.api, ref, limit=options.limit, continue_token=token,
                metadata_only=options.write_mode == "patch", timeout=options.request_timeout_seconds,
            )  # fmt: skip
            return page, relisted
        except Expired as exc:
            # A 410 with a token continues inconsistently from the same key; without
            # one the LIST restarts (objects re-done are only "unchanged", none skipped).
            relisted += 1
            if relisted > MAX_EXPIRED_RELISTS:
                raise MigrationAborted(
                    "ListExpired", f"LIST {ref} kept answering 410 Expired ({MAX_EXPIRED_RELISTS} re-LISTs)"
                ) from exc
            token = exc.continue_token
        except NotFound as exc:
            raise MigrationAborted(
                "ResourceNotServed", f"resource no longer served: LIST {ref} answered {answer_summary(exc)}"
            ) from exc
        except KubeError as exc:
            step = ctx.next_step(exc, attempt=attempt, max_attempts=options.max_list_attempts, settled_for=settled_for)
            if step == "fail":
                tries = f"{attempt + 1} times" if is_retriable(exc) else "for good"
                fix = f" ({RBAC_FIX})" if isinstance(exc, Forbidden) and exc.permission else ""
                raise MigrationAborted(
                    "ListFailed", f"LIST {ref} failed {tries}, last: {answer_summary(exc)}{fix}"
                ) from exc
            if step == "settle":
                settled_for += ctx.wait(exc, step, attempt=settles)
                settles += 1
            else:
                ctx.wait(exc, step, attempt=attempt)
                attempt += 1


def _put_body(page: ListPage, item: dict[str, Any], ref: ResourceRef) -> bytes:
    # Items of a full LIST carry no apiVersion/kind; the object is otherwise sent as read.
    kind = page.kind[: -len("List")] if page.kind.endswith("List") else page.kind
    return json.dumps({"apiVersion": ref.api_version, "kind": kind, **item}, separators=(",", ":")).encode()


@dataclass(frozen=True)
class _Settled:
    """One object's outcome (and, when failed, why: names and the API's reason only)."""

    outcome: Outcome
    failure: ObjectFailure | None = None
    size: int = 0


def _write_one(
    ctx: _Context,
    page: ListPage,
    item: dict[str, Any],
    pacer: Pacer,
    stop: threading.Event,
    *,
    last_try: bool = False,
) -> _Settled | None:
    """Write one item until it settles; None when the chunk was stopped first.

    `last_try`: the end-of-chunk retry of a failed object, a single request.
    """
    ref, options = ctx.ref, ctx.options
    meta = item.get("metadata") or {}
    name = str(meta.get("name", ""))
    namespace = meta.get("namespace") or None
    attempt = 0
    settled_for = 0.0
    settles = 0
    while True:
        if stop.is_set():
            return None
        pacer.before_write()
        try:
            result: WriteResult
            try:
                if options.write_mode == "patch":
                    result = rewrite_with_patch(
                        ctx.api, ref, name=name, namespace=namespace,
                        resource_version=str(meta.get("resourceVersion", "")), timeout=options.request_timeout_seconds,
                    )  # fmt: skip
                else:
                    result = rewrite_with_put(
                        ctx.api, ref, body=_put_body(page, item, ref), timeout=options.request_timeout_seconds
                    )
            finally:
                pacer.after_write()  # the answer is in (or none will come): the budget counts it from now
            return _Settled("rewritten" if result.rewritten else "unchanged", size=result.response_bytes)
        except NotFound:
            return _Settled("gone")  # deleted since the LIST: nothing to migrate
        except Conflict:
            return _Settled("conflicted")  # written since the LIST: that write re-encoded it
        except MethodNotAllowed as exc:
            stop.set()
            raise MigrationAborted(
                "MethodNotAllowed", f"{ref} cannot be written ({exc.what}: {answer_summary(exc)})"
            ) from exc
        except KubeError as exc:
            step: RetryStep = "fail"
            if not last_try:
                step = ctx.next_step(
                    exc, attempt=attempt, max_attempts=options.max_write_attempts, settled_for=settled_for
                )
            if step == "settle":
                settled_for += ctx.wait(exc, step, attempt=settles)
                settles += 1
                continue
            if step == "retry":
                ctx.wait(exc, step, attempt=attempt)
                attempt += 1
                continue
            # Issue 12 item 6: name, code, reason and field paths; never the message.
            return _Settled("failed", object_failure(namespace=namespace, name=name, exc=exc))


def _write_all(
    pool: ThreadPoolExecutor,
    ctx: _Context,
    page: ListPage,
    items: list[dict[str, Any]],
    pace: Pacer,
    stop: threading.Event,
    *,
    last_try: bool = False,
) -> list[_Settled | None]:
    """Write `items` on the pool, each write paced by `pace` on its writing thread."""
    futures = []
    for item in items:
        if stop.is_set():
            break
        futures.append(pool.submit(_write_one, ctx, page, item, pace, stop, last_try=last_try))
    errors = [f.exception() for f in futures]
    aborted = next((e for e in errors if isinstance(e, MigrationAborted)), None)
    if aborted is not None:
        raise aborted
    unexpected = next((e for e in errors if e is not None), None)
    if unexpected is not None:
        raise unexpected
    return [f.result() for f in futures]


def migrate_chunk(
    api: ApiClient,
    ref: ResourceRef,
    *,
    continue_token: str | None,
    options: ChunkOptions,
    pacer: Pacer | None = None,
    sleep: Callable[[float], None] = time.sleep,
    trouble: ServerTrouble | None = None,
    ahead: PageAhead | None = None,
) -> ChunkResult:
    """LIST one page from `continue_token` and settle every item in it.

    Each write waits for `pacer` on its writing thread (the run's share of the
    write budget: storage_migrator/migration/request_lease.py), which may also stop
    the chunk (a run that lost its request raises there, before its next write).
    Objects that fail are tried once more, after `/readyz` answers 200, before
    the result is returned (so a checkpoint never passes an object that a
    settling server failed). `trouble` may be shared across chunks (default: a
    memory of this chunk only).

    `ahead`, shared across the chunks of one migration: the page is taken from
    it when the previous chunk asked for it already, and the next page is asked
    for as soon as this one's token is known (metadata-only pages only; see
    `storage_migrator.migration.lookahead`), so the writers do not wait for a LIST.
    """
    pace = pacer or NoPacing()
    tally = _Tally()
    ctx = _Context(api=api, ref=ref, options=options, sleep=sleep, tally=tally,
                   trouble=trouble or ServerTrouble(window_seconds=options.settle_window_seconds))  # fmt: skip
    listed = ahead.take(continue_token) if ahead is not None else None
    page, relisted = listed if listed is not None else _list(ctx, continue_token)
    if ahead is not None and page.continue_token and options.write_mode == "patch":
        token_ahead, connect = page.continue_token, ahead.connect

        def fetch() -> tuple[ListPage, int]:
            if connect is None:
                return _list(ctx, token_ahead)
            own = connect()
            try:
                return _list(replace(ctx, api=own), token_ahead)
            finally:
                own.close()  # type: ignore[no-untyped-call]

        ahead.start(token_ahead, fetch)
    stop = threading.Event()
    items: list[dict[str, Any]] = page.items
    with ThreadPoolExecutor(max_workers=options.write_concurrency, thread_name_prefix="rewrite") as pool:
        settled = _write_all(pool, ctx, page, items, pace, stop)
        failed = [i for i, s in enumerate(settled) if s is not None and s.outcome == "failed"]
        if failed:
            ctx.await_ready()
            again = _write_all(pool, ctx, page, [items[i] for i in failed], pace, stop, last_try=True)
            for i, s in zip(failed, again, strict=False):
                settled[i] = s if s is not None else settled[i]
    for s in settled:
        if s is not None:
            tally.settle(s.outcome, s.failure, size=s.size)
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
        list_resource_version=page.resource_version,
        relisted=relisted,
        retries=tally.retries,
        settle_waits=tally.settle_waits,
        second_tries=len(failed),
        bytes_received=page.response_bytes + tally.bytes,
    )
