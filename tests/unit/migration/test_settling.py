"""The decision "is this 401/403 a settling API server?" as a table, and its parts.

Issue "A restarting API server fails objects for good": "A 403 or 401 right
after connection errors or a `/readyz` failure is not an answer about the
object: retry it with backoff while the server is settling, retry every failed
object once more before the run ends, and fail only what still fails."
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kubesim.health import Warmup, forbidden, health_answer
from storage_migrator.kube.answers import error_from_answer, from_transport_error
from storage_migrator.kube.errors import KubeError, is_server_trouble, is_settling_answer
from storage_migrator.migration.settling import RetryStep, ServerTrouble, retry_step


def answer(code: int, reason: str = "") -> KubeError:
    return error_from_answer(code=code, http_reason=reason or None, headers=None, body=None, what="PATCH secrets a/b")


REFUSED = from_transport_error(ConnectionRefusedError("[Errno 111] Connection refused"), what="PATCH secrets a/b")


@dataclass(frozen=True)
class Case:
    error: KubeError
    settling: bool  # what the server looks like (recent trouble or /readyz failing)
    expected: RetryStep
    attempt: int = 0
    settled_for: float = 0.0


CASES = {
    "403 while the server settles: wait": Case(answer(403, "Forbidden"), True, "settle"),
    "401 while the server settles: wait": Case(answer(401, "Unauthorized"), True, "settle"),
    "403 from a healthy server: an answer about the object": Case(answer(403, "Forbidden"), False, "fail"),
    "401 from a healthy server: fail": Case(answer(401, "Unauthorized"), False, "fail"),
    "403 past the settle budget: fail": Case(answer(403, "Forbidden"), True, "fail", settled_for=120.0),
    "403 settle waits are no attempts": Case(answer(403, "Forbidden"), True, "settle", attempt=5),
    "422 webhook denial even while settling: fail (issue #83)": Case(answer(422, "Invalid"), True, "fail"),
    "400 while settling: fail": Case(answer(400, "BadRequest"), True, "fail"),
    "503: ordinary retry": Case(answer(503), False, "retry"),
    "connection refused: ordinary retry": Case(REFUSED, False, "retry"),
    "429: ordinary retry": Case(answer(429), True, "retry"),
    "503 on the last attempt: fail": Case(answer(503), True, "fail", attempt=5),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_retry_step(case: Case) -> None:
    """One policy decides: transient codes on the attempt budget, 401/403 on the
    settle budget only while the server settles, everything else fails."""
    asked: list[bool] = []

    def server_settling() -> bool:
        asked.append(True)
        return case.settling

    step = retry_step(case.error, attempt=case.attempt, max_attempts=6, settled_for=case.settled_for,
                      settle_timeout=120.0, server_settling=server_settling)  # fmt: skip
    assert step == case.expected
    if case.error.code not in (401, 403):
        assert not asked  # the /readyz probe is only spent on a 401/403


def test_error_predicates() -> None:
    assert is_settling_answer(answer(403)) and is_settling_answer(answer(401))
    assert not is_settling_answer(answer(404)) and not is_settling_answer(REFUSED)
    assert is_server_trouble(REFUSED) and is_server_trouble(answer(500)) and is_server_trouble(answer(503))
    assert not is_server_trouble(answer(429)) and not is_server_trouble(answer(403))


def test_server_trouble_remembers_failures_for_its_window() -> None:
    """After "connection errors", trouble makes a 403 suspect for N seconds, then no longer."""
    now = [100.0]
    trouble = ServerTrouble(window_seconds=60.0, clock=lambda: now[0])
    assert not trouble.recent()
    trouble.saw(answer(403))
    trouble.saw(answer(429))
    assert not trouble.recent()
    trouble.saw(REFUSED)
    now[0] += 59.0
    assert trouble.recent()
    now[0] += 2.0
    assert not trouble.recent()
    trouble.saw(answer(504))
    assert trouble.recent()


def test_kubesim_warmup_answers_like_kube_apiserver() -> None:
    """kubesim's window: the RBAC denial worded as k8s.io/apiserver words it, and
    /readyz failing poststarthook/rbac/bootstrap-roles."""
    now = [0.0]
    warmup = Warmup(2.0, clock=lambda: now[0])
    assert warmup.active()
    now[0] = 2.0
    assert not warmup.active()
    err = forbidden(verb="patch", group="", resource="secrets", subresource=None, namespace="default", name="s-1",
                    user="system:serviceaccount:storage-migrator:storage-migrator")  # fmt: skip
    assert err.body() == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": 'secrets "s-1" is forbidden: User "system:serviceaccount:storage-migrator:storage-migrator" '
                   'cannot patch resource "secrets" in API group "" in the namespace "default"',
        "reason": "Forbidden", "details": {"name": "s-1", "kind": "secrets"}, "code": 403,
    }  # fmt: skip
    listing = forbidden(verb="list", group="example.com", resource="widgets", subresource=None, namespace=None,
                        name=None, user="u")  # fmt: skip
    assert listing.message == (
        'widgets.example.com is forbidden: User "u" cannot list resource "widgets" in API group "example.com" '
        "at the cluster scope"
    )
    code, body = health_answer("/readyz", warming=True)
    assert code == 500
    assert b"[-]poststarthook/rbac/bootstrap-roles failed: reason withheld\n" in body
    assert body.endswith(b"readyz check failed\n")
    assert health_answer("/readyz", warming=False) == (200, b"ok")
    assert health_answer("/livez", warming=True) == (200, b"ok")
