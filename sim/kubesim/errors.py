"""The `Status` answers kubesim gives, worded as kube-apiserver words them
(reference/*.txt hold the real ones)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class StatusError(Exception):
    """An answer with a `Status` body; raised anywhere below the HTTP handler."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        continue_token: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details  # None: no `details` key (as in a 410)
        self.continue_token = continue_token
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        meta: dict[str, Any] = {}
        if self.continue_token is not None:
            meta["continue"] = self.continue_token
        doc: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": meta,
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            doc["details"] = self.details
        doc["code"] = self.code
        return doc


def _details(resource: str, group: str, name: str | None) -> dict[str, Any]:
    details: dict[str, Any] = {}
    if name is not None:
        details["name"] = name
    if group:
        details["group"] = group
    details["kind"] = resource
    return details


def _qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, group: str, name: str) -> StatusError:
    return StatusError(
        404, "NotFound", f'{_qualified(resource, group)} "{name}" not found', details=_details(resource, group, name)
    )


def resource_not_found() -> StatusError:
    # reference/unknown-resource-404.txt
    return StatusError(404, "NotFound", "the server could not find the requested resource", details={})


def method_not_allowed() -> StatusError:
    # reference/list-on-create-only-405.txt
    return StatusError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource", details={}
    )


def already_exists(resource: str, group: str, name: str) -> StatusError:
    return StatusError(
        409,
        "AlreadyExists",
        f'{_qualified(resource, group)} "{name}" already exists',
        details=_details(resource, group, name),
    )


def conflict(resource: str, group: str, name: str) -> StatusError:
    # reference/patch-stale-rv-409.txt
    return StatusError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(resource, group)} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        details=_details(resource, group, name),
    )


def bad_request(message: str) -> StatusError:
    return StatusError(400, "BadRequest", message, details={})


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str]]) -> StatusError:
    text = "; ".join(f"{field}: {msg}" for field, msg in causes)
    details = {
        "name": name,
        **({"group": group} if group else {}),
        "kind": kind,
        "causes": [{"reason": "FieldValueInvalid", "message": msg, "field": field} for field, msg in causes],
    }
    return StatusError(422, "Invalid", f'{kind} "{name}" is invalid: {text}', details=details)


EXPIRED_MESSAGE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of the "
    "results. Continuing with the provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may show up in the list."
)


def expired(inconsistent_token: str) -> StatusError:
    # reference/list-expired-410.txt
    return StatusError(410, "Expired", EXPIRED_MESSAGE, continue_token=inconsistent_token)


def internal(message: str) -> StatusError:
    return StatusError(500, "InternalError", message, details={})


# ----- field errors, as apimachinery's field.Error prints them ------------------
# k8s.io/apimachinery/pkg/util/validation/field/errors.go: `ErrorBody` prints the
# type's text, then the bad value (strings quoted, numbers and booleans bare),
# then ": " and the detail; Required, Forbidden, TooLong and Internal omit the value.

OMIT: Any = object()  # no bad value printed (field.omitValue)

_ERROR_TEXT = {
    "FieldValueNotFound": "Not found",
    "FieldValueRequired": "Required value",
    "FieldValueDuplicate": "Duplicate value",
    "FieldValueInvalid": "Invalid value",
    "FieldValueNotSupported": "Unsupported value",
    "FieldValueForbidden": "Forbidden",
    "FieldValueTooLong": "Too long",
    "FieldValueTooMany": "Too many",
    "InternalError": "Internal error",
    "FieldValueTypeInvalid": "Invalid value",
}
_VALUELESS = frozenset({"FieldValueRequired", "FieldValueForbidden", "FieldValueTooLong", "InternalError"})


class GoRaw(str):
    """A bad value Go would print with %#v (a struct): printed as is, not quoted."""


def go_quote(text: str) -> str:
    """Go's %q (strconv.Quote) for the strings kubesim meets."""
    return json.dumps(text, ensure_ascii=False)


def go_value(value: Any) -> str:
    """A bad value as ErrorBody prints it (%v for numbers and bools, %q for strings)."""
    if value is None:
        return '"null"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e21:
            return str(int(value))
        return repr(value).replace("e+0", "e+").replace("e-0", "e-")
    if isinstance(value, GoRaw):
        return str(value)
    if isinstance(value, str):
        return go_quote(value)
    # Go prints a map or slice with %#v; JSON is the readable stand-in.
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class FieldError:
    """One field.Error: `type` is the cause reason (FieldValueInvalid, ...)."""

    type: str
    field: str
    value: Any = OMIT
    detail: str = ""

    def body(self) -> str:
        text = _ERROR_TEXT[self.type]
        if self.type not in _VALUELESS and self.value is not OMIT:
            text = f"{text}: {go_value(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


def field_required(path: str, detail: str = "") -> FieldError:
    return FieldError("FieldValueRequired", path, OMIT, detail)


def field_invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError("FieldValueInvalid", path, value, detail)


def field_type_invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError("FieldValueTypeInvalid", path, value, detail)


def field_not_supported(path: str, value: Any, supported: list[str]) -> FieldError:
    detail = "supported values: " + ", ".join(go_quote(v) for v in supported) if supported else ""
    return FieldError("FieldValueNotSupported", path, value, detail)


def field_forbidden(path: str, detail: str) -> FieldError:
    return FieldError("FieldValueForbidden", path, OMIT, detail)


def field_duplicate(path: str, value: Any) -> FieldError:
    return FieldError("FieldValueDuplicate", path, value)


def field_too_long(path: str, max_length: int) -> FieldError:
    unit = "byte" if max_length == 1 else "bytes"
    return FieldError("FieldValueTooLong", path, OMIT, f"may not be more than {max_length} {unit}")


def field_too_many(path: str, actual: int, max_items: int) -> FieldError:
    return FieldError("FieldValueTooMany", path, actual, f"must have at most {max_items} items")


def invalid_object(kind: str, group: str, name: str, errors: list[FieldError]) -> StatusError:
    """apierrors.NewInvalid: 422 `Invalid`, one cause per field error.

    The message is `<Kind>.<group> "<name>" is invalid: <aggregate>`, where the
    aggregate is the one error, or `[e1, e2]` for several (duplicates dropped,
    utilerrors.NewAggregate over ErrorList.ToAggregate).
    """
    texts: list[str] = []
    for err in errors:
        if str(err) not in texts:
            texts.append(str(err))
    aggregate = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    qualified = f"{kind}.{group}" if group else kind
    details = {
        "name": name,
        **({"group": group} if group else {}),
        "kind": kind,
        "causes": [{"reason": e.type, "message": e.body(), "field": e.field} for e in errors],
    }
    return StatusError(422, "Invalid", f'{qualified} "{name}" is invalid: {aggregate}', details=details)
