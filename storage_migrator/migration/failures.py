"""What we record about an object that could not be rewritten: never its content.

Design decision (DESIGN 8, issue 12 item 6). An API server's refusal message is
free text that can quote the object: a 422 says `data.password: Invalid value:
"<the value>"`, and an admission webhook's denial says whatever the webhook
wrote. Anything recorded about a failed object reaches places that outlive the
migration and are readable by more people than the object is (the request's
status and Failed condition, Prefect state messages, logs and events). So a
failure is recorded as the object's namespace/name, the HTTP code, the Status
`reason` and, for a 422, the field paths and reasons of `details.causes`
(metav1.StatusCause: `field`, `reason`), which name where the object is wrong
without what it holds; for an authorization denial (a 403 from RBAC), the
permission it names (user, verb, resource, group, namespace: no content). The
free-text `message` is dropped everywhere else. What to
do next comes from the code and reason (:func:`fix_hint`), not from the text.
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Final

from storage_migrator.kube.errors import Forbidden, KubeError
from storage_migrator.models import ObjectFailure

__all__ = [
    "DENIED_PREFIX",
    "MAX_FIELDS",
    "SCRUBBED_PREFIX",
    "answer_summary",
    "fix_hint",
    "object_failure",
    "scrubbed_detail",
]

#: Field paths kept per failure: enough to find the problem, short enough for a status.
MAX_FIELDS: Final = 5
#: Longest field path kept (a path is our key into the object, never a value).
MAX_FIELD_CHARS: Final = 120
#: How a scrubbed detail starts (ObjectFailure.message holds nothing else).
SCRUBBED_PREFIX: Final = "fields: "
#: How a recorded authorization denial starts (then the permission: `User "u" cannot patch resource ...`).
DENIED_PREFIX: Final = "denied: "
#: What a Status or cause reason looks like: CamelCase (metav1.StatusReason, metav1.CauseType).
_REASON: Final = re.compile(r"[A-Z][A-Za-z0-9]{0,62}")
#: HTTP reason phrases (KubeError.reason when the answer was no Status).
_PHRASES: Final = frozenset(status.phrase for status in HTTPStatus)


def scrubbed_detail(exc: KubeError) -> str:
    """`fields: data.password (FieldValueInvalid), spec.x (FieldValueRequired)` from
    `details.causes`, or '' when the answer names no field. Never the message."""
    status = exc.status_object or {}
    causes = (status.get("details") or {}).get("causes") or []
    named = []
    for cause in causes:
        field = str(cause.get("field") or "")[:MAX_FIELD_CHARS]
        if not field:
            continue
        reason = str(cause.get("reason") or "")
        named.append(f"{field} ({reason})" if _REASON.fullmatch(reason) else field)
    if not named:
        return ""
    more = f", and {len(named) - MAX_FIELDS} more" if len(named) > MAX_FIELDS else ""
    return SCRUBBED_PREFIX + ", ".join(named[:MAX_FIELDS]) + more


def object_failure(*, namespace: str | None, name: str, exc: KubeError) -> ObjectFailure:
    """The record of one failed object: name, code, reason and field paths or the denied permission only."""
    permission = exc.permission if isinstance(exc, Forbidden) else None
    detail = DENIED_PREFIX + permission if permission else scrubbed_detail(exc)
    return ObjectFailure(namespace=namespace, name=name, code=exc.code, reason=_reason(exc.reason),
                         message=detail)  # fmt: skip


def answer_summary(exc: KubeError) -> str:
    """`403 Forbidden, denied: User "u" cannot list ...` or `422 Invalid, fields: ...`: an
    answer as a whole-run verdict may quote it (LIST failures, a 405). A conversion webhook
    failing a LIST can put an object's values in its message, so the message is dropped
    here as it is for single objects."""
    failure = object_failure(namespace=None, name="", exc=exc)
    head = " ".join(part for part in (str(exc.code) if exc.code else "no answer", failure.reason) if part)
    return f"{head}, {failure.message}" if failure.message else head


def _reason(text: str) -> str:
    """A Status reason (`Invalid`) or an HTTP reason phrase (`Service Unavailable`); anything
    else, e.g. free text a webhook put there, is dropped."""
    return text if _REASON.fullmatch(text) or text in _PHRASES else ""


def fix_hint(code: int, reason: str) -> str:
    """What a person does about a failed object with this answer (DESIGN 8: say what to do)."""
    if code == 422 or reason == "Invalid":
        return (
            "the object no longer passes validation (a CRD schema, a validation rule or an admission "
            "policy changed since it was written): fix or delete the fields named, then request the "
            "migration again"
        )
    if code == 403 or reason == "Forbidden":
        return (
            "the write was refused: check that the migrator's service account may patch and update "
            "this resource (deployments/rbac/) and which admission webhook or policy denied it, then "
            "request the migration again"
        )
    if code == 400 or reason == "BadRequest":
        return (
            "the write was refused, usually by an admission webhook: read its logs for this object, "
            "fix the object or the webhook, then request the migration again"
        )
    if code == 0:
        return "the API server did not answer: check its health and the network, then request the migration again"
    return "read the API server's log for these objects, fix the cause, then request the migration again"
