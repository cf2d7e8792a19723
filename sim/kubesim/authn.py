"""Who sends a request: client certificates signed by the cluster's CA (kube-apiserver's
`--client-ca-file`, what kubeadm's admin.conf uses), and bearer tokens from a token
file, as kube-apiserver's `--token-auth-file` reads them.

Design decision: the two authenticators that carry a user and its groups to RBAC
with nothing but the cluster's own PKI. The static token file: one CSV line per
token, `token,user,uid,"group1,group2"` (k8s.io/apiserver's tokenfile.NewCSV). A
client certificate, as k8s.io/apiserver's x509 authenticator maps it
(CommonNameUserConversion): the user is the subject's CN, its groups the O values,
its UID the `1.3.6.1.4.1.57683.2` attribute (AllowParsingUserUIDFromCertAuth, on
since v1.34); the certificate must chain to the CA, be valid now and allow
`clientAuth`, else it authenticates no one. As kube-apiserver's union of
authenticators, the certificate is asked first, then the token; neither: 401.
Anonymous requests are refused with 401 (kube-apiserver with
`--anonymous-auth=false`). Every authenticated user also gets the group
`system:authenticated` (the apiserver's AuthenticatedGroupAdder).
"""

from __future__ import annotations

import csv
import datetime
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kubesim.errors import StatusError

__all__ = [
    "AUTHENTICATED_GROUP",
    "SUPERUSER_GROUP",
    "CertificateAuthenticator",
    "TokenAuthenticator",
    "TokenFileError",
    "UserInfo",
    "read_token_file",
    "unauthorized",
]

#: Added to every authenticated user (k8s.io/apiserver user.AllAuthenticated).
AUTHENTICATED_GROUP: Final = "system:authenticated"
#: The subject attribute kube-apiserver reads a certificate user's UID from (x509.go, uidOID).
UID_OID: Final = x509.ObjectIdentifier("1.3.6.1.4.1.57683.2")
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
        return with_authenticated_group(user)


def with_authenticated_group(user: UserInfo) -> UserInfo:
    if AUTHENTICATED_GROUP in user.groups:
        return user
    return UserInfo(name=user.name, uid=user.uid, groups=(*user.groups, AUTHENTICATED_GROUP))


class CertificateAuthenticator:
    """Client certificates to users, as kube-apiserver's x509 authenticator with `--client-ca-file`."""

    def __init__(self, ca: x509.Certificate) -> None:
        self._ca = ca

    def authenticate(self, chain: Sequence[x509.Certificate]) -> UserInfo | None:
        """The user of the presented certificate; None when there is none or it does not verify."""
        if not chain:
            return None
        cert = chain[0]
        if not self._verifies(cert):
            return None
        subject = cert.subject
        names = subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if not names or not names[0].value:
            return None  # CommonNameUserConversion: no CN, no user
        groups = tuple(str(a.value) for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
        uids = subject.get_attributes_for_oid(UID_OID)
        return with_authenticated_group(
            UserInfo(name=str(names[0].value), uid=str(uids[0].value) if uids else "", groups=groups)
        )

    def _verifies(self, cert: x509.Certificate) -> bool:
        """Signed by the CA, valid now, and usable for client authentication."""
        try:
            cert.verify_directly_issued_by(self._ca)
        except (ValueError, TypeError, InvalidSignature):
            return False
        now = datetime.datetime.now(datetime.UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            return False
        try:
            usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        except x509.ExtensionNotFound:
            return True  # Go's x509 treats a certificate without the extension as good for any usage
        return ExtendedKeyUsageOID.CLIENT_AUTH in usages or ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE in usages
