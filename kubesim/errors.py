"""The `Status` answers kubesim gives, worded as kube-apiserver words them
(reference/*.txt hold the real ones)."""

from __future__ import annotations

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
