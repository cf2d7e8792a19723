"""May this user do this: RBAC as kube-apiserver evaluates it.

Design decision: the rules are k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac
(rbac.go `RuleAllows`, `appliesTo`; rbac/v1 helpers `VerbMatches`,
`APIGroupMatches`, `ResourceMatches`, `ResourceNameMatches`,
`NonResourceURLMatches`), read on every request from the RBAC objects in etcd,
so a binding or rule changed through the API counts at once (a real server's
informers lag by milliseconds). The request's attributes are derived as
k8s.io/apiserver's RequestInfoFactory derives them, and a denial is worded as
`responsewriters.Forbidden` + `apierrors.NewForbidden` word it. The group
`system:masters` is allowed everything before RBAC is asked (kube-apiserver's
privileged-groups authorizer). Not modeled: aggregated ClusterRoles
(`aggregationRule`), impersonation, Node and webhook authorizers (docs/kubesim.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from kubesim.authn import SUPERUSER_GROUP, UserInfo
from kubesim.errors import StatusError
from kubesim.registry import Registry

__all__ = [
    "Attributes",
    "RBACAuthorizer",
    "applies_to",
    "bootstrap_policy",
    "ensure_bootstrap_policy",
    "forbidden",
    "request_attributes",
    "rule_allows",
]

RBAC_GROUP: Final = "rbac.authorization.k8s.io"
#: Sub-paths of a namespace that are its subresources, not resources in it (RequestInfoFactory).
_NAMESPACE_SUBRESOURCES: Final = frozenset({"status", "finalize"})
_METHOD_VERBS: Final = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
                        "DELETE": "delete"}  # fmt: skip


@dataclass(frozen=True)
class Attributes:
    """What the authorizer is asked about one request (authorizer.AttributesRecord)."""

    user: UserInfo
    verb: str
    path: str
    resource_request: bool
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""


def _field_selector_name(selector: str) -> str:
    """`metadata.name=x` (or `==`) among the requirements of a LIST's fieldSelector."""
    for requirement in selector.split(","):
        key, op, value = requirement.partition("==") if "==" in requirement else requirement.partition("=")
        if op and key.strip() == "metadata.name" and not key.strip().endswith("!"):
            return value.strip()
    return ""


def request_attributes(user: UserInfo, method: str, path: str, query: dict[str, str]) -> Attributes:
    """The attributes of a request, as RequestInfoFactory.NewRequestInfo finds them."""
    verb = _METHOD_VERBS.get(method, method.lower())
    parts = [p for p in path.strip("/").split("/") if p]
    non_resource = Attributes(user=user, verb=method.lower(), path=path, resource_request=False)
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return non_resource
    prefix, rest = parts[0], parts[1:]
    group = ""
    if prefix == "apis":
        if len(rest) < 3:
            return non_resource
        group, rest = rest[0], rest[1:]
    version, rest = rest[0], rest[1:]
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) >= 2 else ""
    subresource = rest[2] if len(rest) >= 3 else ""
    if not name and verb == "get":
        verb = "watch" if query.get("watch") in ("true", "1") else "list"
        name = _field_selector_name(query.get("fieldSelector", ""))
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(user=user, verb=verb, path=path, resource_request=True, api_group=group, api_version=version,
                      resource=resource, subresource=subresource, namespace=namespace, name=name)  # fmt: skip


# ----- rbac/v1 helpers ------------------------------------------------------------
def _verb_matches(rule: dict[str, Any], verb: str) -> bool:
    return any(v in ("*", verb) for v in rule.get("verbs") or [])


def _api_group_matches(rule: dict[str, Any], group: str) -> bool:
    return any(g in ("*", group) for g in rule.get("apiGroups") or [])


def _resource_matches(rule: dict[str, Any], combined: str, subresource: str) -> bool:
    for resource in rule.get("resources") or []:
        if resource in ("*", combined):
            return True
        # `*/status` matches the status subresource of every resource.
        if subresource and resource == f"*/{subresource}":
            return True
    return False


def _resource_name_matches(rule: dict[str, Any], name: str) -> bool:
    names = rule.get("resourceNames") or []
    return not names or name in names


def _non_resource_url_matches(rule: dict[str, Any], path: str) -> bool:
    for url in rule.get("nonResourceURLs") or []:
        if url in ("*", path):
            return True
        if url.endswith("*") and path.startswith(url.rstrip("*")):
            return True
    return False


def rule_allows(attrs: Attributes, rule: dict[str, Any]) -> bool:
    """rbac.go RuleAllows: one PolicyRule against one request."""
    if attrs.resource_request:
        combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        return (
            _verb_matches(rule, attrs.verb)
            and _api_group_matches(rule, attrs.api_group)
            and _resource_matches(rule, combined, attrs.subresource)
            and _resource_name_matches(rule, attrs.name)
        )
    return _verb_matches(rule, attrs.verb) and _non_resource_url_matches(rule, attrs.path)


def applies_to(user: UserInfo, subjects: list[dict[str, Any]], namespace: str) -> bool:
    """rbac.go appliesTo: whether a binding's subjects name the user (`namespace`: the binding's, or "")."""
    for subject in subjects or []:
        kind, name = subject.get("kind"), subject.get("name", "")
        if kind == "User" and user.name == name:
            return True
        if kind == "Group" and name in user.groups:
            return True
        if kind == "ServiceAccount":
            # A RoleBinding's ServiceAccount subject defaults to the binding's namespace.
            sa_namespace = subject.get("namespace") or namespace
            if sa_namespace and user.name == f"system:serviceaccount:{sa_namespace}:{name}":
                return True
    return False


# ----- the authorizer --------------------------------------------------------------
class RBACAuthorizer:
    """Allow when a rule of a role bound to the user allows; else deny, with RBAC's reason."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def _items(self, resource: str, namespace: str | None) -> list[dict[str, Any]]:
        rt = self.registry.lookup(RBAC_GROUP, "v1", resource)
        return self.registry.list(rt, "v1", namespace).items

    def authorize(self, attrs: Attributes) -> tuple[bool, str]:
        """(allowed, reason); the reason names bindings whose role is missing, as rbac.go does."""
        if SUPERUSER_GROUP in attrs.user.groups:
            return True, ""
        cluster_roles = {r["metadata"]["name"]: r for r in self._items("clusterroles", None)}
        errors: list[str] = []
        bindings = [(b, "") for b in self._items("clusterrolebindings", None)]
        roles: dict[str, dict[str, Any]] = {}
        if attrs.namespace:
            bindings += [(b, attrs.namespace) for b in self._items("rolebindings", attrs.namespace)]
            roles = {r["metadata"]["name"]: r for r in self._items("roles", attrs.namespace)}
        for binding, namespace in bindings:
            if not applies_to(attrs.user, binding.get("subjects") or [], namespace):
                continue
            ref = binding.get("roleRef") or {}
            kind, name = ref.get("kind"), ref.get("name", "")
            role = cluster_roles.get(name) if kind == "ClusterRole" else roles.get(name) if namespace else None
            if role is None:
                what = "clusterrole" if kind == "ClusterRole" else "role"
                errors.append(f'{what}.{RBAC_GROUP} "{name}" not found')
                continue
            if any(rule_allows(attrs, rule) for rule in role.get("rules") or []):
                return True, ""
        reason = ""
        if errors:
            reason = "RBAC: " + (errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]")
        return False, reason


def forbidden(attrs: Attributes, reason: str = "") -> StatusError:
    """The 403 of a denial: responsewriters.forbiddenMessage inside apierrors.NewForbidden."""
    user = attrs.user.name
    if not attrs.resource_request:
        msg = f'User "{user}" cannot {attrs.verb} path "{attrs.path}"'
    else:
        what = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
        msg = f'User "{user}" cannot {attrs.verb} resource "{what}" in API group "{attrs.api_group}" {scope}'
    # The sanitizer of responsewriters.Forbidden: nothing that looks like HTML.
    msg = msg.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if reason:
        msg = f"{msg}: {reason}"
    details: dict[str, Any] = {}
    if not attrs.resource:
        return StatusError(403, "Forbidden", f"forbidden: {msg}", details=details)
    qualified = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource
    if attrs.name:
        details["name"] = attrs.name
    if attrs.api_group:
        details["group"] = attrs.api_group
    details["kind"] = attrs.resource
    message = f'{qualified} "{attrs.name}" is forbidden: {msg}' if attrs.name else f"{qualified} is forbidden: {msg}"
    return StatusError(403, "Forbidden", message, details=details)


# ----- the bootstrap policy (post-start hook rbac/bootstrap-roles) --------------------
_BOOTSTRAP_META: Final = {"labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
                          "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}}  # fmt: skip
_HEALTH_URLS: Final = ["/healthz", "/livez", "/readyz", "/version", "/version/"]


def _role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": f"{RBAC_GROUP}/v1", "kind": "ClusterRole", "metadata": {"name": name, **_BOOTSTRAP_META},
            "rules": rules}  # fmt: skip


def _binding(name: str, groups: list[str]) -> dict[str, Any]:
    return {"apiVersion": f"{RBAC_GROUP}/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name, **_BOOTSTRAP_META},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": g} for g in groups]}  # fmt: skip


def bootstrap_policy() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The default ClusterRoles and ClusterRoleBindings kubesim needs of bootstrappolicy/policy.go:
    cluster-admin (system:masters), system:discovery (discovery and health, to every
    authenticated user) and system:public-info-viewer (health and version)."""
    discovery_urls = [*_HEALTH_URLS, "/openapi", "/openapi/*", "/api", "/api/*", "/apis", "/apis/*"]
    admin_rules = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}]
    roles = [
        _role("cluster-admin", admin_rules),
        _role("system:discovery", [{"nonResourceURLs": discovery_urls, "verbs": ["get"]}]),
        _role("system:public-info-viewer", [{"nonResourceURLs": _HEALTH_URLS, "verbs": ["get"]}]),
    ]
    bindings = [
        _binding("cluster-admin", [SUPERUSER_GROUP]),
        _binding("system:discovery", ["system:authenticated"]),
        _binding("system:public-info-viewer", ["system:authenticated", "system:unauthenticated"]),
    ]
    return roles, bindings


def ensure_bootstrap_policy(registry: Registry) -> None:
    """Create the default roles and bindings that are missing (kept when an admin changed them)."""
    roles, bindings = bootstrap_policy()
    for resource, objs in (("clusterroles", roles), ("clusterrolebindings", bindings)):
        rt = registry.lookup(RBAC_GROUP, "v1", resource)
        for obj in objs:
            try:
                registry.create(rt, "v1", None, obj, manager="kube-apiserver")
            except StatusError as exc:
                if exc.code != 409:
                    raise
