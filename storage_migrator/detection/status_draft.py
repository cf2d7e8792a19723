"""The new status of one StorageState, built step by step by one poll (seed 000).

Design decision: the planner (:mod:`storage_migrator.detection.planner`) reads a
state into a :class:`StatusDraft`, then each rule of seed 000 changes it in turn
(stale reset or change or heartbeat, the settle delay, forgetting SINCE while the
API servers disagree, refinement), each rule quoted where it is applied, so the
state gets at most one write per poll.

Issue 36: the moment the current hash is recorded is two things, written
together: SINCE (the time, for people and for the back-off after failures) and
the resource's list resourceVersion then (``record_switch``: read by the apply
step, after discovery showed the hash), which is what refinement is ordered by
(:mod:`storage_migrator.detection.ordering`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from storage_migrator.agreement.reporters import ReporterRound
from storage_migrator.conditions import is_condition_true
from storage_migrator.detection.in_tree import creator_text
from storage_migrator.detection.ordering import covers, revision
from storage_migrator.detection.rules import (
    SETTLE_ANNOTATION,
    SINCE_ANNOTATION,
    DetectionSettings,
    describe,
    parse_time,
)
from storage_migrator.kube.in_tree import InTreeMigration
from storage_migrator.models import CONDITION_SUCCEEDED, UNKNOWN, StorageState, StorageVersionMigration, format_time


@dataclass
class StatusDraft:
    """The new status of one StorageState, built step by step by the planner's ``_plan_existing``."""

    previous: str | None
    current: str
    persisted: list[str]
    annotations: dict[str, str]
    since: datetime | None
    settle_until: datetime | None
    switch_rv: str | None = None
    record_switch: bool = False
    reasons: list[str] = field(default_factory=list)
    refined_by: str | None = None

    def start_clock(self, now: datetime) -> None:
        """The current hash is recorded from now on (SINCE_ANNOTATION), and at the resource's
        resourceVersion the apply step reads (``record_switch``)."""
        self.since = now
        self.annotations[SINCE_ANNOTATION] = format_time(now)
        self.switch_rv = None
        self.record_switch = True

    def stop_clock(self) -> None:
        """No moment is recorded: nothing can prove the current hash until the clock starts again."""
        self.since = None
        self.annotations.pop(SINCE_ANNOTATION, None)
        self.switch_rv = None
        self.record_switch = False


@dataclass(frozen=True)
class Proof:
    """The succeeded migration that refines a state: how events name it, and what the report says."""

    name: str
    text: str


def draft_of(state: StorageState, reporters: ReporterRound, *, fallback: str) -> StatusDraft:
    """The status as read; ``current`` already the agreed hash, or kept while there is none."""
    status = state.status
    annotations = dict(state.metadata.annotations or {})
    previous = status.current_storage_version_hash
    return StatusDraft(
        previous=previous,
        # Seed 000 HA: the hash moves only on agreement; status.currentStorageVersionHash
        # (the non-HA field, for tooling) keeps the last agreed hash meanwhile.
        current=reporters.agreed or previous or fallback,
        persisted=list(status.persisted_storage_version_hashes),
        annotations=annotations,
        since=parse_time(annotations.get(SINCE_ANNOTATION)),
        settle_until=parse_time(annotations.get(SETTLE_ANNOTATION)),
        switch_rv=status.current_hash_resource_version,
    )


def record_hashes(
    draft: StatusDraft,
    state: StorageState,
    reporters: ReporterRound,
    *,
    now: datetime,
    settings: DetectionSettings,
    changed: bool,
) -> None:
    """Persisted hashes and SINCE: stale reset, change, or heartbeat; then every hash seen joins."""
    heartbeat = state.status.last_heartbeat_time
    stale = heartbeat is None or (now - heartbeat).total_seconds() > settings.stale_after_seconds
    if stale or not draft.persisted or draft.previous is None:
        # Seed 000: "if the timestamp is more than 10 minutes old, it recreates
        # storageState object with persistedStorageVersionHashes set to ["Unknown"]"
        # (two poll periods here, DESIGN 4.3). A state without a heartbeat, a current
        # hash or a persisted list is as untrustworthy. "Unknown" covers every hash seen.
        draft.persisted = [UNKNOWN]
        draft.start_clock(now)
        if stale:
            age = "no heartbeat" if heartbeat is None else f"heartbeat {format_time(heartbeat)}"
            draft.reasons.append(
                f"stale ({age}, older than {settings.stale_after_seconds:g}s): persisted reset to [Unknown]"
            )
        else:
            draft.reasons.append("incomplete status: persisted reset to [Unknown]")
        return
    if changed:
        # Seed 000: "as a single operation, updates the status.lastHeartbeatTime, sets
        # storageState.status.currentStorageVersionHash to the value shown in the
        # discovery document, and appends the hash to the
        # storageState.status.persistedStorageVersionHashes" (appended below).
        draft.start_clock(now)
        draft.reasons.append(f"storage version hash changed from {draft.previous} to {draft.current}")
    else:
        # Seed 000: "If they are the same, the controller simply updates the
        # status.lastHeartbeatTime and is done."
        draft.reasons.append("heartbeat")
        if draft.since is None and reporters.agreed is not None:
            # Without the time the hash was recorded (or agreed on again, see
            # forget_since) no migration can prove it rewrote everything to it;
            # start the clock now (a new migration follows).
            draft.start_clock(now)
            draft.reasons.append(f"no {SINCE_ANNOTATION} annotation: set to now")
        elif draft.switch_rv is None and draft.persisted != [draft.current] and reporters.agreed is not None:
            # Issue 36: a state recorded before resourceVersions were (or whose read failed)
            # cannot order any migration after its switch. Timestamps are not trusted instead
            # (a second's doubt is what this fixes): the clock restarts now, and a migration
            # that begins listing after it refines the state (one more pass over the resource).
            draft.start_clock(now)
            draft.reasons.append("no resourceVersion recorded for the current hash: recorded now")
    # Seed 000 HA: every reporter "adds the storage version hash to
    # PersistedStorageVersionHashes if the local storage version hash is not present
    # there yet". A hash already recorded as current is covered by "Unknown" (a fresh
    # ["Unknown"] stays as it is, as in the single-server rule).
    for hash_ in reporters.seen:
        covered = UNKNOWN in draft.persisted and hash_ == draft.previous
        if hash_ not in draft.persisted and not covered:
            draft.persisted.append(hash_)
    # The current hash is always covered by the persisted ones (objects written from
    # now on are encoded in it); "Unknown" covers every version.
    if draft.current not in draft.persisted and UNKNOWN not in draft.persisted:
        draft.persisted.append(draft.current)


def settle(draft: StatusDraft, *, now: datetime, settings: DetectionSettings) -> None:
    """Seed 004's loose guarantee: after a change of the agreed hash, wait before migrating."""
    if settings.settle_seconds > 0:
        draft.settle_until = now + timedelta(seconds=settings.settle_seconds)
        draft.annotations[SETTLE_ANNOTATION] = format_time(draft.settle_until)
    else:
        draft.settle_until = None
        draft.annotations.pop(SETTLE_ANNOTATION, None)


def forget_since(draft: StatusDraft, reporters: ReporterRound) -> None:
    """While API servers disagree, no migration can prove anything: drop SINCE.

    Objects may be written in any of the reported versions until they agree
    again, so the clock restarts at the first poll that sees agreement (the
    "no SINCE" rule of :func:`record_hashes`): a migration that ran during the
    disagreement (seed 000's walkthrough: started at 20, server 3 rolled back at
    22) never refines the state.
    """
    draft.stop_clock()
    draft.reasons.append(f"API servers disagree ({describe(reporters)}): current hash kept, no migration")


def refine(
    draft: StatusDraft,
    migrations: list[StorageVersionMigration],
    reporters: ReporterRound,
    in_tree: list[InTreeMigration] | None = None,
) -> Proof | None:
    """Refinement: the Succeeded migration that makes persisted ``[current]``, if any.

    Seed 000: "If a migration completes, the controller finds the storageState of
    that resource, updates its status.persistedStorageVersionHashes to equal its
    status.currentStorageVersionHash" -- only while the API servers agree, and
    only a Succeeded migration that began listing after the hash was recorded,
    ordered by resourceVersion (issue 36, :mod:`storage_migrator.detection.ordering`):
    ours, when it targeted the current hash; an in-tree one (``storagemigration.k8s.io``,
    anyone's), whose ``status.resourceVersion`` is where its controller began. A
    migration that cannot be ordered never refines, and the reason says why.
    """
    if reporters.agreed is None or draft.record_switch:
        return None  # disagreement; or the clock starts in this poll: nothing before it proves the hash
    current = draft.current
    unrefined = draft.persisted != [current]
    if revision(draft.switch_rv) is None:
        if unrefined:
            draft.reasons.append(f"no refinement: the state's resourceVersion {draft.switch_rv!r} is not an integer "
                                 "(reset the state to record it again)")  # fmt: skip
        return None
    proofs: list[Proof] = []
    doubts: list[str] = []
    for m in migrations:
        status = m.status
        if (
            not is_condition_true(status.conditions, CONDITION_SUCCEEDED)
            or status.target_storage_version_hash != current
        ):
            continue
        coverage = covers(status.resource_version, draft.switch_rv)
        name = m.metadata.name or ""
        if coverage.after:
            proofs.append(Proof(name=name, text=f"migration {name} succeeded to {current} (first LIST at "
                                                f"resourceVersion {status.resource_version}, after the switch at "
                                                f"{draft.switch_rv})"))  # fmt: skip
        elif coverage.unknown:
            doubts.append(f"migration {name} not counted: {coverage.unknown}")
    for t in in_tree or []:
        if t.phase != "Succeeded":
            continue
        coverage = covers(t.resource_version, draft.switch_rv)
        if coverage.after:
            proofs.append(Proof(name=t.display_name, text=f"in-tree migration {t.display_name} ({creator_text(t)}) "
                                                          f"succeeded up to resourceVersion {t.resource_version}, "
                                                          f"after the switch at {draft.switch_rv}"))  # fmt: skip
        elif coverage.unknown:
            doubts.append(f"in-tree migration {t.display_name} not counted: {coverage.unknown}")
    proof = proofs[-1] if proofs else None
    if proof is not None and unrefined:
        draft.persisted = [current]
        draft.refined_by = proof.name
        draft.reasons.append(f"refined: {proof.text}")
    elif proof is None and unrefined and doubts:
        more = f" (and {len(doubts) - 1} more)" if len(doubts) > 1 else ""
        draft.reasons.append(doubts[-1] + more)
    return proof
