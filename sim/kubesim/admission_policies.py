"""ValidatingAdmissionPolicies and their bindings (admissionregistration.k8s.io/v1), evaluated
on every create and update as kube-apiserver's validating admission plugin evaluates them.

Design decision: the rules are k8s.io/apiserver/pkg/admission/plugin/policy/validating
(dispatcher.go, validator.go) and the generic matcher: a policy applies to a request its
`matchConstraints` match (resourceRules, excludeResourceRules, namespace and object
selectors) and whose `matchConditions` are all true; each binding of it that matches
(`matchResources`) evaluates the policy's `variables`, then its `validations` in order. A
validation that is false denies with its `message` (or its `messageExpression`, or `failed
expression: <expression>`) and its `reason` (default Invalid); an error (a condition, a
variable, a validation that cannot be evaluated) denies as `failurePolicy` says (Fail by
default; Ignore admits). The binding's `validationActions` decide: Deny refuses, Warn adds a
`Warning` header (not modeled: ignored), Audit is ignored. The first denial answers the
request as the dispatcher does: `admission.NewForbidden` (`<resource> "<name>" is forbidden:
ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>`,
the name being the generated one on create), its reason and code replaced by the
validation's (Invalid: 422, Forbidden: 403, Unauthorized: 401, RequestEntityTooLarge: 413),
the message again as the one cause. Dry runs are admitted the same way.

The expressions run on kubesim's CEL (cel-python, kubesim.cel), over the objects as JSON, as
the real server evaluates unstructured objects. In the environment: `object`, `oldObject`,
`request` (operation, userInfo, kind, resource, name, namespace, dryRun), `namespaceObject`,
`variables`, and `params` (null). Not modeled, and refused as a configuration error (a
denial with failurePolicy Fail): `paramKind` and bindings' `paramRef`; `authorizer` and
CEL's Kubernetes extension libraries are not in cel-python (an expression that calls them
fails to evaluate). A policy is not validated when it is created (the real server compiles and
type-checks it). DELETE and CONNECT are not admitted here; only the requests kubesim's HTTP
handler serves are (kubesim's own writes carry no request).

Policies and bindings are read from etcd at most every 0.25 s, and at once after this server
wrote or deleted one (another server's changes count within the 0.25 s: a real server's
informers take a moment too).
"""

from __future__ import annotations

import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from kubesim.authn import UserInfo
from kubesim.cel import RuleCompileError, compile_rule
from kubesim.errors import StatusError

if TYPE_CHECKING:
    from kubesim.registry_writes import RegistryWrites
    from kubesim.resources import ResourceType

__all__ = ["GROUP", "RequestContext", "admit", "policies_written", "request_context"]

GROUP: Final = "admissionregistration.k8s.io"
POLICIES: Final = "validatingadmissionpolicies"
BINDINGS: Final = "validatingadmissionpolicybindings"
_RECHECK_SECONDS: Final = 0.25
_CODES: Final = {"Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413, "Invalid": 422}
#: The label every namespace carries on a real server (NamespaceDefaultLabelName, 1.21+).
_NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class RequestContext:
    """Who sent the request being served (None: authentication is off: anonymous)."""

    user: UserInfo | None


#: Set by the HTTP handler for each request it serves; writes made outside one are not admitted.
request_context: ContextVar[RequestContext | None] = ContextVar("kubesim_request", default=None)


@dataclass
class _Decision:
    policy: str
    binding: str | None
    message: str
    reason: str


class _Cache:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.read_at = 0.0
        self.stale = True
        self.policies: list[dict[str, Any]] = []
        self.bindings: list[dict[str, Any]] = []


_caches: dict[int, _Cache] = {}
_caches_lock = threading.Lock()


def _cache(registry: RegistryWrites) -> _Cache:
    with _caches_lock:
        return _caches.setdefault(id(registry.etcd), _Cache())


def policies_written(registry: RegistryWrites, rt: ResourceType) -> None:
    """After any write: one of a policy or binding has them read again at the next request."""
    if rt.group == GROUP and rt.resource in (POLICIES, BINDINGS):
        _cache(registry).stale = True


def _current(registry: RegistryWrites) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    cache = _cache(registry)
    with cache.lock:
        if cache.stale or time.monotonic() - cache.read_at > _RECHECK_SECONDS:
            cache.stale = False
            cache.read_at = time.monotonic()
            found: list[list[dict[str, Any]]] = []
            for resource in (POLICIES, BINDINGS):
                try:
                    rt = registry.lookup(GROUP, "v1", resource)
                except StatusError:
                    found.append([])  # not served by this kubesim
                    continue
                found.append(sorted(registry.list(rt, "v1", None).items, key=lambda o: o["metadata"]["name"]))
            cache.policies, cache.bindings = found
        return cache.policies, cache.bindings


# ----- matching ------------------------------------------------------------------
def _in(values: list[str] | None, value: str) -> bool:
    return any(v in ("*", value) for v in values or [])


def _resource_matches(value: list[str] | None, resource: str, subresource: str | None) -> bool:
    """rules.go `resource()`: each entry is `resource[/subresource]`; `*` matches any resource without a
    subresource, `pods/*` every subresource of pods, `*/*` everything."""
    for entry in value or []:
        res, _, sub = entry.partition("/")
        if res in ("*", resource) and sub in ("*", subresource or ""):
            return True
    return False


def _rule_matches(rule: dict[str, Any], rt: ResourceType, version: str, operation: str, sub: str | None) -> bool:
    scope = rule.get("scope") or "*"
    scoped = scope == "*" or (scope == "Namespaced") == rt.namespaced
    return (_in(rule.get("operations"), operation) and _in(rule.get("apiGroups"), rt.group)
            and _in(rule.get("apiVersions"), version) and _resource_matches(rule.get("resources"), rt.resource, sub)
            and scoped)  # fmt: skip


def _labels_match(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels, matchExpressions); empty or absent: everything."""
    if not selector:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key", ""), expr.get("operator"), expr.get("values") or []
        value = labels.get(key)
        holds = {
            "In": value is not None and value in values,
            "NotIn": value is None or value not in values,
            "Exists": value is not None,
            "DoesNotExist": value is None,
        }.get(str(op), False)
        if not holds:
            return False
    return True


def _resources_match(spec: dict[str, Any] | None, rt: ResourceType, version: str, operation: str,
                     sub: str | None, obj: dict[str, Any], namespace: dict[str, Any] | None) -> bool:  # fmt: skip
    """matchConstraints (a policy's) or matchResources (a binding's; absent: everything the policy matches)."""
    if spec is None:
        return True
    rules = spec.get("resourceRules")
    if rules is not None and not any(_rule_matches(r, rt, version, operation, sub) for r in rules):
        return False
    if any(_rule_matches(r, rt, version, operation, sub) for r in spec.get("excludeResourceRules") or []):
        return False
    if rt.namespaced and namespace is not None:
        labels = {**((namespace.get("metadata") or {}).get("labels") or {}),
                  _NAMESPACE_NAME_LABEL: namespace["metadata"]["name"]}  # fmt: skip
        if not _labels_match(spec.get("namespaceSelector"), labels):
            return False
    return _labels_match(spec.get("objectSelector"), (obj.get("metadata") or {}).get("labels") or {})


# ----- evaluation ------------------------------------------------------------------
class _EvalFailed(Exception):
    pass


def _evaluate(expression: str, activation: dict[str, Any]) -> Any:
    try:
        program = compile_rule(expression)
    except RuleCompileError as exc:
        raise _EvalFailed(f"compilation failed: {exc}") from exc
    try:
        result = program.evaluate(activation)
    except CELEvalError as exc:
        raise _EvalFailed(f"expression '{expression}' resulted in error: {exc.args[0] if exc.args else exc}") from exc
    if isinstance(result, CELEvalError):
        raise _EvalFailed(f"expression '{expression}' resulted in error: {result.args[0] if result.args else result}")
    return result


def _request(rt: ResourceType, version: str, operation: str, sub: str | None, name: str, namespace: str | None,
             user: UserInfo | None, dry_run: bool) -> dict[str, Any]:  # fmt: skip
    kind = {"group": rt.group, "version": version, "kind": rt.kind}
    resource = {"group": rt.group, "version": version, "resource": rt.resource}
    who = ({"username": user.name, "uid": user.uid, "groups": list(user.groups)} if user is not None
           else {"username": "system:anonymous", "groups": ["system:unauthenticated"]})  # fmt: skip
    return {"kind": kind, "resource": resource, "requestKind": kind, "requestResource": resource,
            **({"subResource": sub} if sub else {}), "name": name, "namespace": namespace or "",
            "operation": operation, "userInfo": who, "dryRun": dry_run}  # fmt: skip


def _validate(policy: dict[str, Any], binding: dict[str, Any], activation: dict[str, Any]) -> _Decision | None:
    """The first denial of one policy through one binding, or None (admitted)."""
    spec, name = policy.get("spec") or {}, policy["metadata"]["name"]
    bound = binding["metadata"]["name"]
    fail = (spec.get("failurePolicy") or "Fail") != "Ignore"

    def error(message: str) -> _Decision | None:
        return _Decision(name, bound, message, "Invalid") if fail else None

    if spec.get("paramKind") or (binding.get("spec") or {}).get("paramRef"):
        return error("failed to configure binding: kubesim does not model paramKind and paramRef")
    try:
        for condition in spec.get("matchConditions") or []:
            result = _evaluate(str(condition.get("expression", "")), activation)
            if not isinstance(result, celtypes.BoolType):
                raise _EvalFailed(f"matchCondition '{condition.get('name')}' must evaluate to bool")
            if not result:
                return None  # the policy does not apply to this request
        values: dict[Any, Any] = {}
        for variable in spec.get("variables") or []:
            activation["variables"] = celtypes.MapType(values)
            values[celtypes.StringType(str(variable.get("name")))] = _evaluate(str(variable.get("expression")),
                                                                                activation)  # fmt: skip
        activation["variables"] = celtypes.MapType(values)
    except _EvalFailed as exc:
        return error(str(exc))
    for validation in spec.get("validations") or []:
        expression = str(validation.get("expression", ""))
        try:
            passed = _evaluate(expression, activation)
        except _EvalFailed as exc:
            decision = error(str(exc))
            if decision is not None:
                return decision
            continue
        if isinstance(passed, celtypes.BoolType) and bool(passed):
            continue
        return _Decision(name, bound, _message(validation, activation), str(validation.get("reason") or "Invalid"))
    return None


def _message(validation: dict[str, Any], activation: dict[str, Any]) -> str:
    """messageExpression's string (one line), else message, else the expression (validator.go)."""
    if validation.get("messageExpression"):
        try:
            text = _evaluate(str(validation["messageExpression"]), activation)
        except _EvalFailed:
            text = None
        if isinstance(text, str) and text.strip() and "\n" not in text:  # cel-python: a str, or its StringType
            return str(text).strip()
    if str(validation.get("message") or "").strip():
        return str(validation["message"]).strip()
    return f"failed expression: {str(validation.get('expression', '')).strip()}"


def admit(registry: RegistryWrites, rt: ResourceType, version: str, namespace: str | None, obj: dict[str, Any],
          old: dict[str, Any] | None, operation: str, *, subresource: str | None = None,
          dry_run: bool = False) -> None:  # fmt: skip
    """Raise the denial of the first policy and binding that refuse this write (nothing when none does)."""
    context = request_context.get()
    if context is None:
        return  # kubesim's own writes (leases, StorageVersions): no request to admit
    policies, bindings = _current(registry)
    if not policies:
        return
    ns_obj = _namespace(registry, namespace) if rt.namespaced and namespace else None
    name = (obj.get("metadata") or {}).get("name") or (obj.get("metadata") or {}).get("generateName") or "Unknown"
    request = _request(rt, version, operation, subresource, name, namespace, context.user, dry_run)
    for policy in policies:
        spec = policy.get("spec") or {}
        if not _resources_match(spec.get("matchConstraints"), rt, version, operation, subresource, obj, ns_obj):
            continue
        for binding in bindings:
            bspec = binding.get("spec") or {}
            if bspec.get("policyName") != policy["metadata"]["name"]:
                continue
            if not _resources_match(bspec.get("matchResources"), rt, version, operation, subresource, obj, ns_obj):
                continue
            activation = {"object": json_to_cel(obj), "oldObject": json_to_cel(old), "request": json_to_cel(request),
                          "namespaceObject": json_to_cel(ns_obj), "params": json_to_cel(None)}  # fmt: skip
            decision = _validate(policy, binding, activation)
            if decision is not None and "Deny" in (bspec.get("validationActions") or []):
                raise _forbidden(rt, name, decision)


def _namespace(registry: RegistryWrites, namespace: str) -> dict[str, Any] | None:
    try:
        ns_type = registry.lookup("", "v1", "namespaces")
        return dict(registry.get(ns_type, "v1", None, namespace))
    except StatusError:
        return None


def _forbidden(rt: ResourceType, name: str, decision: _Decision) -> StatusError:
    """admission.NewForbidden, then the dispatcher's reason, code and cause (dispatcher.go)."""
    inner = (f"ValidatingAdmissionPolicy '{decision.policy}' with binding '{decision.binding}' denied request: "
             f"{decision.message}")  # fmt: skip
    qualified = f"{rt.resource}.{rt.group}" if rt.group else rt.resource
    details: dict[str, Any] = {"name": name, **({"group": rt.group} if rt.group else {}), "kind": rt.resource,
                               "causes": [{"message": inner}]}  # fmt: skip
    return StatusError(_CODES.get(decision.reason, 422), decision.reason, f'{qualified} "{name}" is forbidden: {inner}',
                       details=details)  # fmt: skip
