"""The in-tree engine of `migrate-resource`: kube-controller-manager writes; we order, gate, prove and record
(issue 36, item 2).

`in_tree_engine` is the one hook of flows/migrate_resource.py's `_run`, called once the
gates have passed (agreement, and for a key's request every API server on one
encryption configuration). On the client engine it only says so and hands the run back.
On the in-tree engine our request stays the record and the run:

1. marks the request Running (its lease and claim, as the client engine does) and says
   on it which engine runs it and why;
2. creates kube-controller-manager's object for the resource, named after the request
   (an earlier run's is adopted: our flow restarted mid-run), no writer's Lease and no
   write budget of ours: kcm paces itself (its `--kube-api-qps`);
3. watches it every `in_tree_poll_seconds`, checking the gates again each time;
4. ends with our own count (a metadata-only LIST), our request Succeeded or Failed, the
   ledger row (with the engine), the events and the outcome table.

What it does when things go wrong (docs/migrations.md, "The in-tree engine"):
- a gate lost mid-run (the servers no longer agree on the storage version, or on the
  encryption configuration): the in-tree object is deleted, the only stop its API has (no
  new scan, no Succeeded on it), and the request fails as the client engine's does; one
  new common version or configuration is a new pass: a new in-tree object
  (`<name>-pass2`), since Succeeded and Failed are terminal there;
- an in-tree object that Failed: the request Failed, quoting it; it is kept (kcm's record);
  a retry is a new request and so a new in-tree object (detection's back-off);
- kube-controller-manager restarted mid-run: nothing to do, it scans the migration again
  (no checkpoint; what it rewrote is newer than its resourceVersion and skipped);
- not picked up within `in_tree_pickup_seconds` (API served, controller off): deleted;
  `auto` falls back to the client engine and says so, `in-tree` fails naming the fix;
- our request deleted: the in-tree object is deleted too, the run Cancelled.
Whenever the request does not succeed, a CRD's storedVersions that kcm trimmed are put back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.client.schemas.objects import State
from prefect.runtime import flow_run
from prefect.states import Cancelled, Failed

from flows.best_effort import best_effort
from flows.events import emit_migration
from flows.server_config_gate import GateOutcome, check_configs
from storage_migrator.agreement.storage_versions import (
    AgreementMoment,
    AgreementVerdict,
    StorageVersionObservation,
    decide_agreement,
)
from storage_migrator.fleet.names import scoped_key
from storage_migrator.kube.in_tree import IN_TREE_KIND_NAME
from storage_migrator.ledger.recorder import RunRecorder
from storage_migrator.migration.chunk_terms import MigrationAborted
from storage_migrator.migration.engines import EngineChoice
from storage_migrator.migration.in_tree_runs import InTreeVerdict, judge_in_tree
from storage_migrator.migration.requests import MigrationCancelled
from storage_migrator.models import CONDITION_SUCCEEDED, MigrationProgress
from storage_migrator.settings import Settings
from tasks.in_tree import (
    InTreeOpened,
    choose_run_engine,
    count_in_tree,
    delete_in_tree,
    mark_engine,
    open_in_tree,
    put_back_stored_versions,
    watch_in_tree,
)
from tasks.migrating import (
    MigrationHandle,
    checkpoint,
    finish_migration,
    note_migration_step,
    restart_pass,
    start_migration,
)

if TYPE_CHECKING:
    from flows.migrate_resource import MigrationSummary

__all__ = ["in_tree_engine"]


class _NotPickedUp(Exception):
    """auto's fallback: kube-controller-manager did not pick the in-tree object up."""


def in_tree_engine(
    settings: Settings,
    handle: MigrationHandle,
    rec: RunRecorder,
    *,
    baseline: StorageVersionObservation | None,
    gate: GateOutcome | None,
) -> tuple[MigrationHandle, MigrationSummary | State[Any] | None]:
    """After the gates: the run on the in-tree engine to its end, or (None) the client engine's to run,
    with the handle saying which engine and why."""
    logger = get_run_logger()
    choice = choose_run_engine(settings, handle)
    if choice.refusal is not None:
        handle = handle.model_copy(update={"engine": "in-tree"})
        rec.engine = "in-tree"
        logger.error("%s: %s", handle.name, choice.refusal)
        return handle, _fail(settings, handle, rec, None, reason="InTreeUnavailable", message=choice.refusal)
    if choice.engine == "client":
        return _on_client(settings, handle, rec, note=choice.note), None
    handle = handle.model_copy(update={"engine": "in-tree", "engine_note": choice.note})
    rec.engine, rec.engine_note = "in-tree", choice.note
    run = _Run(settings=settings, handle=handle, rec=rec, choice=choice, baseline=baseline,
               config_hash=gate.configs.common_hash if gate is not None else None)  # fmt: skip
    try:
        return handle, run.to_the_end()
    except _NotPickedUp as exc:
        logger.warning("%s: %s; the client engine instead", handle.name, exc)
        note = f"engine auto: {exc}: the client engine"
        mark_engine(settings, handle, engine="client", note=note, unseen=True)
        return _on_client(settings, handle, rec, note=note, marked=True), None


def _on_client(settings: Settings, handle: MigrationHandle, rec: RunRecorder, *, note: str,
               marked: bool = False) -> MigrationHandle:  # fmt: skip
    """The client engine runs it; the request says so when the setting alone does not."""
    rec.engine, rec.engine_note = "client", note
    if note:
        get_run_logger().info("%s: %s", handle.name, note)
    if (settings.engine != "client" or note) and not marked:
        mark_engine(settings, handle, engine="client", note=note)
    return handle.model_copy(update={"engine": "client", "engine_note": note})


def _most_careful(*verdicts: AgreementVerdict) -> AgreementVerdict:
    """Abort over a new pass over going on (as migrate_resource's chunk loop combines its checks)."""
    return max(verdicts, key=lambda v: ("go", "rerun", "abort").index(v.action))


@dataclass
class _Run:
    """One request's run on the in-tree engine (the module docstring)."""

    settings: Settings
    handle: MigrationHandle
    rec: RunRecorder
    choice: EngineChoice
    baseline: StorageVersionObservation | None
    config_hash: str | None
    opened: InTreeOpened | None = None
    artifact: UUID | None = None
    shown: str = ""
    noted_at: float = 0.0

    @property
    def passes(self) -> int:
        return self.opened.passes if self.opened is not None else 1

    def to_the_end(self) -> MigrationSummary | State[Any]:
        logger = get_run_logger()
        try:
            start_migration(self.settings, self.handle, flow_run=str(flow_run.id) if flow_run.id else None,
                            config_hash=self.config_hash)  # fmt: skip
            mark_engine(self.settings, self.handle, engine="in-tree", note=self.choice.note)
            version = self.choice.in_tree_version or "v1"
            self.opened = open_in_tree(self.settings, self.handle, version=version, passes=None)
            logger.info("%s: %s %s/%s (pass %d)%s", self.handle.name, "watching" if self.opened.adopted else "created",
                        IN_TREE_KIND_NAME, self.opened.name, self.opened.passes,
                        ", left by an earlier run of the request" if self.opened.adopted else "")  # fmt: skip
            self._watch()
        except MigrationCancelled as exc:
            logger.warning("%s", exc)
            self.stop()
            self.rec.started(resumed=False)
            self.rec.ended("cancelled", MigrationProgress(), reason=exc.reason, message=str(exc), passes=self.passes)
            emit_migration("cancelled", migration=self.handle.name, group_resource=self.handle.group_resource,
                           progress=MigrationProgress(), message=str(exc), engine="in-tree")  # fmt: skip
            return Cancelled(message=str(exc))
        except MigrationAborted as exc:
            logger.warning("%s: %s", self.handle.name, exc.message)
            return _fail(self.settings, self.handle, self.rec, self, reason=exc.reason, message=exc.message)
        return self._succeeded()

    def stop(self, *, keep: bool = False) -> None:
        """The in-tree object deleted (unless `keep`: kcm's record of a Failed one) and a CRD's trimmed
        storedVersions put back: what a run that does not succeed leaves."""
        if self.opened is None:
            return
        if not keep:
            delete_in_tree(self.settings, self.opened)
        restored = put_back_stored_versions(self.settings, self.handle, self.opened)
        if restored is not None:
            get_run_logger().warning("%s: kube-controller-manager trimmed the CRD's status.storedVersions; put back "
                                     "%s (the migration did not succeed)", self.handle.name, restored)  # fmt: skip

    def _watch(self) -> None:
        """Until the in-tree object Succeeded under gates that held; raises what ends the run otherwise."""
        began = time.monotonic()
        while True:
            assert self.opened is not None
            seen = watch_in_tree(self.settings, self.handle, self.opened)
            verdict = judge_in_tree(seen.observed, name=self.opened.name, waited_seconds=time.monotonic() - began,
                                    pickup_seconds=self.settings.in_tree_pickup_seconds,
                                    timeout_seconds=self.settings.in_tree_timeout_seconds)  # fmt: skip
            self._show(verdict)
            self._judge_end(verdict)
            now, configs = seen.storage_version, seen.configs
            moment: AgreementMoment = "end" if verdict.step == "succeeded" else "chunk"
            gates = decide_agreement(resource=self.handle.group_resource, moment=moment, baseline=self.baseline,
                                     now=now, passes=self.passes)  # fmt: skip
            if configs is not None:
                gates = _most_careful(gates, check_configs(configs, moment=moment, baseline=self.config_hash,
                                                           passes=self.passes,
                                                           override=self.handle.skip_server_check))  # fmt: skip
            if gates.action == "abort":
                raise MigrationAborted(gates.reason, f"{gates.message} The in-tree migration "
                                                     f"{IN_TREE_KIND_NAME}/{self.opened.name} was deleted: no "
                                                     "new scan, and no Succeeded on it.")  # fmt: skip
            if gates.action == "rerun":
                get_run_logger().warning("%s", gates.message)
                if configs is not None and configs.common_hash is not None:
                    self.config_hash = self.rec.encryption_config_hash = configs.common_hash
                self._new_pass(gates, now)
                began = time.monotonic()
                continue
            if verdict.step == "succeeded":
                return
            time.sleep(self.settings.in_tree_poll_seconds)

    def _judge_end(self, verdict: InTreeVerdict) -> None:
        """What ends the run before the gates are asked: raises, or returns to go on."""
        if verdict.step == "not-picked-up":
            if self.choice.may_fall_back:
                self.stop()
                raise _NotPickedUp(verdict.message)
            raise MigrationAborted("InTreeNotPickedUp", f"{verdict.message}. Turn it on, or set "
                                                        "STORAGE_MIGRATOR_ENGINE=auto or client")  # fmt: skip
        if verdict.step == "failed":
            raise MigrationAborted("InTreeMigrationFailed", verdict.message)
        if verdict.step in ("gone", "timed-out"):
            raise MigrationAborted("InTreeMigrationGone" if verdict.step == "gone" else "InTreeMigrationTimedOut",
                                   verdict.message)  # fmt: skip

    def _new_pass(self, gates: AgreementVerdict, now: StorageVersionObservation | None) -> None:
        """The storage version or the encryption configuration moved: the in-tree object's pass proves
        nothing; it is deleted and a new one made (terminal is terminal there)."""
        assert self.opened is not None
        delete_in_tree(self.settings, self.opened)
        restart_pass(self.settings, self.handle, reason=gates.reason, message=gates.message,
                     config_hash=self.config_hash)  # fmt: skip
        self.baseline = now
        self.opened = open_in_tree(self.settings, self.handle, version=self.opened.version,
                                   passes=self.opened.passes + 1)  # fmt: skip
        self.shown = ""

    def _show(self, verdict: InTreeVerdict) -> None:
        """A new step: the log, the request's Running condition and the progress artifact's description.
        The request's holder is its writer Lease, renewed by its own thread (issue 37); the condition is
        noted again every quarter lease_seconds too, for a dispatcher that cannot read the Leases one
        round and judges by the condition's age (dispatch.presumed_dead)."""
        if verdict.step in ("succeeded", "failed", "gone", "timed-out", "not-picked-up"):
            return
        fresh = time.monotonic() - self.noted_at > self.settings.lease_seconds / 4
        if verdict.step == self.shown and not fresh:
            return
        if verdict.step != self.shown:
            get_run_logger().info("%s: %s", self.handle.name, verdict.message)
        self.shown, self.noted_at = verdict.step, time.monotonic()
        note_migration_step(self.settings, self.handle, reason=f"InTree{verdict.step.capitalize()}",
                            message=verdict.message)  # fmt: skip
        if verdict.step in ("queued", "running") and self.artifact is None:
            self.rec.started(resumed=self.opened is not None and self.opened.adopted)
            emit_migration("started", migration=self.handle.name, group_resource=self.handle.group_resource,
                           progress=MigrationProgress(), message=verdict.message, engine="in-tree")  # fmt: skip
            with best_effort("the progress artifact"):
                self.artifact = cast(UUID, create_progress_artifact(
                    progress=0.0, key=_artifact_key(self.settings, self.handle.name), description=verdict.message))  # fmt: skip
        elif self.artifact is not None:
            with best_effort("the progress artifact"):
                update_progress_artifact(artifact_id=self.artifact, progress=0.0, description=verdict.message)

    def _succeeded(self) -> MigrationSummary | State[Any]:
        """Our own count, then the request Succeeded, the ledger, the events and the outcome table."""
        from flows.migrate_resource import MigrationSummary, verdict_notes  # the flow that calls this hook

        assert self.opened is not None
        handle, run = self.handle, self.opened
        progress = count_in_tree(self.settings, handle, run)
        message = (f"{progress.listed} objects: {progress.rewritten} written since the run began (rewritten by "
                   f"{IN_TREE_KIND_NAME}/{run.name}, or by others meanwhile), {progress.unchanged} unchanged")  # fmt: skip
        message += verdict_notes(handle, self.rec, passes=run.passes, config_hash=self.config_hash)
        # Issue 36 (item 5): refinement orders by the pass's first list resourceVersion; here the baseline
        # read just before the in-tree object was made (kcm records a later one: this one is the safe side).
        checkpoint(self.settings, handle, token=None, progress=progress, failures=[],
                   pass_resource_version=run.baseline)  # fmt: skip
        finish_migration(self.settings, handle, succeeded=True, reason="Completed", message=message)
        self.rec.started(resumed=run.adopted)
        self.rec.ended("succeeded", progress, reason="Completed", message=message, passes=run.passes)
        _outcome_table(self.settings, handle, progress, "Succeeded", run.name)
        emit_migration("succeeded", migration=handle.name, group_resource=handle.group_resource, progress=progress,
                       message=message, engine="in-tree")  # fmt: skip
        if self.artifact is not None:
            with best_effort("the progress artifact"):
                update_progress_artifact(artifact_id=self.artifact, progress=100.0, description=message)
        get_run_logger().info("%s succeeded: %s", handle.name, message)
        return MigrationSummary(migration=handle.name, resource=handle.group_resource, phase=CONDITION_SUCCEEDED,
                                progress=progress, passes=run.passes, message=message)  # fmt: skip


def _artifact_key(settings: Settings, name: str) -> str:
    return scoped_key(f"migration-{name}", settings.cluster)  # migrate_resource's key: one progress bar per request


def _outcome_table(settings: Settings, handle: MigrationHandle, progress: MigrationProgress, phase: str,
                   in_tree: str | None) -> None:  # fmt: skip
    counts = progress.model_dump(exclude={"remaining_item_count", "chunks"})
    with best_effort("the outcome table artifact"):
        create_table_artifact(
            table=[{"outcome": k, "objects": v} for k, v in counts.items()],
            key=_artifact_key(settings, f"{handle.name}-outcome"),
            description=f"{handle.ref}: {phase}, engine in-tree"
                        + (f" ({IN_TREE_KIND_NAME}/{in_tree})" if in_tree else ""),
        )  # fmt: skip


def _fail(settings: Settings, handle: MigrationHandle, rec: RunRecorder, run: _Run | None, *, reason: str,
          message: str) -> State[Any]:  # fmt: skip
    """The request Failed (after the in-tree object is stopped: kept only when it Failed itself)."""
    if run is not None:
        run.stop(keep=reason == "InTreeMigrationFailed")
    finish_migration(settings, handle, succeeded=False, reason=reason, message=message)
    rec.started(resumed=False)
    rec.ended("failed", MigrationProgress(), reason=reason, message=message, passes=run.passes if run else 1)
    _outcome_table(settings, handle, MigrationProgress(), "Failed", run.opened.name if run and run.opened else None)
    emit_migration("failed", migration=handle.name, group_resource=handle.group_resource,
                   progress=MigrationProgress(), message=message, engine="in-tree")  # fmt: skip
    return Failed(message=f"{handle.name}: {message}")
