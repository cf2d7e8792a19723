"""StorageVersionMigration objects: reading them, and their lifecycle as a run
moves them from pending to Running to Succeeded or Failed.

Design decision (DESIGN 4.5, seed 002 "Failure recovery"): the checkpoint lives
in the object itself, so any worker on any machine resumes a migration from its
`spec.continueToken`. The chunk loop sees it through the small `Checkpoint`
protocol (STYLE 6); `MigrationRecord` is the implementation over the API. Every
write names the object's `uid`, so a request deleted (cancelled) and re-created
under the same name is never written by the old run: the write answers 404 or
409 and the run stops (`MigrationCancelled`).

Issue 31: a run that starts claims the request (`OWNER_ANNOTATION`, its flow run id), and
every later write of the run is a compare-and-swap on the object's resourceVersion that
first checks the claim is still its own. Issue 37: who may claim it is its writer Lease's
(`request_lease.py`): a run claims a request only after it took the request's Lease, which it
takes only from a holder whose Lease expired. The claim fences the request's own writes: a run
taken over while alive stops at its next write of the request, before overwriting the new
run's checkpoint (`MigrationCancelled`, reason TakenOver), as its writes of objects stop at
their next one (its Lease says it lost the request).
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from kubernetes.client import ApiClient

from storage_migrator.conditions import phase_from_conditions, set_condition
from storage_migrator.kube.errors import RBAC_FIX, Conflict, NotFound, denied_permission
from storage_migrator.kube.listing import iterate_items
from storage_migrator.kube.reading import read_object
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.writing import create_object, patch_object
from storage_migrator.migration.failures import DENIED_PREFIX, SCRUBBED_PREFIX, fix_hint
from storage_migrator.models import (
    CONDITION_FAILED,
    CONDITION_RUNNING,
    CONDITION_SUCCEEDED,
    GROUP,
    MIGRATIONS_KIND_NAME,
    OWNER_ANNOTATION,
    STORAGE_VERSION_MIGRATIONS,
    VERSION,
    MigrationCondition,
    MigrationProgress,
    ObjectFailure,
    StorageVersionMigration,
    owner_of,
)

__all__ = [
    "MIGRATIONS",
    "TAKEN_OVER",
    "Checkpoint",
    "MigrationCancelled",
    "MigrationRecord",
    "create_migration",
    "failure_summary",
    "list_migrations",
    "read_migration",
]

MIGRATIONS = ResourceRef(group=GROUP, version=VERSION, resource=STORAGE_VERSION_MIGRATIONS)

#: Why a run stopped: another flow run claimed its request.
TAKEN_OVER = "TakenOver"
#: Writes of a run retried after a conflict with someone else's write (a label, an annotation).
_CONFLICT_RETRIES = 5

#: Failed objects named in a Failed condition's message.
NAMED_FAILURES = 5


class MigrationCancelled(Exception):
    """The request was deleted (or replaced, or taken over by another run) while its run was going on."""

    def __init__(self, message: str, *, reason: str = "Deleted") -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple[object, ...]:  # the reason survives a copy or a pickle
        return (_cancelled, (str(self), self.reason))


def _cancelled(message: str, reason: str) -> MigrationCancelled:
    return MigrationCancelled(message, reason=reason)


class Checkpoint(Protocol):
    """Where the chunk loop saves and finds its place."""

    def load(self) -> tuple[str | None, MigrationProgress]: ...

    def save(
        self,
        *,
        token: str | None,
        progress: MigrationProgress,
        failures: list[ObjectFailure],
        now: datetime,
        pass_resource_version: str | None = None,
    ) -> None: ...


def read_migration(api: ApiClient, name: str) -> StorageVersionMigration:
    return StorageVersionMigration.model_validate(read_object(api, MIGRATIONS, name=name))


def list_migrations(api: ApiClient) -> list[StorageVersionMigration]:
    return [StorageVersionMigration.model_validate(item) for item in iterate_items(api, MIGRATIONS, limit=500)]


def create_migration(api: ApiClient, migration: StorageVersionMigration) -> StorageVersionMigration:
    return StorageVersionMigration.model_validate(create_object(api, MIGRATIONS, migration.to_wire()))


def failure_summary(failures: list[ObjectFailure], total: int) -> str:
    """`3 object(s) could not be rewritten: default/a (422 Invalid: fields: data.x (FieldValueInvalid)),
    ...; to fix: ...` (first few named, then what to do about the first one's answer).

    Issue 12 item 6: only names, codes, reasons and field paths (see
    :mod:`storage_migrator.migration.failures`); a message recorded by an older version,
    free text that may quote the object, is left out.
    """
    named = ", ".join(
        f"{f.namespace + '/' if f.namespace else ''}{f.name} ({_answer(f)})" for f in failures[:NAMED_FAILURES]
    )
    more = f", and {total - NAMED_FAILURES} more" if total > NAMED_FAILURES else ""
    summary = f"{total} object(s) could not be rewritten: {named}{more}"
    # Issue 14: a denied permission is named whole, with how to grant it.
    denied = next((p for f in failures if f.code == 403 and (p := denied_permission(f.message))), None)
    if denied:
        return f"{summary}. Forbidden: {denied}; {RBAC_FIX}"
    hint = f"; to fix: {fix_hint(failures[0].code, failures[0].reason)}" if failures else ""
    return summary + hint


def _answer(failure: ObjectFailure) -> str:
    answer = f"{failure.code} {failure.reason}".strip()
    denial = failure.message.startswith(DENIED_PREFIX) and denied_permission(failure.message) is not None
    if failure.message.startswith(SCRUBBED_PREFIX) or denial:
        answer += f": {failure.message}"
    return answer


class MigrationRecord:
    """One StorageVersionMigration as a run sees it; every write is uid-guarded."""

    def __init__(self, api: ApiClient, migration: StorageVersionMigration, *, owner: str | None = None) -> None:
        name, uid = migration.metadata.name, migration.metadata.uid
        if not name or not uid:
            raise ValueError("a MigrationRecord needs a migration read from the API (name and uid)")
        self.api = api
        self.name = name
        self.uid = uid
        self.migration = migration
        #: The flow run writing through this record: its writes are fenced (None: not fenced).
        self.owner = owner

    @property
    def ref(self) -> ResourceRef:
        r = self.migration.spec.resource
        return ResourceRef(group=r.group, version=r.version, resource=r.resource)

    def _patch(self, patch: dict[str, object], *, status: bool, claim: str | None = None) -> None:
        """A uid-guarded merge patch; an owner's is also a compare-and-swap on the
        resourceVersion, retried while the claim is still its own (issue 31), or `claim` it."""
        for _ in range(_CONFLICT_RETRIES):
            if claim is None:
                self._check_claim()  # as last read: a record that saw its run taken over writes nothing more
            metadata = {"annotations": {OWNER_ANNOTATION: claim}} if claim else {}
            meta: dict[str, object] = {**metadata, "uid": self.uid}
            if self.owner:
                meta["resourceVersion"] = self.migration.metadata.resource_version
            try:
                body = {**patch, "metadata": meta}
                answer = patch_object(self.api, MIGRATIONS, name=self.name, patch=body,
                                      subresource="status" if status else None)  # fmt: skip
            except NotFound as exc:
                raise MigrationCancelled(f"{MIGRATIONS_KIND_NAME}/{self.name} was deleted: run cancelled") from exc
            except Conflict as exc:
                if not self.owner:
                    raise MigrationCancelled(f"{MIGRATIONS_KIND_NAME}/{self.name} was replaced: run cancelled") from exc
                self.migration = self._read_same(self.api, self.name, self.uid)
                continue  # the claim is checked again; someone else's write (a label) is written over
            self.migration = StorageVersionMigration.model_validate(answer)
            return
        raise MigrationCancelled(f"{MIGRATIONS_KIND_NAME}/{self.name} changed under each of "
                                 f"{_CONFLICT_RETRIES} writes: run stopped, the request kept", reason="Conflicting")  # fmt: skip

    def _check_claim(self) -> None:
        """`MigrationCancelled` (TakenOver) when another flow run has claimed the request since."""
        holder = owner_of(self.migration)
        if self.owner and holder and holder != self.owner:
            raise MigrationCancelled(
                f"{MIGRATIONS_KIND_NAME}/{self.name} was taken over by flow run {holder}: this run ({self.owner}) "
                "stops without writing it again (its writer Lease had expired, and the other run took the request over)",
                reason=TAKEN_OVER,
            )

    def claim(self) -> None:
        """This run owns the request from now on: the run it took over stops at its next write."""
        if self.owner and owner_of(self.migration) != self.owner:
            self._patch({}, status=False, claim=self.owner)

    def _status_patch(self, conditions: list[MigrationCondition], **fields: object) -> None:
        status = self.migration.status.model_copy(update={"conditions": conditions, **fields})
        status.phase = phase_from_conditions(conditions)
        wire = status.to_wire()
        if status.progress is not None and status.progress.remaining_item_count is None:
            # A merge patch keeps a key it does not name: null removes the last chunk's count.
            wire.setdefault("progress", {})["remainingItemCount"] = None
        if status.resource_version is None:
            wire["resourceVersion"] = None  # a new pass: the last pass's first LIST proves nothing
        self._patch({"status": wire}, status=True)

    @staticmethod
    def _read_same(api: ApiClient, name: str, uid: str) -> StorageVersionMigration:
        """The request as it is now; `MigrationCancelled` if it was deleted or replaced."""
        try:
            current = read_migration(api, name)
        except NotFound as exc:
            raise MigrationCancelled(f"{MIGRATIONS_KIND_NAME}/{name} was deleted: run cancelled") from exc
        if current.metadata.uid != uid:
            raise MigrationCancelled(f"{MIGRATIONS_KIND_NAME}/{name} was replaced: run cancelled")
        return current

    @classmethod
    def open(cls, api: ApiClient, *, name: str, uid: str, owner: str | None = None,
             claiming: bool = False) -> MigrationRecord:  # fmt: skip
        """The record of a run that knows its request by name and uid (each task of a flow run);
        `MigrationCancelled` if `owner` is no longer the request's (unless it is `claiming` it)."""
        record = cls(api, cls._read_same(api, name, uid), owner=owner)
        if not claiming:
            record._check_claim()
        return record

    def refresh(self) -> StorageVersionMigration:
        self.migration = self._read_same(self.api, self.name, self.uid)
        self._check_claim()
        return self.migration

    def load(self) -> tuple[str | None, MigrationProgress]:
        current = self.refresh()
        return current.spec.continue_token or None, current.status.progress or MigrationProgress()

    def start(self, *, now: datetime, target_hash: str | None, message: str, config_hash: str | None = None) -> None:
        """Running; ``config_hash`` (issue 19): the configuration the pass runs under (the caller
        restarts a checkpointed pass that began under another one)."""
        conditions = set_condition(self.migration.status.conditions, condition_type=CONDITION_RUNNING,
                                   status="True", now=now, reason="Migrating", message=message)  # fmt: skip
        self._status_patch(
            conditions,
            started_at=self.migration.status.started_at or now,
            target_storage_version_hash=target_hash or self.migration.status.target_storage_version_hash,
            progress=self.migration.status.progress or MigrationProgress(),
            encryption_config_hash=config_hash or self.migration.status.encryption_config_hash,
        )

    def save(
        self,
        *,
        token: str | None,
        progress: MigrationProgress,
        failures: list[ObjectFailure],
        now: datetime,
        pass_resource_version: str | None = None,
    ) -> None:
        """The checkpoint; ``pass_resource_version``: the list resourceVersion of the pass's first
        chunk (issue 36), recorded once per pass (a resumed run keeps the one recorded)."""
        # The token first: a crash between the two writes loses a chunk's counters,
        # never re-does more than one chunk and never skips an object.
        self._patch({"spec": {"continueToken": token or ""}}, status=False)
        conditions = set_condition(
            self.migration.status.conditions, condition_type=CONDITION_RUNNING, status="True", now=now,
            reason="Migrating", message=f"{progress.listed} objects listed in {progress.chunks} chunk(s)",
        )  # fmt: skip
        first = self.migration.status.resource_version or pass_resource_version
        self._status_patch(conditions, progress=progress, failures=failures, resource_version=first)

    def restart_pass(self, *, now: datetime, reason: str, message: str, config_hash: str | None = None) -> None:
        """Reset the checkpoint for a new pass from the beginning (seed 001: the storage
        version moved while the migration ran; issue 19: the encryption configuration
        did): token and counters cleared, failures too (the new pass tries every object
        again), the configuration the new pass begins under, and the Running condition says why."""
        self._patch({"spec": {"continueToken": ""}}, status=False)
        conditions = set_condition(self.migration.status.conditions, condition_type=CONDITION_RUNNING,
                                   status="True", now=now, reason=reason, message=message)  # fmt: skip
        extra = {"encryption_config_hash": config_hash} if config_hash else {}
        self._status_patch(conditions, progress=MigrationProgress(), failures=[], resource_version=None, **extra)

    def note_step(self, *, now: datetime, reason: str, message: str) -> None:
        """Still Running, the checkpoint kept: the step a run waits on, for `kubectl get` (issue 36:
        the in-tree engine's steps). Which run holds the request is its writer Lease's (issue 37)."""
        conditions = set_condition(self.migration.status.conditions, condition_type=CONDITION_RUNNING,
                                   status="True", now=now, reason=reason, message=message)  # fmt: skip
        self._status_patch(conditions)

    def finish(self, *, succeeded: bool, now: datetime, reason: str, message: str) -> None:
        conditions = set_condition(self.migration.status.conditions, condition_type=CONDITION_RUNNING,
                                   status="False", now=now, reason=reason, message=message)  # fmt: skip
        conditions = set_condition(
            conditions,
            condition_type=CONDITION_SUCCEEDED if succeeded else CONDITION_FAILED,
            status="True",
            now=now,
            reason=reason,
            message=message,
        )
        self._status_patch(conditions, finished_at=now)
