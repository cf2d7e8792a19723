"""Which verification pass proves a rotation under the configuration the servers run now (issue 39), as tables.

Issue 39: "A rotation run whose earlier verification was made under another
configuration proves again under the current one, on its own. It gets a new
verification pass (named so that both stay in the record), writes nothing where
nothing is due, and gives its verdict. No object has to be deleted by hand for a
rerun." And: "The verdict and every message speak of the configuration the
servers run now."
"""

from __future__ import annotations

import pytest
from rotation_requests import rotation_request

from storage_migrator.kube.errors import KubeError
from storage_migrator.models import MigrationProgress, StorageVersionMigration
from storage_migrator.rotation.decisions import InvalidKeyName, request_name
from storage_migrator.rotation.proofs import (
    MAX_PASSES,
    OUTDATED_ANNOTATION,
    latest_verification,
    plan_verification,
    verification_name,
    verification_number,
)
from storage_migrator.rotation.unreadable import Unreadable, unreadable_objects
from storage_migrator.rotation.verdict import ServerCheckResult, rotation_verdict, summarize_resource

A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64
P = MigrationProgress


def svm(name: str, state: str = "new", *, under: str | None = None, progress: MigrationProgress | None = None,
        key: str | None = "key2", resource: str = "secrets") -> StorageVersionMigration:  # fmt: skip
    """A pass that listed and found unchanged 5 objects unless `progress` says otherwise."""
    return rotation_request(name, state, under=under, key=key, resource=resource,
                            progress=progress if progress is not None else P(listed=5, unchanged=5))  # fmt: skip


def test_pass_names_count_up_and_stay_within_kubernetes_limits() -> None:
    assert [verification_name("secrets-key2", n) for n in (1, 2, 10)] == [
        "secrets-key2-verify", "secrets-key2-verify-2", "secrets-key2-verify-10"]  # fmt: skip
    assert [verification_number("secrets-key2", n) for n in (
        "secrets-key2-verify", "secrets-key2-verify-2", "secrets-key2-verify-0", "secrets-key2-verify-x",
        "secrets-key2-verify-1", "secrets-key2", "secrets-key2-verify-2-verify")] == [1, 2, None, None, None, None, None]  # fmt: skip
    # The longest key a request name takes still leaves room for the 99,999,999th pass within 253 characters.
    longest = next(request_name(resource="secrets", group="", key="k" * n) for n in range(240, 0, -1)
                   if _fits(n))  # fmt: skip
    assert len(verification_name(longest, MAX_PASSES)) <= 253
    with pytest.raises(InvalidKeyName, match="253"):
        request_name(resource="secrets", group="", key="k" * (len(longest) - len("secrets-") + 1))


def _fits(n: int) -> bool:
    try:
        request_name(resource="secrets", group="", key="k" * n)
    except InvalidKeyName:
        return False
    return True


def _outdated(m: StorageVersionMigration) -> StorageVersionMigration:
    m.metadata.annotations = {**(m.metadata.annotations or {}),
                              OUTDATED_ANNOTATION: f"the API servers ran {B[:19]}… at 2026-11-28T00:00:00Z"}  # fmt: skip
    return m


STEPS = [
    # (existing passes, the servers' configuration now, action, name, reason contains, changed)
    ([], A, "create", "secrets-key2-verify", "no verification pass yet", False),
    ([svm("secrets-key2-verify")], A, "run", "secrets-key2-verify", "Pending", False),
    ([svm("secrets-key2-verify", "running", under=A)], A, "run", "secrets-key2-verify", "Running", False),
    # The proof stands: nothing to write (the rerun of issue 11).
    ([svm("secrets-key2-verify", "succeeded", under=A)], A, "done", "secrets-key2-verify", "still run", False),
    # Issue 39: the old key removed (another configuration): a new pass, the old one kept.
    (
        [svm("secrets-key2-verify", "succeeded", under=A)],
        B,
        "create",
        "secrets-key2-verify-2",
        "configuration changed since secrets-key2-verify",
        True,
    ),
    ([svm("secrets-key2-verify", "succeeded", under=None)], B, "create", "secrets-key2-verify-2", "unknown", True),
    # The newest counts: -verify-2 proves it under B; back under A (a read key added, then removed
    # again) a third pass, since writes went under B's write key in between.
    (
        [svm("secrets-key2-verify", "succeeded", under=A), svm("secrets-key2-verify-2", "succeeded", under=B)],
        B,
        "done",
        "secrets-key2-verify-2",
        "",
        False,
    ),
    (
        [svm("secrets-key2-verify", "succeeded", under=A), svm("secrets-key2-verify-2", "succeeded", under=B)],
        A,
        "create",
        "secrets-key2-verify-3",
        "changed",
        True,
    ),
    # A pass that rewrote objects proves nothing: the rerun proves again (no deletion by hand).
    (
        [svm("secrets-key2-verify", "succeeded", under=A, progress=P(listed=5, rewritten=2, unchanged=3))],
        A,
        "create",
        "secrets-key2-verify-2",
        "rewrote 2",
        False,
    ),
    # Failed under the configuration the servers still run: its failures are the answer; a person acts.
    ([svm("secrets-key2-verify", "failed", under=A)], A, "blocked", "secrets-key2-verify", "fix the cause", False),
    # Failed under another (e.g. the old key was missing then, and is back now): proven again.
    ([svm("secrets-key2-verify", "failed", under=A)], B, "create", "secrets-key2-verify-2", "changed", True),
    # The first name taken by another key's request: not ours to judge.
    (
        [svm("secrets-key2-verify", "succeeded", under=A, key="key9")],
        A,
        "blocked",
        "secrets-key2-verify",
        "rename or delete it",
        False,
    ),
    # A later number taken by something else: skipped over, never judged as ours.
    (
        [
            svm("secrets-key2-verify", "succeeded", under=A),
            svm("secrets-key2-verify-2", "succeeded", under=B, resource="configmaps"),
        ],
        B,
        "create",
        "secrets-key2-verify-3",
        "changed since secrets-key2-verify ",
        True,
    ),
    # A later run saw the servers on another configuration and proved nothing under it (objects lost, servers
    # that differed): writes may have gone under another key then, so back under A the pass proves nothing.
    (
        [_outdated(svm("secrets-key2-verify", "succeeded", under=A))],
        A,
        "create",
        "secrets-key2-verify-2",
        "no longer proves it: the API servers ran",
        True,
    ),
    # The operator's override with servers that differ (no one configuration): the newest pass as it is.
    ([svm("secrets-key2-verify", "succeeded", under=A)], None, "done", "secrets-key2-verify", "", False),
]


@pytest.mark.parametrize(("existing", "now", "action", "name", "reason", "changed"), STEPS)
def test_what_to_do_about_the_proof(existing: list[StorageVersionMigration], now: str | None, action: str, name: str,
                                    reason: str, changed: bool) -> None:  # fmt: skip
    step = plan_verification(request="secrets-key2", group="", plural="secrets", key="key2", existing=existing,
                             config_hash=now)  # fmt: skip
    assert (step.action, step.name, step.configuration_changed) == (action, name, changed), step
    assert reason in step.reason
    if action == "create" and existing:
        latest = latest_verification("secrets-key2", existing, group="", plural="secrets", key="key2")
        assert latest is not None and step.supersedes == latest.metadata.name


# ----- the loss: what a refused LIST says (kube-apiserver v1.36, KEP-3926) ------------------
def store_read_error(keys: list[str], *, truncated: bool = False) -> KubeError:
    causes = [{"reason": "UnexpectedServerResponse", "field": k, "message": "StorageError: corrupt object"}
              for k in keys]  # fmt: skip
    if truncated:
        causes.append({"reason": "FieldValueTooMany", "message": "too many errors, the list is truncated"})
    status = {"kind": "Status", "code": 500, "reason": "StorageReadError",
              "message": "failed to read one or more secrets from the storage",
              "details": {"kind": "secrets", "name": "list", "causes": causes}}  # fmt: skip
    return KubeError(code=500, reason="StorageReadError", message=str(status["message"]), what="LIST v1/secrets",
                     status_object=status)  # type: ignore[arg-type]  # fmt: skip


UNREADABLE = [
    (store_read_error(["/registry/secrets/ns/a", "/registry/secrets/ns/b"]), ["ns/a", "ns/b"], "2 object(s)"),
    (store_read_error([f"/registry/secrets/ns/s-{i}" for i in range(100)], truncated=True), None,
     "more than 100 object(s)"),
    # Another etcd prefix (--etcd-prefix) and a cluster-scoped resource still give the names.
    (store_read_error(["/custom/registry/secrets/ns/a"]), ["ns/a"], "1 object(s)"),
    # An older server, or the gate off: 500 at the first value; at least that one.
    (KubeError(code=500, reason="InternalError", what="LIST v1/secrets",
               message='unable to transform key "/registry/secrets/ns/a": no matching prefix found'),
     ["ns/a"], "at least 1 object(s)"),
    (KubeError(code=500, reason="InternalError", what="LIST v1/secrets",
               message="unable to transform key '/registry/secrets/ns/a' of secrets: no read key named 'key1'"),
     ["ns/a"], "at least 1 object(s)"),
]  # fmt: skip


@pytest.mark.parametrize(("error", "objects", "described"), UNREADABLE)
def test_a_refused_read_names_what_is_lost(error: KubeError, objects: list[str] | None, described: str) -> None:
    lost = unreadable_objects(error, resource="secrets")
    assert lost is not None and lost.describe() == described
    if objects is not None:
        assert lost.objects == objects


@pytest.mark.parametrize(
    "error",
    [
        KubeError(code=500, reason="InternalError", message="etcdserver: request timed out", what="LIST"),
        KubeError(code=503, reason="ServiceUnavailable", message="", what="LIST"),
        KubeError(code=403, reason="Forbidden", message='User "x" cannot list resource', what="LIST"),
    ],
)
def test_other_failures_are_no_loss(error: KubeError) -> None:
    assert unreadable_objects(error, resource="secrets") is None


# ----- the three verdicts of a rerun (issue 39) ----------------------------------------------
DONE = svm("secrets-key2", "succeeded", under=A, progress=P(listed=5, rewritten=5))
FIRST = svm("secrets-key2-verify", "succeeded", under=A)
SECOND = svm("secrets-key2-verify-2", "succeeded", under=B)


def _rerun(now: str, *, lost: Unreadable | None = None, second: StorageVersionMigration | None = SECOND) -> str:
    step = plan_verification(request="secrets-key2", group="", plural="secrets", key="key2", existing=[DONE, FIRST],
                             config_hash=now)  # fmt: skip
    servers = ServerCheckResult(config_hash=now)
    result = summarize_resource("secrets", "secrets-key2", DONE, second if lost is None else FIRST, servers=servers,
                                step=step, unreadable=lost)  # fmt: skip
    verdict = rotation_verdict([result], key="key2", servers=servers)
    assert verdict.completed is (lost is None), verdict.message
    return verdict.message


def test_the_old_key_gone_and_everything_under_the_write_key() -> None:
    message = _rerun(B)
    assert f"Proven under encryption configuration {B}, which every API server runs" in message
    assert "changed since the last proof (secrets-key2-verify under sha256:aaaaaaaaaaaa…)" in message
    assert "secrets-key2-verify-2" in message and "key2 is still the write key under it" in message
    assert "if the old key is gone, nothing was lost with it" in message
    assert "Do not remove" not in message and "delete" not in message


def test_the_old_key_gone_with_objects_still_under_it_is_a_loss_with_its_count() -> None:
    message = _rerun(B, lost=Unreadable(objects=["ns/a", "ns/b", "ns/c"]))
    assert f"not proven under encryption configuration {B}, which every API server runs now" in message
    assert "LOST: 3 object(s) cannot be read" in message and "ns/a, ns/b, ns/c" in message
    assert "put the old key back as a read key on every API server" in message
    assert "Do not remove the old key yet" not in message  # it is gone: that advice would be wrong


def test_servers_that_differ_give_no_verdict_and_no_advice_about_keys() -> None:
    servers = ServerCheckResult(config_hash=None, why="the API servers do not all run one configuration now (x, y)")
    result = summarize_resource("secrets", "secrets-key2", DONE, FIRST, servers=servers)
    verdict = rotation_verdict([result], key="key2", servers=servers)
    assert not verdict.completed
    assert "No verdict while the API servers differ" in verdict.message
    assert "Do not remove the old key yet" not in verdict.message


def test_a_rotation_not_done_keeps_the_old_key_whatever_the_servers_run() -> None:
    """A first run whose request failed while the servers changed: the old key is still needed."""
    servers = ServerCheckResult(config_hash=None, why="the API servers do not all run one configuration now (x, y)")
    failed = svm("secrets-key2", "failed", under=A, progress=P(listed=5, rewritten=2))
    verdict = rotation_verdict([summarize_resource("secrets", "secrets-key2", failed, None, servers=servers)],
                               key="key2", servers=servers)  # fmt: skip
    assert not verdict.completed and "Do not remove the old key yet" in verdict.message
