"""What kube-apiserver refuses of a `coordination.k8s.io` Lease.

The writer Leases (issue 37) and the API servers' identity Leases are written through
kubesim, so it refuses what the real server refuses: ValidateLease and ValidateLeaseSpec of
pkg/apis/coordination/validation/validation.go (a positive leaseDurationSeconds, a
non-negative leaseTransitions, a preferredHolder only with a strategy, a strategy that is
Kubernetes' one or a qualified name with a prefix). The name is checked as every object's
(a DNS subdomain, registry_admission.validate_name). Not modeled: the feature gate of
`strategy` and `preferredHolder` (CoordinatedLeaderElection; kubesim accepts them), and the
whole text of IsQualifiedName's message (kubesim's stops before its examples and regex).
"""

from __future__ import annotations

import re
from typing import Any

from kubesim.errors import FieldError, field_forbidden, field_invalid, field_not_supported, invalid_object
from kubesim.resources import ResourceType

__all__ = ["is_lease", "validate_lease"]

GROUP = "coordination.k8s.io"
#: coordination.OldestEmulationVersion, the one strategy Kubernetes defines.
_STRATEGIES = ["OldestEmulationVersion"]
_QUALIFIED = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def is_lease(rt: ResourceType) -> bool:
    return rt.group == GROUP and rt.resource == "leases" and not rt.is_custom


def _strategy(strategy: Any) -> list[FieldError]:
    path = "spec.strategy"
    if "/" not in str(strategy):
        # field.NotSupported(fldPath.Child("strategy"), ...): the real server names the path twice.
        return [] if strategy in _STRATEGIES else [field_not_supported(f"{path}.strategy", strategy, _STRATEGIES)]
    prefix, _, name = str(strategy).partition("/")
    if len(name) > 63 or len(prefix) > 253 or not _QUALIFIED.match(str(strategy)):
        return [field_invalid(path, strategy, "a qualified name must consist of alphanumeric characters, '-', '_' "
                                              "or '.', and must start and end with an alphanumeric character")]  # fmt: skip
    return []


def validate_lease(obj: dict[str, Any]) -> None:
    """ValidateLeaseSpec's refusals, as the 422 the real server answers."""
    spec = obj.get("spec") or {}
    errors: list[FieldError] = []
    duration = spec.get("leaseDurationSeconds")
    if isinstance(duration, int) and duration <= 0:
        errors.append(field_invalid("spec.leaseDurationSeconds", duration, "must be greater than 0"))
    transitions = spec.get("leaseTransitions")
    if isinstance(transitions, int) and transitions < 0:
        errors.append(field_invalid("spec.leaseTransitions", transitions, "must be greater than or equal to 0"))
    strategy = spec.get("strategy")
    if strategy is not None:
        errors += _strategy(strategy)
    if spec.get("preferredHolder") and not strategy:
        errors.append(field_forbidden("spec.preferredHolder", "may only be specified if `strategy` is defined"))
    if errors:
        raise invalid_object("Lease", GROUP, str((obj.get("metadata") or {}).get("name", "")), errors)
