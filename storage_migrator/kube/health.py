"""Readiness of the API server: GET /readyz.

Design decision: a kube-apiserver that has just started reports it is not ready
(`/readyz` answers 500 while a post-start hook such as
`poststarthook/rbac/bootstrap-roles` has not finished) during the very seconds in
which it may deny requests it allows a moment later. The migrator asks this when
it gets a 401/403 it cannot otherwise explain (DESIGN 4.5, chunks.py): any
answer but 200, or no answer, means "not ready". The probe goes through
``transport.request`` like every call, so it carries the same credentials, and
it goes to the server the kubeconfig names (behind a load balancer: any one).
"""

from __future__ import annotations

from typing import Final

from kubernetes.client import ApiClient

from storage_migrator.kube.errors import KubeError
from storage_migrator.kube.transport import request

__all__ = ["READYZ_TIMEOUT_SECONDS", "is_ready"]

#: A ready server answers /readyz at once; a hung probe must not stall a retry decision.
READYZ_TIMEOUT_SECONDS: Final = 5.0


def is_ready(api_client: ApiClient, *, timeout: float = READYZ_TIMEOUT_SECONDS) -> bool:
    """Whether ``/readyz`` answers 200 right now (errors, 401/403 and 5xx: not ready)."""
    try:
        request(api_client, method="GET", path="/readyz", what="GET /readyz", accept="text/plain", timeout=timeout)
    except KubeError:
        return False
    return True
