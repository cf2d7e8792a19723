"""kubesim's RBAC as kube-apiserver's: request attributes (RequestInfoFactory), rule
matching (rbac/v1 helpers), subjects (appliesTo), the token file and the denial's words.

Tables of cases taken from k8s.io/kubernetes plugin/pkg/auth/authorizer/rbac and
k8s.io/apiserver endpoints/request and authentication/token/tokenfile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kubesim.authn import AUTHENTICATED_GROUP, TokenAuthenticator, TokenFileError, UserInfo, read_token_file
from kubesim.errors import StatusError
from kubesim.rbac_authorizer import Attributes, applies_to, forbidden, request_attributes, rule_allows

SA = UserInfo(name="system:serviceaccount:storage-migrator:storage-migrator",
              groups=("system:serviceaccounts", "system:serviceaccounts:storage-migrator"))  # fmt: skip


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/secrets", {}, ("list", "", "secrets", "", "", "")),
        ("GET", "/api/v1/namespaces/ns/secrets", {"watch": "true"}, ("watch", "", "secrets", "", "ns", "")),
        ("GET", "/api/v1/namespaces/ns/secrets/s", {}, ("get", "", "secrets", "", "ns", "s")),
        (
            "PATCH",
            "/apis/apps/v1/namespaces/ns/deployments/d/status",
            {},
            ("patch", "apps", "deployments", "status", "ns", "d"),
        ),
        (
            "PUT",
            "/apis/migration.k8s.io/v1alpha1/storageversionmigrations/m/status",
            {},
            ("update", "migration.k8s.io", "storageversionmigrations", "status", "", "m"),
        ),
        ("DELETE", "/api/v1/namespaces/ns/configmaps", {}, ("deletecollection", "", "configmaps", "", "ns", "")),
        ("POST", "/api/v1/namespaces", {}, ("create", "", "namespaces", "", "", "")),
        # A namespace is in itself: GET /namespaces/x has namespace x; status/finalize are its subresources.
        ("GET", "/api/v1/namespaces/x", {}, ("get", "", "namespaces", "", "x", "x")),
        ("PUT", "/api/v1/namespaces/x/finalize", {}, ("update", "", "namespaces", "finalize", "x", "x")),
        # A LIST narrowed to one name by fieldSelector is authorized as that name.
        (
            "GET",
            "/api/v1/namespaces/ns/secrets",
            {"fieldSelector": "metadata.name=s"},
            ("list", "", "secrets", "", "ns", "s"),
        ),
    ],
)
def test_request_attributes_of_resource_requests(
    method: str, path: str, query: dict[str, str], expected: tuple[str, ...]
) -> None:
    attrs = request_attributes(SA, method, path, query)
    assert attrs.resource_request
    assert (attrs.verb, attrs.api_group, attrs.resource, attrs.subresource, attrs.namespace, attrs.name) == expected


@pytest.mark.parametrize("path", ["/api", "/apis", "/api/v1", "/apis/apps", "/apis/apps/v1", "/readyz", "/version"])
def test_discovery_and_health_are_non_resource_requests(path: str) -> None:
    attrs = request_attributes(SA, "GET", path, {})
    assert not attrs.resource_request and attrs.verb == "get" and attrs.path == path


def res(verb: str, resource: str, group: str = "", sub: str = "", name: str = "", ns: str = "") -> Attributes:
    return Attributes(user=SA, verb=verb, path="", resource_request=True, api_group=group, resource=resource,
                      subresource=sub, name=name, namespace=ns)  # fmt: skip


def url(path: str, verb: str = "get") -> Attributes:
    return Attributes(user=SA, verb=verb, path=path, resource_request=False)


RULE_CASES: list[tuple[dict[str, Any], Attributes, bool]] = [
    ({"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}, res("list", "secrets"), True),
    ({"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}, res("get", "secrets"), False),
    ({"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}, res("list", "secrets", "apps"), False),
    ({"apiGroups": ["*"], "resources": ["*"], "verbs": ["patch"]}, res("patch", "deployments", "apps"), True),
    # `*` matches subresources too; `secrets` does not match `secrets/status`.
    ({"apiGroups": ["*"], "resources": ["*"], "verbs": ["patch"]}, res("patch", "crds", "x", sub="status"), True),
    ({"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}, res("patch", "secrets", sub="status"), False),
    (
        {"apiGroups": [""], "resources": ["secrets/status"], "verbs": ["patch"]},
        res("patch", "secrets", sub="status"),
        True,
    ),
    ({"apiGroups": [""], "resources": ["*/status"], "verbs": ["get"]}, res("get", "pods", sub="status"), True),
    ({"apiGroups": [""], "resources": ["*/status"], "verbs": ["get"]}, res("get", "pods"), False),
    ({"apiGroups": [""], "resources": ["*/status"], "verbs": ["get"]}, res("get", "pods", sub="log"), False),
    # resourceNames: only requests that name one of them (a LIST names none).
    (
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["a"], "verbs": ["get", "list"]},
        res("get", "configmaps", name="a"),
        True,
    ),
    (
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["a"], "verbs": ["get", "list"]},
        res("get", "configmaps", name="b"),
        False,
    ),
    (
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["a"], "verbs": ["get", "list"]},
        res("list", "configmaps"),
        False,
    ),
    # nonResourceURLs: exact, or a prefix ending in `*`; never a resource request.
    ({"nonResourceURLs": ["/apis", "/apis/*"], "verbs": ["get"]}, url("/apis"), True),
    ({"nonResourceURLs": ["/apis", "/apis/*"], "verbs": ["get"]}, url("/apis/apps/v1"), True),
    ({"nonResourceURLs": ["/apis/*"], "verbs": ["get"]}, url("/apis"), False),
    ({"nonResourceURLs": ["/readyz"], "verbs": ["get"]}, url("/readyz", "post"), False),
    ({"nonResourceURLs": ["*"], "verbs": ["*"]}, url("/metrics"), True),
    ({"nonResourceURLs": ["*"], "verbs": ["*"]}, res("get", "secrets"), False),
    ({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, url("/api"), False),
]


@pytest.mark.parametrize(("rule", "attrs", "allowed"), RULE_CASES)
def test_rule_matching(rule: dict[str, Any], attrs: Attributes, allowed: bool) -> None:
    assert rule_allows(attrs, rule) is allowed


@pytest.mark.parametrize(
    ("subject", "binding_namespace", "applies"),
    [
        ({"kind": "User", "name": SA.name}, "", True),
        ({"kind": "Group", "name": "system:serviceaccounts:storage-migrator"}, "", True),
        ({"kind": "Group", "name": "system:serviceaccounts:other"}, "", False),
        ({"kind": "ServiceAccount", "name": "storage-migrator", "namespace": "storage-migrator"}, "", True),
        ({"kind": "ServiceAccount", "name": "storage-migrator", "namespace": "other"}, "", False),
        # A RoleBinding's ServiceAccount subject without a namespace means the binding's namespace.
        ({"kind": "ServiceAccount", "name": "storage-migrator"}, "storage-migrator", True),
        ({"kind": "ServiceAccount", "name": "storage-migrator"}, "", False),
    ],
)
def test_subjects(subject: dict[str, str], binding_namespace: str, applies: bool) -> None:
    assert applies_to(SA, [subject], binding_namespace) is applies


def test_denials_are_worded_as_kube_apiserver_words_them() -> None:
    """responsewriters.forbiddenMessage inside apierrors.NewForbidden (the issue's examples)."""
    cluster = forbidden(res("list", "secrets"))
    assert cluster.body() == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": 'secrets is forbidden: User "system:serviceaccount:storage-migrator:storage-migrator" cannot list '
                   'resource "secrets" in API group "" at the cluster scope',
        "reason": "Forbidden", "details": {"kind": "secrets"}, "code": 403,
    }  # fmt: skip
    named = forbidden(res("patch", "deployments", "apps", sub="status", name="d", ns="x"))
    assert named.message == (
        'deployments.apps "d" is forbidden: User "system:serviceaccount:storage-migrator:storage-migrator" cannot '
        'patch resource "deployments/status" in API group "apps" in the namespace "x"'
    )
    assert named.details == {"name": "d", "group": "apps", "kind": "deployments"}
    path = forbidden(url("/apis"), 'RBAC: clusterrole.rbac.authorization.k8s.io "gone" not found')
    assert path.message == (
        'forbidden: User "system:serviceaccount:storage-migrator:storage-migrator" cannot get path "/apis": '
        'RBAC: clusterrole.rbac.authorization.k8s.io "gone" not found'
    )
    assert path.details == {}


def test_the_token_file_is_read_as_kube_apiserver_reads_it(tmp_path: Path) -> None:
    """tokenfile.NewCSV: token,user,uid[,"group1,group2"]; an empty token is skipped."""
    good = tmp_path / "tokens.csv"
    good.write_text('t1,alice,u1,"g1,g2"\nt2,bob,u2\n,nobody,u3\n\n')
    tokens = read_token_file(good)
    assert tokens == {"t1": UserInfo("alice", "u1", ("g1", "g2")), "t2": UserInfo("bob", "u2", ())}
    authn = TokenAuthenticator(tokens)
    assert authn.authenticate("Bearer t2").groups == (AUTHENTICATED_GROUP,)
    for header in (None, "Bearer nope", "Basic dDE=", "Bearer "):
        with pytest.raises(StatusError) as denied:
            authn.authenticate(header)
        assert denied.value.body() == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                       "message": "Unauthorized", "reason": "Unauthorized", "code": 401}  # fmt: skip
    bad = tmp_path / "bad.csv"
    bad.write_text("t1,alice\n")
    with pytest.raises(TokenFileError, match="must have at least 3 columns"):
        read_token_file(bad)


def test_rbac_without_a_token_file_is_refused() -> None:
    """kubesim authenticates no one but the token file's users: RBAC alone would deny everyone."""
    from kubesim.cluster import Cluster

    with pytest.raises(ValueError, match="--authorization-mode RBAC needs --token-auth-file"):
        Cluster(authorization_mode="RBAC")
    with pytest.raises(ValueError, match="'Webhook' is not modeled"):
        Cluster(token_auth_file="tokens.csv", authorization_mode="Webhook")
