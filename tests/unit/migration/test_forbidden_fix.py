"""A 403 says which permission is missing and how to grant it (issue 14, item 4)."""

from __future__ import annotations

import json
import pickle

from storage_migrator.kube.answers import error_from_answer
from storage_migrator.kube.errors import RBAC_FIX, Forbidden
from storage_migrator.migration.failures import DENIED_PREFIX
from storage_migrator.migration.requests import failure_summary
from storage_migrator.models import ObjectFailure

USER = "system:serviceaccount:storage-migrator:storage-migrator"
DENIAL = f'User "{USER}" cannot patch resource "configmaps" in API group "" in the namespace "ns"'


def answer(message: str) -> Forbidden:
    body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                       "reason": "Forbidden", "code": 403})  # fmt: skip
    error = error_from_answer(code=403, http_reason="Forbidden", headers={}, body=body, what="PATCH configmaps ns/a")
    assert isinstance(error, Forbidden)
    return error


def test_an_rbac_denial_names_the_permission_and_the_fix() -> None:
    error = answer(f'configmaps "a" is forbidden: {DENIAL}')
    assert error.permission == DENIAL
    assert str(error) == f'PATCH configmaps ns/a: 403 Forbidden: configmaps "a" is forbidden: {DENIAL} ({RBAC_FIX})'
    assert "deployments/rbac/storage-migrator.yaml" in RBAC_FIX and "storage-migrator rbac" in RBAC_FIX
    assert str(pickle.loads(pickle.dumps(error))) == str(error)  # Prefect pickles task exceptions


def test_a_path_denial_is_one_too() -> None:
    assert (
        answer(f'forbidden: User "{USER}" cannot get path "/apis"').permission
        == f'User "{USER}" cannot get path "/apis"'
    )


def test_an_admission_denial_is_no_missing_permission() -> None:
    """A webhook or admission plugin also answers 403: no RBAC fix to offer."""
    error = answer('admission webhook "deny.example.com" denied the request: configmaps "a" is forbidden: frozen')
    assert error.permission is None and RBAC_FIX not in str(error)


def test_a_migration_whose_writes_are_denied_says_what_is_missing() -> None:
    """A denial is recorded as the permission it names (no content: issue 12 item 6) and
    summed up with its fix."""
    failures = [ObjectFailure(namespace="ns", name=f"a{i}", code=403, reason="Forbidden",
                              message=f"{DENIED_PREFIX}{DENIAL}") for i in range(5)]  # fmt: skip
    summary = failure_summary(failures, 5)
    assert summary.startswith(f"5 object(s) could not be rewritten: ns/a0 (403 Forbidden: {DENIED_PREFIX}User ")
    assert summary.endswith(f". Forbidden: {DENIAL}; {RBAC_FIX}")
    invalid = [ObjectFailure(namespace="ns", name="b", code=422, reason="Invalid", message="bad")]
    assert RBAC_FIX not in failure_summary(invalid, 1)
