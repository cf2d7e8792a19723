"""Whether a rotation is proven, per resource and as a whole, and what a person reads.

Design decision (issues 11, 19, 39): a resource is proven when its request
Succeeded and its newest verification pass rewrote nothing, under the
configuration every API server runs at the verdict (issue 19; the pass is
chosen by rotation/proofs.py). The messages speak of that configuration, the one
the servers run now (issue 39): a proof made again after the configuration
changed says what changed as far as the API shows it (the hash; the write key
still the rotation's when the new pass rewrote nothing; no other key needed to
read any object), and objects that cannot be read under it are reported as the
loss they are, with their count and names (rotation/unreadable.py). Which keys a
configuration holds is not observable through the API (rotation/unreadable.py's
docstring), so no message claims to know it beyond those effects.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.conditions import phase_from_conditions
from storage_migrator.models import StorageVersionMigration
from storage_migrator.rotation.decisions import verify_name
from storage_migrator.rotation.proofs import VerificationStep, short_hash
from storage_migrator.rotation.unreadable import Unreadable

__all__ = ["ResourceRotation", "RotationVerdict", "ServerCheckResult", "rotation_verdict", "summarize_resource"]

#: Failed objects named in a verdict, per resource.
_NAMED_OBJECTS = 10


class ServerCheckResult(BaseModel):
    """What the API servers run at the verdict (issue 19): one common hash, or why there is none."""

    model_config = ConfigDict(frozen=True)

    config_hash: str | None = Field(description="The hash every live API server reports; None: no one hash.")
    overridden: bool = Field(default=False, description="The operator accepted the risk (skip_server_check).")
    why: str = Field(default="", description="Why there is no one hash: servers differ, unknown, or unheard.")


class ResourceRotation(BaseModel):
    """How one resource's rotation ended (the flow's return value: names and counters only)."""

    resource: str
    migration: str
    phase: str = Field(description="Phase of the request: Pending, Running, Succeeded, Failed, or Missing.")
    listed: int = 0
    rewritten: int = 0
    unchanged: int = 0
    failed: int = 0
    failed_objects: list[str] = Field(
        default_factory=list, description="``namespace/name`` of objects not rewritten (reasons: the request's status)."
    )
    verify_migration: str = Field(description="The verification pass that counts: the newest (rotation/proofs.py).")
    verify_phase: str = "Missing"
    verify_listed: int | None = Field(default=None, description="Objects the verification pass listed.")
    verify_rewritten: int | None = Field(default=None, description="Objects the verification pass rewrote: must be 0.")
    verify_failed: int = 0
    verify_config_hash: str | None = Field(
        default=None, description="The encryption configuration every API server ran during the verification pass."
    )
    previous_verification: str | None = Field(
        default=None, description="Issue 39: the earlier pass this run's was made after (another configuration)."
    )
    previous_config_hash: str | None = Field(default=None, description="The configuration that earlier pass ran under.")
    configuration_changed: bool = Field(
        default=False, description="This run proved it again because the servers' configuration changed since."
    )
    unreadable: Unreadable | None = Field(
        default=None, description="Objects the API servers cannot read under the configuration they run now: lost."
    )
    verified: bool = Field(
        default=False,
        description=("Succeeded, and a verification pass rewrote nothing under the configuration every API server "
                     "runs now (issue 19)."),
    )  # fmt: skip
    note: str = Field(default="", description="Why it is not verified, for a person.")


def _failed_objects(migration: StorageVersionMigration) -> list[str]:
    return [f"{f.namespace + '/' if f.namespace else ''}{f.name}" for f in migration.status.failures]


def _lost(r: ResourceRotation, lost: Unreadable) -> str:
    return (f"LOST: {lost.describe()} cannot be read under the configuration every API server runs "
            f"now: they are stored under a key it no longer holds (objects: {lost.named()}); no verification pass "
            "was run")  # fmt: skip


def summarize_resource(
    resource: str,
    name: str,
    request: StorageVersionMigration | None,
    verification: StorageVersionMigration | None,
    *,
    blocked: str = "",
    servers: ServerCheckResult | None = None,
    step: VerificationStep | None = None,
    unreadable: Unreadable | None = None,
) -> ResourceRotation:
    """The outcome of one resource from its request and its newest verification pass as they are now.

    Issue 19: a verification pass proves something only under the configuration it ran under,
    and only if that is what every API server runs now (``servers``; None: no check was made).
    Issue 39: ``step`` says whether this run made a new pass after an earlier one (and why), and
    ``unreadable`` the objects a read under the configuration the servers run now could not read."""
    first = verify_name(name)
    out = ResourceRotation(resource=resource, migration=name, phase="Missing",
                           verify_migration=verification.metadata.name or first if verification else first)  # fmt: skip
    if step is not None and step.supersedes is not None:
        out.previous_verification, out.previous_config_hash = step.supersedes, step.supersedes_config_hash
        out.configuration_changed = step.configuration_changed
    if request is not None:
        progress = request.status.progress
        out.phase = phase_from_conditions(request.status.conditions)
        if progress is not None:
            out.listed, out.rewritten = progress.listed, progress.rewritten
            out.unchanged, out.failed = progress.unchanged, progress.failed
        out.failed_objects = _failed_objects(request)
    if verification is not None:
        out.verify_phase = phase_from_conditions(verification.status.conditions)
        vp = verification.status.progress
        if vp is not None:
            out.verify_listed, out.verify_rewritten, out.verify_failed = vp.listed, vp.rewritten, vp.failed
        out.failed_objects += [o for o in _failed_objects(verification) if o not in out.failed_objects]
        out.verify_config_hash = verification.status.encryption_config_hash
    if unreadable is not None:
        out.unreadable, out.note = unreadable, _lost(out, unreadable)
        return out
    out.verified = (
        out.phase == "Succeeded" and out.verify_phase == "Succeeded"
        and out.verify_rewritten == 0 and out.verify_failed == 0
    )  # fmt: skip
    out.note = "" if out.verified else (blocked or _why_not(out))
    servers_note = _servers_note(out, servers) if out.verified and servers is not None else ""
    if servers_note:
        out.verified, out.note = False, servers_note
    return out


def _servers_note(r: ResourceRotation, servers: ServerCheckResult) -> str:
    if servers.overridden:
        return ""
    if servers.config_hash is None:
        return f"{servers.why}: the verification pass proves nothing until every API server runs one configuration"
    if r.verify_config_hash != servers.config_hash:
        return (f"the verification pass {r.verify_migration} ran under encryption configuration "
                f"{short_hash(r.verify_config_hash)}, and the API servers changed to {short_hash(servers.config_hash)} "
                "since (during this run): run the rotation again, it proves it again under that one")  # fmt: skip
    return ""


def _why_not(r: ResourceRotation) -> str:
    if r.phase != "Succeeded":
        if r.failed:
            return f"{r.failed} object(s) could not be rewritten"
        return f"{r.migration} is {r.phase}"
    if r.verify_phase != "Succeeded":
        if r.verify_failed:
            return f"the verification pass {r.verify_migration} could not write {r.verify_failed} object(s)"
        return f"the verification pass {r.verify_migration} is {r.verify_phase}"
    if r.verify_failed:
        return f"the verification pass {r.verify_migration} could not write {r.verify_failed} object(s)"
    of = f" of {r.verify_listed}" if r.verify_listed is not None else ""
    return (f"the verification pass {r.verify_migration} rewrote {r.verify_rewritten}{of} object(s): they were not "
            "under the write key of the configuration it ran under (an API server with another write key meanwhile, "
            "or that configuration's write key is not the rotation's: then rotate to that key). They are now: run "
            "the rotation again to prove it with a new pass")  # fmt: skip


class RotationVerdict(BaseModel):
    """Whether the rotation is proven for every resource, and what a person reads."""

    model_config = ConfigDict(frozen=True)

    completed: bool
    message: str


def _under(servers: ServerCheckResult | None) -> str:
    if servers is None:
        return ""
    if servers.overridden:
        return (" The API servers' check was OVERRIDDEN by the operator (skip_server_check): an object written "
                "through a server with another write key is not covered by this proof.")  # fmt: skip
    return f" Proven under encryption configuration {servers.config_hash}, which every API server runs."


def _proven_again(again: Sequence[ResourceRotation], *, key: str) -> str:
    """Issue 39: what the proof made again under a changed configuration says about that change."""
    before = sorted({f"{r.previous_verification} under {short_hash(r.previous_config_hash)}" for r in again})
    listed = sum(r.verify_listed or 0 for r in again)
    write_key = (f"{key} is still the write key under it (the new pass rewrote none of {listed} objects), and "
                 if all(r.verify_listed for r in again) else "")  # fmt: skip
    return (f" The API servers' encryption configuration changed since the last proof ({'; '.join(before)}), so it "
            f"was made again under the one they run now: {', '.join(r.verify_migration for r in again)}. "
            f"{write_key}every object reads back under it, so no key that change removed was needed: if the old key "
            f"is gone, nothing was lost with it; a read key other than {key} still listed may be removed.")  # fmt: skip


def rotation_verdict(
    resources: Sequence[ResourceRotation], *, key: str, servers: ServerCheckResult | None = None
) -> RotationVerdict:
    """Completed only when every resource succeeded and its verification pass rewrote nothing
    (under the configuration every API server runs, issue 19); the message names it, and says
    what a proof made again after a change of it shows (issue 39)."""
    if resources and all(r.verified for r in resources):
        listed = sum(r.listed for r in resources)
        again = [r for r in resources if r.configuration_changed]
        proven = (f"every object of {', '.join(r.resource for r in resources)} is stored under key {key} "
                  f"(verified: a second pass rewrote nothing; {listed} objects listed)")  # fmt: skip
        if again:  # the old key may be gone already: say what the proof made again shows instead
            return RotationVerdict(completed=True, message=f"{proven}.{_under(servers)}{_proven_again(again, key=key)}")
        return RotationVerdict(
            completed=True, message=f"{proven}; the old key may be removed from the read keys.{_under(servers)}"
        )
    parts = []
    for r in resources:
        if r.verified:
            continue
        objects = r.failed_objects[:_NAMED_OBJECTS] if r.unreadable is None else []
        more = f" and {len(r.failed_objects) - _NAMED_OBJECTS} more" if len(r.failed_objects) > _NAMED_OBJECTS else ""
        named = f" (objects: {', '.join(objects)}{more}; reasons in {r.migration}'s status.failures)" if objects else ""
        parts.append(f"{r.resource}: {r.note}{named}")
    now = servers.config_hash if servers is not None and not servers.overridden else None
    under = f" under encryption configuration {now}, which every API server runs now," if now else ""
    return RotationVerdict(
        completed=False,
        message=f"rotation to key {key} not proven{under} for {'; '.join(parts) or 'any resource'}."
                f"{_advice(resources, key=key, servers=servers)}",
    )  # fmt: skip


def _advice(resources: Sequence[ResourceRotation], *, key: str, servers: ServerCheckResult | None) -> str:
    """What to do with the keys, for the state the servers are in now (issue 39: never "keep the old key"
    to an operator who removed it already)."""
    lost = [r for r in resources if r.unreadable is not None]
    if lost:
        return (" These objects are lost unless the key they are stored under comes back: put the old key back as a "
                "read key on every API server (they read again once it is back; nothing else recovers them), then run "
                f"the rotation again: its verification pass re-encrypts them under {key}, and the run after it proves "
                "it. Remove no other read key meanwhile.")  # fmt: skip
    rotated = all(r.phase == "Succeeded" for r in resources)  # else the old key is still needed, whatever runs
    if rotated and servers is not None and servers.config_hash is None and not servers.overridden:
        return (" No verdict while the API servers differ: finish the change on every server (or undo it), then "
                "run the rotation again.")  # fmt: skip
    return (
        f" Do not remove the old key yet: any read key other than {key} may still be needed to decrypt these objects."
    )
