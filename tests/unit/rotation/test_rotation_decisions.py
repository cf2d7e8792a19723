"""The decisions of rotate-encryption-key (issue 11 item 2; seed 003), as tables.

Seed 003: "Where do we store state of the last successful migration of a
resource? We don't want to run a migration again if it was successful. The
StorageVersionMigration resource can serve as a record of a successful
migration." Issue 11: requests are "named from the resource and the key, so a
second run of the same rotation finds them Succeeded and does nothing"; "The
flow run ends Completed only when every resource is proven; otherwise Failed,
naming the objects and saying in words: do not remove the old key yet."
"""

from __future__ import annotations

import pytest
from rotation_requests import rotation_request as svm

from storage_migrator.models import MigrationProgress, StorageVersionMigration
from storage_migrator.rotation.decisions import (
    InvalidKeyName,
    plan_requests,
    request_name,
    verify_name,
)
from storage_migrator.rotation.verdict import (
    ResourceRotation,
    ServerCheckResult,
    rotation_verdict,
    summarize_resource,
)

NAMES = [
    # (resource, group, key, name)
    ("secrets", "", "key2", "secrets-key2"),
    ("configmaps", "", "key2", "configmaps-key2"),
    ("routes", "route.openshift.io", "key2", "routes.route.openshift.io-key2"),
    ("Secrets", "", "aescbc-3", "secrets-aescbc-3"),
    ("secrets", "", "v1.1", "secrets-v1.1"),
]


@pytest.mark.parametrize(("resource", "group", "key", "name"), NAMES)
def test_request_names(resource: str, group: str, key: str, name: str) -> None:
    assert request_name(resource=resource, group=group, key=key) == name
    assert verify_name(name) == f"{name}-verify"


@pytest.mark.parametrize("key", ["", "Key2", "key_2", "key 2", "-key", "key-", "key/2", "k" * 250])
def test_a_key_that_cannot_be_in_a_name_is_refused(key: str) -> None:
    with pytest.raises(InvalidKeyName, match="key"):
        request_name(resource="secrets", group="", key=key)


STEPS = [
    # (existing requests, action, reason contains)
    ([], "create", "no request yet"),
    ([svm("secrets-key2")], "run", "Pending"),
    ([svm("secrets-key2", "running")], "run", "Running"),
    ([svm("secrets-key2", "succeeded")], "done", "Succeeded"),
    ([svm("secrets-key2", "succeeded", key=None)], "done", "Succeeded"),  # kubectl apply, no annotation
    ([svm("secrets-key2", "failed")], "blocked", "delete it"),
    ([svm("secrets-key2", resource="configmaps")], "blocked", "not for secrets"),
    ([svm("secrets-key2", key="other")], "blocked", "key other"),
    ([svm("secrets-key1", "failed")], "create", ""),  # another key's request is not ours
]


@pytest.mark.parametrize(("existing", "action", "reason"), STEPS)
def test_what_to_do_with_each_request(existing: list[StorageVersionMigration], action: str, reason: str) -> None:
    [step] = plan_requests([("", "secrets")], existing, key="key2")
    assert (step.name, step.action) == ("secrets-key2", action)
    assert reason in step.reason


P = MigrationProgress
OK = svm("secrets-key2", "succeeded", progress=P(listed=10, rewritten=10))
PROOF = svm("secrets-key2-verify", "succeeded", progress=P(listed=10, unchanged=8, conflicted=2))

VERDICTS = [
    # (request, verification, verified, note contains)
    (OK, PROOF, True, ""),
    (OK, svm("v", "succeeded", progress=P(listed=10, rewritten=1, unchanged=9)), False, "rewrote 1"),
    (
        OK,
        svm("v", "failed", progress=P(listed=10, unchanged=9, failed=1), failures=["late"]),
        False,
        "could not write 1",
    ),
    (OK, None, False, "Missing"),
    (OK, svm("v", "running"), False, "Running"),
    (
        svm("r", "failed", progress=P(listed=10, rewritten=9, failed=1), failures=["bad"]),
        None,
        False,
        "1 object(s) could not be rewritten",
    ),
    (None, None, False, "Missing"),
    (svm("r", "running"), None, False, "Running"),
]


@pytest.mark.parametrize(("request_", "verification", "verified", "note"), VERDICTS)
def test_a_resource_is_verified_only_when_the_second_pass_rewrote_nothing(
    request_: StorageVersionMigration | None, verification: StorageVersionMigration | None, verified: bool, note: str
) -> None:
    result = summarize_resource("secrets", "secrets-key2", request_, verification)
    assert result.verified is verified
    assert note in result.note


def rot(resource: str, verified: bool, objects: list[str] = ()) -> ResourceRotation:  # type: ignore[assignment]
    return ResourceRotation(resource=resource, migration=f"{resource}-key2", phase="Succeeded",
                            verify_migration=f"{resource}-key2-verify", verified=verified,
                            failed_objects=objects, note="" if verified else "why")  # fmt: skip


def test_completed_only_when_every_resource_is_proven() -> None:
    ok = rotation_verdict([rot("secrets", True), rot("configmaps", True)], key="key2")
    assert ok.completed and "may be removed" in ok.message

    bad = rotation_verdict([rot("secrets", False, ["ns/bad"]), rot("configmaps", True)], key="key2")
    assert not bad.completed
    assert "secrets: why" in bad.message and "ns/bad" in bad.message and "configmaps" not in bad.message
    assert "Do not remove the old key yet" in bad.message

    assert not rotation_verdict([], key="key2").completed  # nothing proven is not a proof


# ----- issue 19: the proof holds under the configuration every API server runs --------------
def _verified(config_hash: str | None) -> tuple[StorageVersionMigration, StorageVersionMigration]:
    done = svm("secrets-key2", "succeeded", progress=MigrationProgress(listed=3, rewritten=3))
    check = svm("secrets-key2-verify", "succeeded", progress=MigrationProgress(listed=3, unchanged=3))
    check.status.encryption_config_hash = config_hash
    return done, check


H1, H2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


@pytest.mark.parametrize(
    ("ran_under", "servers", "verified", "note"),
    [
        (H1, ServerCheckResult(config_hash=H1), True, ""),
        # changed during the run, after the proof: no object to delete by hand (issue 39), a rerun proves again
        (H1, ServerCheckResult(config_hash=H2), False, "run the rotation again, it proves it again"),
        (None, ServerCheckResult(config_hash=H1), False, "ran under encryption configuration unknown"),
        (H1, ServerCheckResult(config_hash=None, why="servers differ"), False, "servers differ"),
        (None, ServerCheckResult(config_hash=None, overridden=True), True, ""),  # the operator's risk
    ],
)
def test_a_verification_pass_proves_only_under_what_every_server_runs_now(
    ran_under: str | None, servers: ServerCheckResult, verified: bool, note: str
) -> None:
    done, check = _verified(ran_under)
    result = summarize_resource("secrets", "secrets-key2", done, check, servers=servers)
    assert result.verified is verified and note in result.note
    verdict = rotation_verdict([result], key="key2", servers=servers)
    assert verdict.completed is verified
    if verified and not servers.overridden:
        assert f"Proven under encryption configuration {H1}" in verdict.message
    if servers.overridden:
        assert "OVERRIDDEN" in verdict.message
