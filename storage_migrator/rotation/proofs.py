"""Which verification pass proves a rotation under the configuration the API servers run now.

Design decision (issue 39). A verification pass proves that every object was
stored under the write key of the configuration it ran under, and so that no
other key was needed to read any of them; it stays a proof while the servers
run that configuration (every write since went under the same key). When the
configuration changes (the old key removed, a read key added), a rerun of the
rotation does not ask a person to delete the old pass: it makes a new one under
the configuration the servers run now, which writes nothing where nothing is
due, and keeps the old one as the record of what was proven then.

Names: ``secrets-key2-verify`` is the first pass of ``secrets-key2``, then
``secrets-key2-verify-2``, ``-verify-3``... A counter rather than the
configuration hash in the name, because a configuration can come back (a read key
added, then removed again): a pass named for it would exist already, from
before writes under the other one. Each pass records the hash it ran under
(``status.encryptionConfigHash``); the newest one (the highest number) is the one
that counts. The room for the suffix is kept by ``request_name``
(``decisions.VERIFY_ROOM``), so every name stays within Kubernetes' 253.

A pass proves nothing about writes made under another configuration, even if the
servers come back to its own (a write key rolled back, then the old key removed,
then put back). A run that sees the servers on another configuration, or on
none, and does not prove under it (a loss, servers that differ) records so on
the newest pass (``OUTDATED_ANNOTATION``), which then never counts again.

Pure functions; the flow ``rotate-encryption-key`` creates and runs what they say.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.conditions import phase_from_conditions
from storage_migrator.models import MIGRATIONS_KIND_NAME, StorageVersionMigration, storage_state_name
from storage_migrator.rotation.decisions import foreign_request, verify_name

__all__ = [
    "MAX_PASSES",
    "OUTDATED_ANNOTATION",
    "VerificationStep",
    "latest_verification",
    "plan_verification",
    "short_hash",
    "verification_name",
    "verification_number",
]

#: The most verification passes a request may have: ``decisions.VERIFY_ROOM`` leaves 8 digits.
MAX_PASSES: Final = 10**8 - 1
#: On a verification pass: what a later run saw the servers run, which the pass does not prove (issue 39).
OUTDATED_ANNOTATION: Final = "migration.k8s.io/proof-outdated"


def verification_name(request: str, number: int = 1) -> str:
    """The `number`-th verification pass of request ``request`` (``-verify``, ``-verify-2``, ...)."""
    if not 1 <= number <= MAX_PASSES:
        raise ValueError(f"verification pass number {number} is not between 1 and {MAX_PASSES}")
    return verify_name(request) if number == 1 else f"{verify_name(request)}-{number}"


def verification_number(request: str, name: str) -> int | None:
    """Which pass of ``request`` the name ``name`` is (None: none of its passes)."""
    first = verify_name(request)
    if name == first:
        return 1
    found = re.fullmatch(re.escape(first) + r"-([1-9][0-9]{0,7})", name)
    return int(found.group(1)) if found and int(found.group(1)) >= 2 else None


def short_hash(config_hash: str | None) -> str:
    """``sha256:aa45c0de…`` for messages (the full hash is in the artifact and the request's status)."""
    if config_hash is None:
        return "unknown"
    return config_hash[: len("sha256:") + 12] + "…" if len(config_hash) > len("sha256:") + 12 else config_hash


def _passes(request: str, existing: Sequence[StorageVersionMigration]) -> list[tuple[int, StorageVersionMigration]]:
    found = []
    for m in existing:
        number = verification_number(request, m.metadata.name or "")
        if number is not None:
            found.append((number, m))
    return sorted(found, key=lambda pair: pair[0])


def latest_verification(
    request: str, existing: Sequence[StorageVersionMigration], *, group: str, plural: str, key: str
) -> StorageVersionMigration | None:
    """The newest verification pass of ``request`` made for this resource and key (the one that counts)."""
    ours = [m for _, m in _passes(request, existing)
            if not foreign_request(m, resource=storage_state_name(group, plural), group=group, plural=plural, key=key)]  # fmt: skip
    return ours[-1] if ours else None


VerifyAction = Literal["create", "run", "done", "blocked"]


class VerificationStep(BaseModel):
    """What the rotation does about the proof of one resource, under the configuration the servers run now."""

    model_config = ConfigDict(frozen=True)

    resource: str = Field(description="``<resource>[.<group>]``.")
    request: str = Field(description="The rotation's request of the resource (``secrets-key2``).")
    name: str = Field(description="The verification pass to create, run, or that stands as the proof.")
    action: VerifyAction = Field(
        description=(
            "create: a new pass (none yet, or the newest proves nothing under the configuration the servers run "
            "now); run: pending or Running (run or resume it); done: the newest pass proves it under that "
            "configuration (nothing to write); blocked: a person must act first."
        )
    )
    reason: str = ""
    supersedes: str | None = Field(default=None, description="The earlier pass the new one is made after.")
    supersedes_config_hash: str | None = Field(default=None, description="The configuration that one ran under.")
    configuration_changed: bool = Field(
        default=False, description="The new pass is made because the servers' configuration changed since that one."
    )


def _new_pass(resource: str, request: str, passes: list[tuple[int, StorageVersionMigration]],
              latest: StorageVersionMigration, reason: str, *, changed: bool) -> VerificationStep:  # fmt: skip
    number = passes[-1][0] + 1  # after every pass of the name, whoever made it
    return VerificationStep(
        resource=resource, request=request, name=verification_name(request, number), action="create",
        reason=reason, supersedes=latest.metadata.name, supersedes_config_hash=latest.status.encryption_config_hash,
        configuration_changed=changed,
    )  # fmt: skip


def plan_verification(
    *,
    request: str,
    group: str,
    plural: str,
    key: str,
    existing: Sequence[StorageVersionMigration],
    config_hash: str | None,
) -> VerificationStep:
    """The step for the proof of ``request`` (a rotation's request that has Succeeded), under
    ``config_hash``, the configuration every API server runs now (None: no one configuration, the
    operator's override): a new pass only where the newest does not prove it under that configuration.

    | newest pass | ran under | outcome | step |
    | --- | --- | --- | --- |
    | none | | | create ``-verify`` |
    | pending, Running | | | run it |
    | outdated (annotated) | | | a new pass |
    | Succeeded | ``config_hash`` | rewrote nothing | done: the proof stands, nothing written |
    | Succeeded | ``config_hash`` | rewrote some | a new pass (the last one wrote them: prove again) |
    | Succeeded, Failed | another, or unknown | | a new pass, under ``config_hash`` |
    | Failed | ``config_hash`` | | blocked: its failures are the servers' answer now |
    """
    resource = storage_state_name(group, plural)
    passes = _passes(request, existing)
    first = verify_name(request)
    taken = next((m for n, m in passes if n == 1), None)
    if taken is not None:
        foreign = foreign_request(taken, resource=resource, group=group, plural=plural, key=key)
        if foreign:
            return VerificationStep(resource=resource, request=request, name=first, action="blocked", reason=foreign)
    latest = latest_verification(request, existing, group=group, plural=plural, key=key)
    if latest is None:
        return VerificationStep(resource=resource, request=request, name=first, action="create",
                                reason="no verification pass yet")  # fmt: skip
    name = latest.metadata.name or first
    phase = phase_from_conditions(latest.status.conditions)
    if phase in ("Pending", "Running"):
        return VerificationStep(resource=resource, request=request, name=name, action="run",
                                reason=f"{phase}: run or resume it")  # fmt: skip
    ran_under = latest.status.encryption_config_hash
    progress = latest.status.progress
    rewrote = progress.rewritten if progress is not None else 0
    outdated = (latest.metadata.annotations or {}).get(OUTDATED_ANNOTATION)
    if outdated:
        return _new_pass(resource, request, passes, latest,
                         f"{name} no longer proves it: {outdated}; proven again under what the servers run now",
                         changed=True)  # fmt: skip
    if config_hash is not None and ran_under != config_hash:
        return _new_pass(resource, request, passes, latest,
                         f"the API servers' encryption configuration changed since {name} ({phase}) ran under "
                         f"{short_hash(ran_under)}: every one runs {short_hash(config_hash)} now, so it is proven "
                         "again under that", changed=True)  # fmt: skip
    if phase == "Failed":
        return VerificationStep(
            resource=resource, request=request, name=name, action="blocked",
            reason=(f"{MIGRATIONS_KIND_NAME}/{name} has Failed under the configuration the API servers run now; "
                    f"see its status.failures, fix the cause, then delete it (kubectl delete {MIGRATIONS_KIND_NAME} "
                    f"{name}) and run the rotation again"),
        )  # fmt: skip
    if rewrote:
        return _new_pass(resource, request, passes, latest,
                         f"{name} rewrote {rewrote} object(s): they were not under the write key then; proven "
                         "again", changed=False)  # fmt: skip
    return VerificationStep(resource=resource, request=request, name=name, action="done",
                            reason=f"{name} proves it under {short_hash(ran_under)}, which the servers still run")  # fmt: skip
