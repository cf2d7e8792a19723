"""The decisions of an encryption key rotation: request names, what to do with
each request, and whether the rotation is proven.

Design decision (DESIGN 4.8, seed 003; issue 11): a rotation is a set of
ordinary StorageVersionMigration requests, one per resource, named from the
resource and the key (``secrets-key2``, ``routes.route.openshift.io-key2``), so
that a second run of the same rotation finds them ``Succeeded`` (seed 003: "The
StorageVersionMigration resource can serve as a record of a successful
migration") and does nothing. The proof is a second request per resource,
``<name>-verify``, run after the first: on a cluster whose etcd cannot be read,
a pass that rewrites nothing is the evidence that every object is stored under
the new write key (DESIGN 4.5). Pure functions; the flow
``rotate-encryption-key`` only sequences them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.conditions import is_condition_true, phase_from_conditions
from storage_migrator.models import (
    CONDITION_FAILED,
    CONDITION_SUCCEEDED,
    MIGRATIONS_KIND_NAME,
    StorageVersionMigration,
    storage_state_name,
)

__all__ = [
    "ENCRYPTION_KEY_ANNOTATION",
    "REQUESTED_BY_LABEL",
    "ROTATION_REQUESTER",
    "SKIP_SERVER_CHECK_ANNOTATION",
    "VERIFY_SUFFIX",
    "InvalidKeyName",
    "RequestStep",
    "ResourceRotation",
    "RotationVerdict",
    "ServerCheckResult",
    "check_key_name",
    "plan_requests",
    "request_name",
    "rotation_verdict",
    "skips_server_check",
    "summarize_resource",
    "verify_name",
]

REQUESTED_BY_LABEL: Final = "migration.k8s.io/requested-by"
ROTATION_REQUESTER: Final = "rotate-encryption-key"
#: The write key a request was made for (OpenShift annotates its requests with it too).
ENCRYPTION_KEY_ANNOTATION: Final = "migration.k8s.io/encryption-key"
VERIFY_SUFFIX: Final = "-verify"
#: Issue 19: "true" on a request lets its run write although the API servers do not all report one
#: encryption configuration. The operator accepts the risk; the run warns and the ledger records it.
SKIP_SERVER_CHECK_ANNOTATION: Final = "migration.k8s.io/skip-server-check"


def skips_server_check(annotations: dict[str, str] | None) -> bool:
    """Whether a request carries the override (only the exact value "true": never by accident)."""
    return (annotations or {}).get(SKIP_SERVER_CHECK_ANNOTATION) == "true"


#: A DNS-1123 subdomain (metadata.name of a StorageVersionMigration).
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_MAX_NAME = 253
#: Failed objects named in a verdict, per resource.
_NAMED_OBJECTS = 10


class InvalidKeyName(ValueError):
    """The key's name cannot be part of a request's name: nothing is created."""


def check_key_name(key: str) -> str:
    """The key's name if it can end a request name (lowercase letters, digits, '-', '.')."""
    if not key or not _SUBDOMAIN.match(key):
        raise InvalidKeyName(
            f"key {key!r} cannot be part of a {MIGRATIONS_KIND_NAME} name: use lowercase letters, "
            "digits, '-' and '.', starting and ending with a letter or digit (a DNS-1123 subdomain). "
            "Nothing was created."
        )
    return key


def request_name(*, resource: str, group: str, key: str) -> str:
    """``<resource>[.<group>]-<key>``: the request for one resource and one write key."""
    name = f"{storage_state_name(group.lower(), resource.lower())}-{check_key_name(key)}"
    if len(name) + len(VERIFY_SUFFIX) > _MAX_NAME:
        raise InvalidKeyName(f"key {key!r} makes the request name {name!r} longer than {_MAX_NAME - 7} characters")
    return name


def verify_name(name: str) -> str:
    """The verification pass of request ``name``."""
    return f"{name}{VERIFY_SUFFIX}"


StepAction = Literal["create", "run", "done", "blocked"]


class RequestStep(BaseModel):
    """What the rotation does with the request of one resource."""

    model_config = ConfigDict(frozen=True)

    resource: str = Field(description="``<resource>[.<group>]``.")
    name: str = Field(description="metadata.name of the request.")
    action: StepAction = Field(
        description=(
            "create: no such request yet; run: pending or Running (run or resume it); "
            "done: Succeeded (seed 003: the record that it ran, not run again); "
            "blocked: Failed, or the name is taken by a request for something else."
        )
    )
    reason: str = ""


def _step(resource: str, name: str, key: str, existing: StorageVersionMigration | None,
          group: str, plural: str) -> RequestStep:  # fmt: skip
    if existing is None:
        return RequestStep(resource=resource, name=name, action="create", reason="no request yet")
    spec = existing.spec.resource
    recorded = (existing.metadata.annotations or {}).get(ENCRYPTION_KEY_ANNOTATION)
    if (spec.group, spec.resource) != (group, plural) or (recorded is not None and recorded != key):
        what = storage_state_name(spec.group, spec.resource)
        return RequestStep(
            resource=resource, name=name, action="blocked",
            reason=(f"{MIGRATIONS_KIND_NAME}/{name} exists for {what}, key {recorded or '(none)'}, not for "
                    f"{resource} and key {key}: rename or delete it"),
        )  # fmt: skip
    conditions = existing.status.conditions
    if is_condition_true(conditions, CONDITION_SUCCEEDED):
        return RequestStep(resource=resource, name=name, action="done", reason="already Succeeded")
    if is_condition_true(conditions, CONDITION_FAILED):
        return RequestStep(
            resource=resource, name=name, action="blocked",
            reason=(f"{MIGRATIONS_KIND_NAME}/{name} has Failed; see its status.failures, fix the cause, then "
                    f"delete it (kubectl delete {MIGRATIONS_KIND_NAME} {name}) and run the rotation again"),
        )  # fmt: skip
    return RequestStep(resource=resource, name=name, action="run",
                       reason=f"{phase_from_conditions(conditions)}: run or resume it")  # fmt: skip


def plan_requests(
    targets: Sequence[tuple[str, str]],
    existing: Sequence[StorageVersionMigration],
    *,
    key: str,
    verify: bool = False,
) -> list[RequestStep]:
    """One step per ``(group, resource)`` target, in order: the rotation's requests
    (``verify=False``) or their verification passes (``verify=True``)."""
    by_name = {m.metadata.name: m for m in existing if m.metadata.name}
    steps = []
    for group, plural in targets:
        name = request_name(resource=plural, group=group, key=key)
        if verify:
            name = verify_name(name)
        steps.append(_step(storage_state_name(group, plural), name, key, by_name.get(name), group, plural))
    return steps


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
    verify_migration: str
    verify_phase: str = "Missing"
    verify_rewritten: int | None = Field(default=None, description="Objects the verification pass rewrote: must be 0.")
    verify_failed: int = 0
    verify_config_hash: str | None = Field(
        default=None, description="The encryption configuration every API server ran during the verification pass."
    )
    verified: bool = Field(
        default=False,
        description=("Succeeded, and a verification pass rewrote nothing under the configuration every API server "
                     "runs now (issue 19)."),
    )  # fmt: skip
    note: str = Field(default="", description="Why it is not verified, for a person.")


def _failed_objects(migration: StorageVersionMigration) -> list[str]:
    return [f"{f.namespace + '/' if f.namespace else ''}{f.name}" for f in migration.status.failures]


def summarize_resource(
    resource: str,
    name: str,
    request: StorageVersionMigration | None,
    verification: StorageVersionMigration | None,
    *,
    blocked: str = "",
    servers: ServerCheckResult | None = None,
) -> ResourceRotation:
    """The outcome of one resource from its two requests as they are now.

    Issue 19: a verification pass proves something only under the configuration it ran under,
    and only if that is what every API server runs now (``servers``; None: no check was made)."""
    out = ResourceRotation(resource=resource, migration=name, phase="Missing", verify_migration=verify_name(name))
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
            out.verify_rewritten, out.verify_failed = vp.rewritten, vp.failed
        out.failed_objects += [o for o in _failed_objects(verification) if o not in out.failed_objects]
        out.verify_config_hash = verification.status.encryption_config_hash
    out.verified = (
        out.phase == "Succeeded" and out.verify_phase == "Succeeded"
        and out.verify_rewritten == 0 and out.verify_failed == 0
    )  # fmt: skip
    out.note = "" if out.verified else (blocked or _why_not(out))
    servers_note = _servers_note(out, servers) if out.verified and servers is not None else ""
    if servers_note:
        out.verified, out.note = False, servers_note
    return out


class ServerCheckResult(BaseModel):
    """What the API servers run at the verdict (issue 19): one common hash, or why there is none."""

    model_config = ConfigDict(frozen=True)

    config_hash: str | None = Field(description="The hash every live API server reports; None: no one hash.")
    overridden: bool = Field(default=False, description="The operator accepted the risk (skip_server_check).")
    why: str = Field(default="", description="Why there is no one hash: servers differ, unknown, or unheard.")


def _servers_note(r: ResourceRotation, servers: ServerCheckResult) -> str:
    if servers.overridden:
        return ""
    if servers.config_hash is None:
        return f"{servers.why}: the verification pass proves nothing until every API server runs one configuration"
    if r.verify_config_hash != servers.config_hash:
        return (f"the verification pass {r.verify_migration} ran under encryption configuration "
                f"{r.verify_config_hash or 'unknown'}, the API servers run {servers.config_hash} now: delete "
                f"{r.verify_migration} and run the rotation again")  # fmt: skip
    return ""


def _why_not(r: ResourceRotation) -> str:
    if r.phase != "Succeeded":
        if r.failed:
            return f"{r.failed} object(s) could not be rewritten"
        return f"{r.migration} is {r.phase}"
    if r.verify_phase != "Succeeded":
        if r.verify_failed:
            return f"the verification pass could not write {r.verify_failed} object(s)"
        return f"the verification pass {r.verify_migration} is {r.verify_phase}"
    if r.verify_failed:
        return f"the verification pass could not write {r.verify_failed} object(s)"
    return (f"the verification pass rewrote {r.verify_rewritten} object(s): something wrote them under another "
            f"key meanwhile (an API server with an old write key?); delete {r.verify_migration} and run again")  # fmt: skip


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


def rotation_verdict(
    resources: Sequence[ResourceRotation], *, key: str, servers: ServerCheckResult | None = None
) -> RotationVerdict:
    """Completed only when every resource succeeded and its verification pass rewrote nothing
    (under the configuration every API server runs, issue 19); the message names it."""
    if resources and all(r.verified for r in resources):
        listed = sum(r.listed for r in resources)
        return RotationVerdict(
            completed=True,
            message=(f"every object of {', '.join(r.resource for r in resources)} is stored under key {key} "
                     f"(verified: a second pass rewrote nothing; {listed} objects listed); the old key may "
                     f"be removed from the read keys.{_under(servers)}"),
        )  # fmt: skip
    parts = []
    for r in resources:
        if r.verified:
            continue
        objects = r.failed_objects[:_NAMED_OBJECTS]
        more = f" and {len(r.failed_objects) - _NAMED_OBJECTS} more" if len(r.failed_objects) > _NAMED_OBJECTS else ""
        named = f" (objects: {', '.join(objects)}{more}; reasons in {r.migration}'s status.failures)" if objects else ""
        parts.append(f"{r.resource}: {r.note}{named}")
    return RotationVerdict(
        completed=False,
        message=(f"rotation to key {key} not proven for {'; '.join(parts) or 'any resource'}. "
                 f"Do not remove the old key yet: any read key other than {key} may still be needed "
                 "to decrypt these objects."),
    )  # fmt: skip
