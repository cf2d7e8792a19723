"""Health endpoints, and the authorization warm-up window after a start.

Design decision: a real kube-apiserver that has just started serves requests
before its RBAC informers have synced. For those seconds it denies what it
allows a moment later (`403 Forbidden`, the same body as a real RBAC denial),
and `/readyz` fails its `poststarthook/rbac/bootstrap-roles` check. kubesim
reproduces that window (`ApiServer(..., authz_warmup_seconds=S)`) so that the
migrator's handling of a restarting server can be tested; the answers are worded
as k8s.io/apiserver words them (`responsewriters.forbiddenMessage`,
`apierrors.NewForbidden`, `healthz.handleRootHealth`).

kubesim authenticates no one: the denial names the fixed user `WARMUP_USER`.
Discovery and health paths stay open (the brief of the simulator, not RBAC).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from kubesim.errors import StatusError

__all__ = ["HEALTH_PATHS", "WARMUP_USER", "Warmup", "forbidden", "health_answer"]

#: kubesim checks no credentials; the 403 of the window names this user.
WARMUP_USER: Final = "system:serviceaccount:default:kubesim"
#: Answered during the window, like discovery (`/api`, `/apis`, `/version`, `/openapi/*`).
HEALTH_PATHS: Final = ("/healthz", "/livez", "/readyz")

#: The checks kube-apiserver reports on failure (healthz "always verbose on failure").
_CHECKS: Final = (
    "ping",
    "log",
    "etcd",
    "etcd-readiness",
    "informer-sync",
    "poststarthook/generic-apiserver-start-informers",
    "poststarthook/start-apiextensions-controllers",
    "poststarthook/rbac/bootstrap-roles",
    "poststarthook/scheduling/bootstrap-system-priority-classes",
    "shutdown",
)
_WARMING_CHECK: Final = "poststarthook/rbac/bootstrap-roles"


class Warmup:
    """The window after a start during which authorization is not ready yet."""

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.until = clock() + max(0.0, seconds)

    def active(self) -> bool:
        return self._clock() < self.until


def health_answer(path: str, *, warming: bool, verbose: bool = False) -> tuple[int, bytes]:
    """Status code and text/plain body of `/healthz`, `/livez` or `/readyz`.

    During the window `/readyz` and `/healthz` fail the RBAC bootstrap check
    (kube-apiserver adds post-start hooks to both); `/livez` stays ok.
    """
    name = path.strip("/")
    failing = warming and name in ("readyz", "healthz")
    if not failing and not verbose:
        return 200, b"ok"
    lines = [
        f"[-]{check} failed: reason withheld" if failing and check == _WARMING_CHECK else f"[+]{check} ok"
        for check in _CHECKS
    ]
    if failing:
        # http.Error appends a newline.
        return 500, ("\n".join(lines) + f"\n{name} check failed\n").encode()
    return 200, ("\n".join(lines) + f"\n{name} check passed\n").encode()


def forbidden(
    *,
    verb: str,
    group: str,
    resource: str,
    subresource: str | None,
    namespace: str | None,
    name: str | None,
    user: str | None = None,
) -> StatusError:
    """The 403 of an RBAC denial (`responsewriters.Forbidden` + `apierrors.NewForbidden`);
    `user`: the authenticated one, `WARMUP_USER` when authentication is off."""
    user = user or WARMUP_USER
    what = f"{resource}/{subresource}" if subresource else resource
    if namespace:
        msg = f'User "{user}" cannot {verb} resource "{what}" in API group "{group}" in the namespace "{namespace}"'
    else:
        msg = f'User "{user}" cannot {verb} resource "{what}" in API group "{group}" at the cluster scope'
    qualified = f"{resource}.{group}" if group else resource
    message = f'{qualified} "{name}" is forbidden: {msg}' if name else f"{qualified} is forbidden: {msg}"
    details: dict[str, Any] = {}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    details["kind"] = resource
    return StatusError(403, "Forbidden", message, details=details)
