"""Reading a failed HTTP answer of the Kubernetes API into one of our exceptions.

Design decision: the access layer's requests all end here when they fail
(``transport``, and the official client's ``ApiException``), so the class, the
server's hints (``Retry-After``, ``details.retryAfterSeconds``, causes) and the
scrubbing are decided once (STYLE "Do this" 2 and 3; classes: ``kube.errors``).

Security rule (DESIGN 8): the error carries the status code, the reason, the
``Status`` message and what the request concerned; never the response body. An
``ApiException`` is scrubbed in place before it can be chained as ``__cause__``.
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import Mapping
from typing import Final, cast

import urllib3
from kubernetes.client.exceptions import ApiException

from storage_migrator.kube.errors import (
    MAX_PLAIN_TEXT_CHARS,
    AlreadyExists,
    BadRequest,
    Conflict,
    Expired,
    Forbidden,
    Invalid,
    KubeError,
    MethodNotAllowed,
    NotAcceptable,
    NotFound,
    ServerError,
    StatusDict,
    TooManyRequests,
    TransportError,
    Unauthorized,
    UnsupportedMediaType,
    shorten,
)

__all__ = ["error_from_answer", "from_api_exception", "from_http_response", "from_transport_error"]

_CLASS_BY_CODE: Final[Mapping[int, type[KubeError]]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    406: NotAcceptable,
    409: Conflict,
    410: Expired,
    415: UnsupportedMediaType,
    422: Invalid,
    429: TooManyRequests,
}


def _class_for(code: int, reason: str) -> type[KubeError]:
    if code == 409 and reason == "AlreadyExists":
        return AlreadyExists
    if code >= 500:
        return ServerError
    return _CLASS_BY_CODE.get(code, KubeError)


def _decode_status(body: bytes) -> StatusDict | None:
    """Decode the body as a ``Status``; anything else is not kept (it may be an object)."""
    try:
        decoded = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(decoded, dict) and decoded.get("kind") == "Status":
        return cast(StatusDict, decoded)
    return None


def _is_json(body: bytes) -> bool:
    try:
        json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return False
    return True


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None


def _parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Read a Retry-After header: delay seconds or an HTTP date (RFC 9110 10.2.3)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        current = time.time() if now is None else now
        return max(0.0, when.timestamp() - current)
    if math.isnan(seconds) or math.isinf(seconds):
        return None
    return max(0.0, seconds)


def error_from_answer(
    *,
    code: int,
    http_reason: str | None,
    headers: Mapping[str, str] | None,
    body: bytes | str | None,
    what: str,
) -> KubeError:
    """Classify one non-2xx HTTP answer (the single mapping table of this project).

    The body is decoded as a ``Status`` when it is one; a plain-text body (the
    priority-and-fairness 429 says "Too many requests, please try again later.")
    is kept as a short reason; any other body is dropped unread.
    """
    raw = body.encode() if isinstance(body, str) else (body or b"")
    status_object = _decode_status(raw)
    reason = http_reason or ""
    message = ""
    retry_after = _parse_retry_after(_header(headers, "Retry-After"))
    continue_token: str | None = None
    if status_object is not None:
        reason = status_object.get("reason") or reason
        message = status_object.get("message", "")
        if retry_after is None:
            hint = status_object.get("details", {}).get("retryAfterSeconds")
            if isinstance(hint, int | float) and hint > 0:
                retry_after = float(hint)
        token = status_object.get("metadata", {}).get("continue")
        continue_token = token or None
    elif raw and not _is_json(raw):
        message = shorten(raw.decode("utf-8", errors="replace"), MAX_PLAIN_TEXT_CHARS)
    if not message:
        message = reason or f"HTTP {code}"
    if not reason:
        reason = f"HTTP {code}"
    cls = _class_for(code, reason)
    return cls(
        code=code,
        reason=reason,
        message=message,
        what=what,
        status_object=status_object,
        retry_after=retry_after,
        continue_token=continue_token if cls is Expired else None,
    )


def from_http_response(response: urllib3.BaseHTTPResponse, *, what: str) -> KubeError:
    """Classify a non-2xx urllib3 response (the raw path of ``transport``)."""
    return error_from_answer(
        code=response.status,
        http_reason=response.reason,
        headers=dict(response.headers.items()),
        body=response.data,
        what=what,
    )


def from_transport_error(exc: BaseException, *, what: str) -> TransportError:
    """Wrap a connection error or timeout (no HTTP answer) as a retriable error."""
    detail = shorten(str(exc), MAX_PLAIN_TEXT_CHARS)
    name = type(exc).__name__
    message = detail if detail.startswith(name) else f"{name}: {detail}" if detail else name
    return TransportError(code=0, reason=name, message=message, what=what)


def from_api_exception(exc: ApiException, *, what: str) -> KubeError:
    """Classify an ``ApiException`` of the official client, and scrub it.

    The exception is scrubbed in place (body, data, headers dropped) because
    callers chain it (``raise err from exc``) and ``str(exc)`` would print the
    whole response body into any traceback.
    """
    code = int(exc.status or 0)
    headers = cast("Mapping[str, str] | None", exc.headers)
    body = cast("str | bytes | None", exc.body)
    reason = cast("str | None", exc.reason)
    if code == 0:
        error: KubeError = TransportError(
            code=0,
            reason="TransportError",
            message=shorten(reason or "no answer", MAX_PLAIN_TEXT_CHARS),
            what=what,
        )
    else:
        error = error_from_answer(
            code=code,
            http_reason=reason,
            headers=dict(headers.items()) if headers else None,
            body=body,
            what=what,
        )
    exc.body = None
    exc.data = None
    exc.headers = None
    return error
