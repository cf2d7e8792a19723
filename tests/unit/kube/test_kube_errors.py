"""The one HTTP-answer-to-exception table (storage_migrator.kube.errors).

Bodies come from answers recorded from a real kube-apiserver v1.36.2
(tests/reference), plus the two 429 shapes DESIGN 6 names.
"""

from __future__ import annotations

import json
import pickle

import pytest
from kubernetes.client.exceptions import ApiException
from recorded import REFERENCE

from storage_migrator.kube import errors
from storage_migrator.kube.answers import error_from_answer, from_api_exception, from_transport_error
from storage_migrator.kube.errors import (
    AlreadyExists,
    BadRequest,
    Conflict,
    Expired,
    Forbidden,
    Invalid,
    KubeError,
    MethodNotAllowed,
    NotFound,
    ServerError,
    TooManyRequests,
    TransportError,
    is_retriable,
)

SENTINEL = "s3cr3t-SENTINEL-do-not-leak"


def recorded(name: str) -> tuple[int, bytes]:
    """A recorded answer: the Status body and the 'HTTP NNN' line after it."""
    text = (REFERENCE / name).read_text()
    body, _, code_line = text.rpartition("HTTP ")
    return int(code_line.strip()), body.strip().encode()


@pytest.mark.parametrize(
    ("name", "cls", "reason"),
    [
        ("list-expired-410.txt", Expired, "Expired"),
        ("patch-stale-rv-409.txt", Conflict, "Conflict"),
        ("unknown-resource-404.txt", NotFound, "NotFound"),
        ("list-on-create-only-405.txt", MethodNotAllowed, "MethodNotAllowed"),
    ],
)
def test_recorded_status_answers_map_to_their_class(name: str, cls: type[KubeError], reason: str) -> None:
    code, body = recorded(name)
    err = error_from_answer(code=code, http_reason="x", headers={}, body=body, what="LIST cm")
    assert type(err) is cls
    assert err.code == code
    assert err.reason == reason
    assert err.message == json.loads(body)["message"]
    assert err.status_object is not None and err.status_object["code"] == code


def test_expired_carries_the_inconsistent_continue_token() -> None:
    code, body = recorded("list-expired-410.txt")
    err = error_from_answer(code=code, http_reason="Gone", headers={}, body=body, what="LIST")
    assert isinstance(err, Expired) and isinstance(err, errors.Gone)
    assert err.continue_token == json.loads(body)["metadata"]["continue"]


def test_expired_without_token_means_restart() -> None:
    body = json.dumps({"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})
    err = error_from_answer(code=410, http_reason="Gone", headers={}, body=body, what="LIST")
    assert isinstance(err, Expired)
    assert err.continue_token is None


def test_conflict_message_is_the_exact_status_message() -> None:
    code, body = recorded("patch-stale-rv-409.txt")
    err = error_from_answer(code=code, http_reason="Conflict", headers={}, body=body, what="PATCH")
    assert 'Operation cannot be fulfilled on configmaps "ref-10"' in str(err)
    assert err.continue_token is None


def test_429_plain_text_priority_and_fairness_with_retry_after_header() -> None:
    err = error_from_answer(
        code=429,
        http_reason="Too Many Requests",
        headers={"Retry-After": "1", "Content-Type": "text/plain; charset=utf-8"},
        body=b"Too many requests, please try again later.\n",
        what="PATCH secrets default/s",
    )
    assert isinstance(err, TooManyRequests)
    assert err.retry_after == 1.0
    assert err.message == "Too many requests, please try again later."
    assert err.status_object is None
    assert is_retriable(err)


def test_429_status_with_details_retry_after_seconds() -> None:
    body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": "storage is (re)initializing",
            "reason": "TooManyRequests",
            "details": {"retryAfterSeconds": 3},
            "code": 429,
        }
    )
    err = error_from_answer(code=429, http_reason="", headers={}, body=body, what="LIST")
    assert isinstance(err, TooManyRequests)
    assert err.retry_after == 3.0


def test_retry_after_header_wins_over_details() -> None:
    body = json.dumps({"kind": "Status", "code": 429, "details": {"retryAfterSeconds": 9}})
    err = error_from_answer(code=429, http_reason="", headers={"retry-after": "2"}, body=body, what="x")
    assert err.retry_after == 2.0


def test_retry_after_http_date_is_understood() -> None:
    err = error_from_answer(
        code=503,
        http_reason="Service Unavailable",
        headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"},
        body=b"",
        what="x",
    )
    assert err.retry_after == 0.0  # a date in the past: retry now


@pytest.mark.parametrize(
    ("code", "reason", "cls", "retriable"),
    [
        (400, "BadRequest", BadRequest, False),
        (403, "Forbidden", Forbidden, False),
        (404, "NotFound", NotFound, False),
        (405, "MethodNotAllowed", MethodNotAllowed, False),
        (409, "Conflict", Conflict, False),
        (409, "AlreadyExists", AlreadyExists, False),
        (410, "Expired", Expired, False),
        (422, "Invalid", Invalid, False),
        (429, "TooManyRequests", TooManyRequests, True),
        (500, "InternalError", ServerError, True),
        (502, "", ServerError, False),
        (503, "ServiceUnavailable", ServerError, True),
        (504, "Timeout", ServerError, True),
        (418, "", KubeError, False),
    ],
)
def test_mapping_and_retriability_table(code: int, reason: str, cls: type[KubeError], retriable: bool) -> None:
    body = json.dumps({"kind": "Status", "code": code, "reason": reason, "message": "m"})
    err = error_from_answer(code=code, http_reason="phrase", headers={}, body=body, what="x")
    assert type(err) is cls
    assert is_retriable(err) is retriable


def test_transport_errors_are_retriable() -> None:
    err = from_transport_error(ConnectionResetError("reset by peer"), what="PATCH cm a/b")
    assert isinstance(err, TransportError)
    assert err.code == 0
    assert is_retriable(err)


def test_other_exceptions_are_not_retriable() -> None:
    assert not is_retriable(ValueError("x"))


def test_non_status_json_body_is_dropped() -> None:
    """A JSON body that is not a Status may be an object: never kept."""
    body = json.dumps({"kind": "Secret", "data": {"k": SENTINEL}})
    err = error_from_answer(code=500, http_reason="Internal", headers={}, body=body, what="x")
    assert SENTINEL not in str(err) and SENTINEL not in repr(err)
    assert err.status_object is None
    assert SENTINEL not in err.message


def test_str_and_repr_never_include_the_body_outside_message() -> None:
    body = json.dumps(
        {
            "kind": "Status",
            "code": 422,
            "reason": "Invalid",
            "message": "denied by webhook",
            "details": {"causes": [{"field": "data", "message": SENTINEL}]},
            "extra": SENTINEL,
        }
    )
    err = error_from_answer(code=422, http_reason="", headers={}, body=body, what="PUT s")
    assert SENTINEL not in str(err)
    assert SENTINEL not in repr(err)
    assert "denied by webhook" in str(err)


def test_api_exception_is_scrubbed_so_a_chained_cause_cannot_leak() -> None:
    exc = ApiException(status=409, reason="Conflict")
    exc.body = json.dumps(
        {
            "kind": "Status",
            "code": 409,
            "reason": "Conflict",
            "message": "modified",
            "x": SENTINEL,
        }
    )
    exc.headers = {"Retry-After": "4", "X-Echo": SENTINEL}
    err = from_api_exception(exc, what="PUT secrets ns/s")
    assert isinstance(err, Conflict)
    assert err.retry_after == 4.0
    try:
        raise err from exc
    except KubeError as raised:
        import traceback

        text = "".join(traceback.format_exception(raised))
    assert SENTINEL not in text
    assert SENTINEL not in str(exc)


def test_api_exception_without_status_is_a_transport_error() -> None:
    err = from_api_exception(ApiException(status=0, reason="SSLError\nbad cert"), what="GET")
    assert isinstance(err, TransportError)
    assert is_retriable(err)


def test_long_messages_are_shortened_in_str() -> None:
    body = json.dumps({"kind": "Status", "code": 400, "message": "x" * 5000})
    err = error_from_answer(code=400, http_reason="", headers={}, body=body, what="w")
    assert len(str(err)) < errors.MAX_MESSAGE_CHARS + 100


def test_errors_survive_pickling() -> None:
    """Prefect pickles exceptions into task states."""
    code, body = recorded("list-expired-410.txt")
    err = error_from_answer(code=code, http_reason="Gone", headers={}, body=body, what="LIST")
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is Expired
    assert copy.continue_token == err.continue_token
    assert str(copy) == str(err)
