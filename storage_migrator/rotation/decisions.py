"""The decisions of an encryption key rotation: request names, and what to do with each request.

Design decision (DESIGN 4.8, seed 003; issue 11): a rotation is a set of
ordinary StorageVersionMigration requests, one per resource, named from the
resource and the key (``secrets-key2``, ``routes.route.openshift.io-key2``), so
that a second run of the same rotation finds them ``Succeeded`` (seed 003: "The
StorageVersionMigration resource can serve as a record of a successful
migration") and does nothing. The proof is a second request per resource,
``<name>-verify``, run after the first: on a cluster whose etcd cannot be read,
a pass that rewrites nothing is the evidence that every object is stored under
the new write key (DESIGN 4.5). Pure functions; the flow
``rotate-encryption-key`` only sequences them. Which verification pass proves a
resource under the configuration the servers run now (and the names of later
ones, issue 39) is rotation/proofs.py's; whether the rotation is proven,
rotation/verdict.py's.
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
    "VERIFY_ROOM",
    "VERIFY_SUFFIX",
    "InvalidKeyName",
    "RequestStep",
    "check_key_name",
    "foreign_request",
    "plan_requests",
    "request_name",
    "skips_server_check",
    "verify_name",
]

REQUESTED_BY_LABEL: Final = "migration.k8s.io/requested-by"
ROTATION_REQUESTER: Final = "rotate-encryption-key"
#: The write key a request was made for (OpenShift annotates its requests with it too).
ENCRYPTION_KEY_ANNOTATION: Final = "migration.k8s.io/encryption-key"
VERIFY_SUFFIX: Final = "-verify"
#: What a request's name leaves for its verification passes: ``-verify``, then ``-<n>`` for the n-th
#: (issue 39: a pass per configuration the servers ran, up to 8 digits of them).
VERIFY_ROOM: Final = len(VERIFY_SUFFIX) + 1 + 8
#: Issue 19: "true" on a request lets its run write although the API servers do not all report one
#: encryption configuration. The operator accepts the risk; the run warns and the ledger records it.
SKIP_SERVER_CHECK_ANNOTATION: Final = "migration.k8s.io/skip-server-check"


def skips_server_check(annotations: dict[str, str] | None) -> bool:
    """Whether a request carries the override (only the exact value "true": never by accident)."""
    return (annotations or {}).get(SKIP_SERVER_CHECK_ANNOTATION) == "true"


#: A DNS-1123 subdomain (metadata.name of a StorageVersionMigration).
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_MAX_NAME = 253


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
    if len(name) + VERIFY_ROOM > _MAX_NAME:
        raise InvalidKeyName(
            f"key {key!r} makes the request name {name!r} longer than {_MAX_NAME - VERIFY_ROOM} characters "
            f"(a StorageVersionMigration's name is at most {_MAX_NAME}, with room for its verification passes)"
        )
    return name


def verify_name(name: str) -> str:
    """The first verification pass of request ``name`` (later ones: rotation/proofs.py)."""
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


def foreign_request(existing: StorageVersionMigration, *, resource: str, group: str, plural: str, key: str) -> str:
    """Why a request of one of our names is not ours ('' when it is): made for another resource or key
    (one without the key's annotation, made by `kubectl apply`, counts as ours)."""
    spec = existing.spec.resource
    recorded = (existing.metadata.annotations or {}).get(ENCRYPTION_KEY_ANNOTATION)
    if (spec.group, spec.resource) == (group, plural) and (recorded is None or recorded == key):
        return ""
    what = storage_state_name(spec.group, spec.resource)
    return (f"{MIGRATIONS_KIND_NAME}/{existing.metadata.name} exists for {what}, key {recorded or '(none)'}, not "
            f"for {resource} and key {key}: rename or delete it")  # fmt: skip


def _step(resource: str, name: str, key: str, existing: StorageVersionMigration | None,
          group: str, plural: str) -> RequestStep:  # fmt: skip
    if existing is None:
        return RequestStep(resource=resource, name=name, action="create", reason="no request yet")
    foreign = foreign_request(existing, resource=resource, group=group, plural=plural, key=key)
    if foreign:
        return RequestStep(resource=resource, name=name, action="blocked", reason=foreign)
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
) -> list[RequestStep]:
    """One step per ``(group, resource)`` target, in order: the rotation's requests (their verification
    passes: rotation/proofs.py's ``plan_verification``)."""
    by_name = {m.metadata.name: m for m in existing if m.metadata.name}
    steps = []
    for group, plural in targets:
        name = request_name(resource=plural, group=group, key=key)
        steps.append(_step(storage_state_name(group, plural), name, key, by_name.get(name), group, plural))
    return steps
