"""Our exceptions for the Kubernetes API's answers, and how each is treated.

Design decision: every request of the access layer ends in these classes when it
fails (``kube.answers`` builds them from the HTTP answer), so the classification
(which class, which hint the server gave, whether to retry) is decided once
(STYLE "Do this" 2 and 3). Callers catch our classes, never
``kubernetes.client.ApiException`` nor urllib3 errors.

Security rule (DESIGN 8): ``str()`` and ``repr()`` of our errors carry only the
status code, the reason, the ``Status`` message and what the request concerned;
never the response body. ``ApiException.__str__`` prints the whole HTTP body,
which may be a Secret, so an ``ApiException`` converted here is scrubbed in
place before it can be chained as ``__cause__`` (traceback printers format the
cause with ``str()``).
"""

from __future__ import annotations

import re
from typing import Any, Final, TypedDict

__all__ = [
    "RBAC_FIX",
    "AlreadyExists",
    "BadRequest",
    "Conflict",
    "Expired",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeError",
    "MethodNotAllowed",
    "NotAcceptable",
    "NotFound",
    "ServerError",
    "StatusCause",
    "StatusDetails",
    "StatusDict",
    "StatusMeta",
    "TooManyRequests",
    "TransportError",
    "Unauthorized",
    "UnsupportedMediaType",
    "denied_permission",
    "is_retriable",
    "is_server_trouble",
    "is_settling_answer",
]

#: Longest message kept in ``str()``: webhook denials can be long; logs need a line.
MAX_MESSAGE_CHARS: Final = 1000
#: Longest plain-text body kept: enough for the priority-and-fairness 429 sentence.
MAX_PLAIN_TEXT_CHARS: Final = 200

#: Codes retried with backoff (DESIGN 4.5 table): 429, 500, 503, 504.
RETRIABLE_CODES: Final = frozenset({429, 500, 503, 504})
#: Codes a restarting API server gives until its authn/authz caches fill.
SETTLING_CODES: Final = frozenset({401, 403})

#: The fix for a permission RBAC denies (issue 14): the shipped role grants all the migrator does.
RBAC_FIX: Final = (
    "grant it: apply deployments/rbac/storage-migrator.yaml (or the output of `storage-migrator rbac`), which binds "
    "the ClusterRole storage-migrator to the ServiceAccount storage-migrator/storage-migrator; bind it to the "
    "identity named here if the migrator runs as another one"
)
#: How kube-apiserver words an authorization denial (responsewriters.forbiddenMessage).
_DENIAL = re.compile(r'User "[^"]*" cannot \S+ (?:resource "[^"]*" in API group "[^"]*" '
                     r'(?:at the cluster scope|in the namespace "[^"]*")|path "[^"]*")')  # fmt: skip


def denied_permission(message: str) -> str | None:
    """The permission an RBAC denial names (`User "u" cannot list resource "secrets" in API group ""
    at the cluster scope`), or None when a 403 is no authorization denial (e.g. an admission plugin's)."""
    found = _DENIAL.search(message)
    return found.group(0) if found else None


class StatusCause(TypedDict, total=False):
    """One entry of ``Status.details.causes`` (metav1.StatusCause)."""

    reason: str
    message: str
    field: str


class StatusDetails(TypedDict, total=False):
    """``Status.details`` (metav1.StatusDetails)."""

    name: str
    group: str
    kind: str
    uid: str
    causes: list[StatusCause]
    retryAfterSeconds: int


StatusMeta = TypedDict(
    "StatusMeta",
    {"resourceVersion": str, "continue": str, "remainingItemCount": int},
    total=False,
)
"""``Status.metadata`` (a ListMeta): a 410 carries the inconsistent continue token here."""


class StatusDict(TypedDict, total=False):
    """The ``metav1.Status`` object an API server answers with on failure."""

    kind: str
    apiVersion: str
    metadata: StatusMeta
    status: str
    message: str
    reason: str
    details: StatusDetails
    code: int


class KubeError(Exception):
    """A request to the Kubernetes API failed.

    Carries what a caller needs to decide and to report, and nothing of the
    response body beyond the ``Status`` message (see the module docstring).
    """

    def __init__(
        self,
        *,
        code: int,
        reason: str,
        message: str,
        what: str,
        status_object: StatusDict | None = None,
        retry_after: float | None = None,
        continue_token: str | None = None,
    ) -> None:
        super().__init__(code, reason, what)
        #: HTTP status code; 0 for transport errors (no answer at all).
        self.code = code
        #: ``Status.reason`` (e.g. ``Conflict``) or the HTTP reason phrase.
        self.reason = reason
        #: ``Status.message``, or a short plain-text reason when the body is no Status.
        self.message = message
        #: What the request concerned, e.g. ``PATCH configmaps default/cm-1``.
        self.what = what
        #: The decoded ``Status`` object, when the answer was one.
        self.status_object = status_object
        #: Seconds the server asked us to wait (Retry-After header, then details).
        self.retry_after = retry_after
        #: The continue token of a 410 Expired Status (inconsistent continue), if any.
        self.continue_token = continue_token

    def _fields(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "reason": self.reason,
            "message": self.message,
            "what": self.what,
            "status_object": self.status_object,
            "retry_after": self.retry_after,
            "continue_token": self.continue_token,
        }

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only __init__ breaks the default exception pickling, and
        # Prefect pickles exceptions into task states.
        return (_rebuild, (type(self), self._fields()))

    def __str__(self) -> str:
        message = shorten(self.message, MAX_MESSAGE_CHARS)
        return f"{self.what}: {self.code} {self.reason}: {message}"

    def __repr__(self) -> str:
        message = shorten(self.message, MAX_MESSAGE_CHARS)
        return (
            f"{type(self).__name__}(code={self.code!r}, reason={self.reason!r}, "
            f"what={self.what!r}, message={message!r})"
        )


def _rebuild(cls: type[KubeError], fields: dict[str, Any]) -> KubeError:
    """Unpickle a KubeError (see ``KubeError.__reduce__``)."""
    return cls(**fields)


class BadRequest(KubeError):
    """400: the request itself is malformed; retrying cannot help."""


class Unauthorized(KubeError):
    """401: credentials missing or expired."""


class Forbidden(KubeError):
    """403: RBAC (or an admission plugin) denies the request.

    An authorization denial names the missing permission (verb, resource, API group,
    scope); ``str()`` adds how to grant it, so every log line and failed state says both.
    """

    @property
    def permission(self) -> str | None:
        """The permission the authorizer denied, when it is an authorization denial."""
        return denied_permission(self.message)

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text} ({RBAC_FIX})" if self.permission else text


class NotFound(KubeError):
    """404: the object is gone, or the resource is not served at all."""


class MethodNotAllowed(KubeError):
    """405: the resource does not serve this verb (e.g. LIST on ``bindings``)."""


class NotAcceptable(KubeError):
    """406: the server cannot answer in the asked media type (e.g. metadata only)."""


class Conflict(KubeError):
    """409: a precondition (``resourceVersion``) failed: someone wrote since we read."""


class AlreadyExists(Conflict):
    """409 with reason ``AlreadyExists``: a create found the name taken."""


class Expired(KubeError):
    """410: the continue token's revision was compacted.

    ``continue_token`` holds the Status's ``metadata.continue`` when the server
    offers an inconsistent continue; ``None`` means restart the LIST.
    """


Gone = Expired


class UnsupportedMediaType(KubeError):
    """415: the server does not take this Content-Type (e.g. no merge patch)."""


class Invalid(KubeError):
    """422: validation (or a webhook) rejected the object."""


class TooManyRequests(KubeError):
    """429: throttled (priority and fairness, or max-in-flight); honour retry_after."""


class ServerError(KubeError):
    """5xx: the API server (or something in front of it) failed."""


class TransportError(KubeError):
    """No HTTP answer: connection refused or reset, timeout, TLS failure."""


def shorten(text: str, limit: int) -> str:
    """One line, at most `limit` characters (logs need a line; webhook denials can be long)."""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= limit else one_line[: limit - 3] + "..."


def is_retriable(error: BaseException) -> bool:
    """Whether a failed request may succeed if sent again (DESIGN 4.5 table).

    Transient: 429, 500, 503, 504 and transport errors. Everything else (404,
    409, 405, 400/403/422, ...) is an answer about the object or the resource
    that a retry would only repeat (upstream issue #83: do not loop).
    """
    if isinstance(error, TransportError):
        return True
    if isinstance(error, KubeError):
        return error.code in RETRIABLE_CODES
    return False


def is_server_trouble(error: BaseException) -> bool:
    """Whether the API server itself failed: no answer at all, or a 5xx.

    A 429 is not: the server is up and throttling. Seeing trouble makes a 401/403
    that follows it suspect (``is_settling_answer``).
    """
    if isinstance(error, TransportError):
        return True
    return isinstance(error, KubeError) and error.code >= 500


def is_settling_answer(error: BaseException) -> bool:
    """Whether the answer may come from a server that is still starting (401, 403).

    A kube-apiserver that has just (re)started answers 401/403 to requests it
    allows a moment later, until its authentication and RBAC caches fill. The
    code alone cannot tell that apart from a real denial: the caller retries such
    an answer only while the server shows other signs of settling (recent
    ``is_server_trouble``, or ``/readyz`` failing), see ``chunks.retry_step``.
    """
    return isinstance(error, KubeError) and not isinstance(error, TransportError) and error.code in SETTLING_CODES
