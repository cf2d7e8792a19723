"""What is recorded about a failed object (issue 12 item 6), and what a poll's events are built from."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from storage_migrator.detection.actions import CreateMigration, UpdateState
from storage_migrator.detection.changes import PollChanges
from storage_migrator.kube.errors import Forbidden, KubeError, StatusDict
from storage_migrator.migration.failures import DENIED_PREFIX, fix_hint, object_failure, scrubbed_detail
from storage_migrator.migration.requests import failure_summary
from storage_migrator.models import UNKNOWN, ObjectFailure, StorageState

SENTINEL = "s3cr3t-sentinel-value"

# What kube-apiserver answers when an update fails validation (field.ErrorList -> StatusError):
# the message and every cause's message quote the value.
INVALID: StatusDict = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": f'ConfigMap "cm" is invalid: data.password: Invalid value: "{SENTINEL}": must be short',
    "reason": "Invalid",
    "details": {
        "name": "cm",
        "kind": "ConfigMap",
        "causes": [
            {
                "reason": "FieldValueInvalid",
                "message": f'Invalid value: "{SENTINEL}": must be short',
                "field": "data.password",
            },
            {"reason": "FieldValueRequired", "message": "Required value", "field": "data.user"},
        ],
    },
    "code": 422,
}


def _error(status: StatusDict | None, *, code: int = 422, reason: str = "Invalid") -> KubeError:
    message = status.get("message", "") if status else f"admission webhook denied the request: {SENTINEL}"
    return KubeError(code=code, reason=reason, message=message, what="PATCH configmaps ns/cm", status_object=status)


def test_a_422_is_recorded_as_field_paths_and_reasons_never_values() -> None:
    """Issue 12 item 6: "Record the object's namespace/name, the HTTP code, the Status
    reason and, for 422, the causes' field paths (no values)"."""
    failure = object_failure(namespace="ns", name="cm", exc=_error(INVALID))
    assert failure == ObjectFailure(
        namespace="ns", name="cm", code=422, reason="Invalid",
        message="fields: data.password (FieldValueInvalid), data.user (FieldValueRequired)",
    )  # fmt: skip
    assert SENTINEL not in failure.model_dump_json()


@pytest.mark.parametrize(("code", "reason"), [(400, "BadRequest"), (403, "Forbidden"), (500, "InternalError")])
def test_a_denial_without_causes_keeps_no_text(code: int, reason: str) -> None:
    """A webhook's denial is free text that may echo anything: nothing of it is kept."""
    failure = object_failure(namespace=None, name="w", exc=_error(None, code=code, reason=reason))
    assert (failure.code, failure.reason, failure.message) == (code, reason, "")
    assert scrubbed_detail(_error(None, code=code, reason=reason)) == ""


def test_the_summary_names_objects_and_says_what_to_do_without_old_free_text() -> None:
    """DESIGN 8: "A failure says what failed, on which object, and what to do"; a message
    recorded by an older version (free text) is left out."""
    failures = [
        object_failure(namespace="ns", name="cm", exc=_error(INVALID)),
        ObjectFailure(namespace="ns", name="old", code=403, reason="Forbidden", message=f"denied: {SENTINEL}"),
    ]
    summary = failure_summary(failures, 2)
    assert summary.startswith("2 object(s) could not be rewritten: ns/cm (422 Invalid: fields: data.password")
    assert "ns/old (403 Forbidden)" in summary
    assert "to fix: the object no longer passes validation" in summary
    assert SENTINEL not in summary


@pytest.mark.parametrize(
    ("code", "reason", "words"),
    [(422, "Invalid", "fields named"), (403, "Forbidden", "deployments/rbac/"), (400, "BadRequest", "webhook"),
     (0, "ConnectionError", "did not answer"), (500, "InternalError", "API server's log")],
)  # fmt: skip
def test_every_answer_has_a_fix_hint(code: int, reason: str, words: str) -> None:
    assert words in fix_hint(code, reason)


def _state(current: str, persisted: list[str]) -> StorageState:
    return StorageState.model_validate(
        {"metadata": {"name": "cronjobs.batch", "resourceVersion": "7"},
         "spec": {"resource": {"group": "batch", "resource": "cronjobs"}},
         "status": {"currentStorageVersionHash": current, "persistedStorageVersionHashes": persisted}}
    )  # fmt: skip


def _update(current: str, persisted: list[str], refined_by: str | None = None) -> UpdateState:
    return UpdateState(name="cronjobs.batch", resource_version="7", current_hash=current, persisted=persisted,
                       heartbeat=datetime.now(UTC), annotations={}, reason="r", refined_by=refined_by)  # fmt: skip


@pytest.mark.parametrize(
    ("old", "update", "changed", "refined"),
    [
        (_state("A", ["A"]), _update("A", ["A"]), None, None),  # a heartbeat
        (_state("A", ["A"]), _update("B", ["A", "B"]), ("A", "B"), None),  # seed 000: a new hash
        (_state("B", ["A", "B"]), _update("B", ["B"], refined_by="m-1"), None, ["A", "B"]),  # refined
        (_state("A", [UNKNOWN]), _update("A", ["A"], refined_by="m-1"), None, [UNKNOWN]),
        (None, _update("A", [UNKNOWN]), None, None),  # no object read: nothing to compare
    ],
)
def test_poll_changes_come_from_the_applied_update_and_the_object_it_replaced(
    old: StorageState | None, update: UpdateState, changed: tuple[str, str] | None, refined: list[str] | None
) -> None:
    changes = PollChanges()
    changes.add_update(update, old)
    assert [(c.previous_hash, c.current_hash) for c in changes.hash_changes] == ([changed] if changed else [])
    assert [r.previous_persisted for r in changes.refined] == ([refined] if refined else [])
    assert all(r.migration == "m-1" and r.current_hash == update.current_hash for r in changes.refined)


def test_a_request_is_recorded_by_the_name_the_api_gave_it() -> None:
    changes = PollChanges()
    action = CreateMigration(group="batch", version="v1", resource="cronjobs", target_hash="H", reason="r")
    changes.add_request(action, "cronjobs.batch-x1y2z")
    assert [(r.migration, r.state, r.target_hash) for r in changes.requested] == [
        ("cronjobs.batch-x1y2z", "cronjobs.batch", "H")
    ]


@pytest.mark.parametrize(
    ("reason", "kept"),
    [
        ("Invalid", "Invalid"),
        ("Service Unavailable", "Service Unavailable"),
        (f"denied: {SENTINEL}", ""),
        ("denied because the password is hunter", ""),
    ],
)
def test_only_a_reason_shaped_reason_is_kept(reason: str, kept: str) -> None:
    """A Status reason is an enum, but a webhook writes its own: free text is dropped."""
    assert object_failure(namespace="ns", name="cm", exc=_error(None, code=400, reason=reason)).reason == kept


def test_an_rbac_denial_is_recorded_as_the_permission_and_a_webhook_403_as_nothing() -> None:
    """Issue 14 (name the missing permission) within issue 12 item 6 (no content): an
    authorization denial keeps the permission (user, verb, resource, group, scope), and
    a 403 with free text (an admission webhook's) keeps nothing of its message."""
    denial = ('configmaps "cm" is forbidden: User "system:serviceaccount:sm:sm" cannot patch resource '
              '"configmaps" in API group "" in the namespace "ns"')  # fmt: skip
    rbac = object_failure(namespace="ns", name="cm", exc=Forbidden(code=403, reason="Forbidden", message=denial,
                                                                   what="PATCH configmaps ns/cm"))  # fmt: skip
    assert rbac.message == (f'{DENIED_PREFIX}User "system:serviceaccount:sm:sm" cannot patch resource "configmaps" '
                            'in API group "" in the namespace "ns"')  # fmt: skip
    webhook = object_failure(namespace="ns", name="cm", exc=Forbidden(
        code=403, reason="Forbidden", message=f"admission webhook denied: {SENTINEL}", what="PATCH configmaps ns/cm"))  # fmt: skip
    assert webhook.message == "" and SENTINEL not in failure_summary([webhook], 1)


def test_a_whole_run_verdict_quotes_the_answer_without_its_message() -> None:
    """Issue 12 item 6 for the verdicts that end a run (a LIST failing, a 405): a conversion
    webhook failing a LIST may quote an object in its message, so only the code, the reason
    and the field paths or the denied permission are kept."""
    from storage_migrator.migration.failures import answer_summary

    webhook = KubeError(code=500, reason="InternalError", what="LIST widgets",
                        message=f'conversion webhook for example.com/v2, Kind=Widget failed: "{SENTINEL}"')  # fmt: skip
    assert answer_summary(webhook) == "500 InternalError"
    assert (
        answer_summary(_error(INVALID))
        == "422 Invalid, fields: data.password (FieldValueInvalid), data.user (FieldValueRequired)"
    )
    denial = Forbidden(code=403, reason="Forbidden", what="LIST secrets",
                       message='secrets is forbidden: User "u" cannot list resource "secrets" in API group "" at the cluster scope')  # fmt: skip
    assert answer_summary(denial) == (
        '403 Forbidden, denied: User "u" cannot list resource "secrets" in API group "" at the cluster scope'
    )
    assert answer_summary(KubeError(code=0, reason="", message=SENTINEL, what="LIST x")) == "no answer"
