"""Who sends a request: bearer tokens from a token file, as kube-apiserver's
`--token-auth-file` reads them.

Design decision: only the static token file is modeled (one CSV line per token:
`token,user,uid,"group1,group2"`, k8s.io/apiserver's tokenfile.NewCSV), because it
is the one authenticator that needs no PKI and still carries a user and its
groups to RBAC. Anonymous requests are refused with 401 (kube-apiserver with
`--anonymous-auth=false`). Every authenticated user also gets the group
`system:authenticated` (the apiserver's AuthenticatedGroupAdder).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from kubesim.errors import StatusError

__all__ = [
    "AUTHENTICATED_GROUP",
    "SUPERUSER_GROUP",
    "TokenAuthenticator",
    "TokenFileError",
    "UserInfo",
    "read_token_file",
    "unauthorized",
]

#: Added to every authenticated user (k8s.io/apiserver user.AllAuthenticated).
AUTHENTICATED_GROUP: Final = "system:authenticated"
#: kube-apiserver's superuser group: allowed everything before RBAC is asked (user.SystemPrivilegedGroup).
SUPERUSER_GROUP: Final = "system:masters"


class TokenFileError(ValueError):
    """The token file cannot be read; kube-apiserver then refuses to start."""


@dataclass(frozen=True)
class UserInfo:
    """An authenticated user, as authorizers see it."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = field(default_factory=tuple)


def read_token_file(path: Path | str) -> dict[str, UserInfo]:
    """Parse a token file as tokenfile.NewCSV does: at least 3 columns, the 4th the
    comma-separated groups; empty tokens are skipped, a later duplicate wins."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TokenFileError(f"token file '{path}': {exc.strerror or exc}") from exc
    tokens: dict[str, UserInfo] = {}
    for record in csv.reader(io.StringIO(text)):
        if not record:
            continue  # Go's csv reader skips empty lines
        if len(record) < 3:
            raise TokenFileError(
                f"token file '{path}' must have at least 3 columns (token, user name, user uid), found {len(record)}"
            )
        if record[0] == "":
            continue
        groups = tuple(record[3].split(",")) if len(record) >= 4 else ()
        tokens[record[0]] = UserInfo(name=record[1], uid=record[2], groups=groups)
    return tokens


def unauthorized() -> StatusError:
    """The 401 of a failed authentication (apierrors.NewUnauthorized("Unauthorized"): no details)."""
    return StatusError(401, "Unauthorized", "Unauthorized", details=None)


class TokenAuthenticator:
    """Bearer tokens to users; `system:authenticated` added to every one."""

    def __init__(self, tokens: dict[str, UserInfo]) -> None:
        self._tokens = dict(tokens)

    def add(self, token: str, user: UserInfo) -> None:
        self._tokens[token] = user

    def authenticate(self, authorization: str | None) -> UserInfo:
        """The user of an `Authorization: Bearer <token>` header; 401 for none or an unknown token."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        user = self._tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            raise unauthorized()
        if AUTHENTICATED_GROUP in user.groups:
            return user
        return UserInfo(name=user.name, uid=user.uid, groups=(*user.groups, AUTHENTICATED_GROUP))
