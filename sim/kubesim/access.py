"""Authentication, then authorization, in front of every Kubernetes API request.

Design decision: the order of kube-apiserver's handler chain (WithAuthentication,
then WithAuthorization, before any routing), so an unknown token gets 401 and a
denied request 403 whether or not the resource exists, discovery and health
paths included. Off by default: a kubesim started without a token file lets
everything through, as it always did. kubesim's own admin API (`/_kubesim/`)
is outside the Kubernetes API and stays open.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from cryptography import x509

from kubesim.authn import (
    SUPERUSER_GROUP,
    CertificateAuthenticator,
    TokenAuthenticator,
    UserInfo,
    read_token_file,
)
from kubesim.rbac_authorizer import RBACAuthorizer, ensure_bootstrap_policy, forbidden, request_attributes
from kubesim.registry import Registry

__all__ = ["ADMIN_USER", "AccessConfig", "AccessControl"]

#: The user of the token kubesim writes into its own kubeconfig (in `system:masters`).
ADMIN_USER: Final = "kubesim-admin"
AUTHORIZATION_MODES: Final = ("AlwaysAllow", "RBAC")


@dataclass
class AccessConfig:
    """kube-apiserver's --token-auth-file and --authorization-mode, shared by a cluster's servers."""

    token_auth_file: Path | None = None
    authorization_mode: str = "AlwaysAllow"
    #: The kubeconfig's token: a superuser when authentication is on.
    admin_token: str = field(default_factory=lambda: secrets.token_hex(16))

    def __post_init__(self) -> None:
        if self.authorization_mode not in AUTHORIZATION_MODES:
            raise ValueError(
                f"authorization mode {self.authorization_mode!r} is not modeled: use one of {list(AUTHORIZATION_MODES)}"
            )
        if self.authorization_mode == "RBAC" and self.token_auth_file is None:
            raise ValueError("--authorization-mode RBAC needs --token-auth-file (kubesim authenticates no one else)")

    @property
    def authenticating(self) -> bool:
        return self.token_auth_file is not None

    @property
    def rbac(self) -> bool:
        return self.authorization_mode == "RBAC"


class AccessControl:
    """One API server's authenticators (client certificates when served over TLS, tokens) and authorizer."""

    def __init__(self, config: AccessConfig, registry: Registry, *, client_ca: x509.Certificate | None = None) -> None:
        assert config.token_auth_file is not None
        self.config = config
        self.certificates = CertificateAuthenticator(client_ca) if client_ca is not None else None
        self.authenticator = TokenAuthenticator(read_token_file(config.token_auth_file))
        self.authenticator.add(config.admin_token, UserInfo(name=ADMIN_USER, uid="", groups=(SUPERUSER_GROUP,)))
        self.authorizer = RBACAuthorizer(registry) if config.rbac else None
        self.registry = registry

    def start(self) -> None:
        """The rbac/bootstrap-roles post-start hook: the default roles exist before requests are served."""
        if self.authorizer is not None:
            ensure_bootstrap_policy(self.registry)

    def admit(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        authorization: str | None,
        certificates: Sequence[x509.Certificate] = (),
    ) -> UserInfo:
        """The request's user (its client certificate first, then its token); raises the 401 or 403
        kube-apiserver would answer."""
        user = self.certificates.authenticate(certificates) if self.certificates is not None else None
        if user is None:
            user = self.authenticator.authenticate(authorization)
        if self.authorizer is None:
            return user
        attrs = request_attributes(user, method, path, query)
        allowed, reason = self.authorizer.authorize(attrs)
        if not allowed:
            raise forbidden(attrs, reason)
        return user
