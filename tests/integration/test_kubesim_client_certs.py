"""Client certificates instead of a token, as kubeadm's admin kubeconfig has them (issue 22).

kube-apiserver asks for a client certificate without letting TLS judge it, then
its x509 authenticator maps a certificate that chains to `--client-ca-file` to
user = CN, groups = O (k8s.io/apiserver, CommonNameUserConversion). Refusals
first: a certificate it cannot verify authenticates no one (401), whatever it
claims; a token still works next to it (the union of authenticators).
"""

from __future__ import annotations

import http.client
import json
import secrets
import socket
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from kubesim.cluster import Cluster
from kubesim.tls import Authority, ClientCertificate
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.listing import iterate_items
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.settings import Settings

#: kubeadm's admin.conf since v1.29: this user, in this group, bound to cluster-admin.
KUBEADM_ADMIN, KUBEADM_GROUP = "kubernetes-admin", "kubeadm:cluster-admins"
NAMESPACES = ResourceRef(version="v1", resource="namespaces")


@dataclass
class CertCluster:
    cluster: Cluster
    home: Path
    token: str  # a valid token of the token file (user "tokenuser")

    def kubeconfig(self, name: str, user: dict[str, Any]) -> Path:
        """The cluster's kubeconfig with `user` as its credentials."""
        assert self.cluster.kubeconfig is not None
        doc = yaml.safe_load(self.cluster.kubeconfig.read_text())
        doc["users"] = [{"name": "kubesim-admin", "user": user}]
        path = self.home / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path

    def get(self, path: str, cert: ClientCertificate | None, *, token: str | None = None) -> tuple[int, Any]:
        """One GET over TLS, presenting `cert` (and a bearer `token`) when given."""
        context = ssl.create_default_context(cadata=self.cluster.server.tls.ca_pem.decode())  # type: ignore[union-attr]
        if cert is not None:
            pem = self.home / f"cert-{secrets.token_hex(4)}.pem"
            pem.write_bytes(cert.cert_pem + cert.key_pem)
            context.load_cert_chain(pem)
        conn = http.client.HTTPSConnection(self.cluster.server.host, self.cluster.server.port, context=context)
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CertCluster]:
    home = tmp_path_factory.mktemp("certs")
    token = secrets.token_hex(16)
    (home / "tokens.csv").write_text(f"{token},tokenuser,uid-1\n")
    cluster = Cluster(token_auth_file=home / "tokens.csv", authorization_mode="RBAC").start()
    try:
        cluster.write_kubeconfig(home / "admin.yaml")
        api = k8s_config.new_client_from_config(config_file=str(home / "admin.yaml"))
        rbac = k8s.RbacAuthorizationV1Api(api)
        # What `kubeadm init` creates for its admin.conf's group.
        rbac.create_cluster_role_binding(k8s.V1ClusterRoleBinding(
            metadata=k8s.V1ObjectMeta(name="kubeadm:cluster-admins"),
            role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="cluster-admin"),
            subjects=[k8s.RbacV1Subject(api_group="rbac.authorization.k8s.io", kind="Group", name=KUBEADM_GROUP)],
        ))  # fmt: skip
        api.close()
        yield CertCluster(cluster=cluster, home=home, token=token)
    finally:
        cluster.stop()


def authority(c: CertCluster) -> Authority:
    assert c.cluster.authority is not None
    return c.cluster.authority


def test_certificates_that_do_not_verify_authenticate_no_one(certs: CertCluster) -> None:
    """An unknown CA's certificate, an expired one, one without clientAuth: 401, as kube-apiserver.
    The handshake itself succeeds (kube-apiserver's RequestClientCert): the answer is an HTTP 401."""
    stranger = Authority.generate("someone-else").issue_client(KUBEADM_ADMIN, (KUBEADM_GROUP, "system:masters"))
    expired = authority(certs).issue_client(KUBEADM_ADMIN, (KUBEADM_GROUP,), valid=False)
    server_only = authority(certs).issue_client(KUBEADM_ADMIN, (KUBEADM_GROUP,), client_auth=False)
    for cert in (stranger, expired, server_only, None):
        status, body = certs.get("/api/v1/namespaces", cert)
        assert (status, body["reason"], body["message"]) == (401, "Unauthorized", "Unauthorized")
    # A token next to a certificate that does not verify: the token authenticates (the union).
    status, body = certs.get("/api/v1/namespaces/default", stranger, token=certs.token)
    assert (status, body["message"]) == (403, 'namespaces "default" is forbidden: User "tokenuser" cannot get '
                                         'resource "namespaces" in API group "" in the namespace "default"')  # fmt: skip


def test_user_is_the_common_name_and_groups_the_organizations(certs: CertCluster) -> None:
    alice = authority(certs).issue_client("alice", ("team-a",))
    status, body = certs.get("/api/v1/namespaces/default", alice)
    assert (status, body["message"]) == (403, 'namespaces "default" is forbidden: User "alice" cannot get '
                                         'resource "namespaces" in API group "" in the namespace "default"')  # fmt: skip
    api = k8s_config.new_client_from_config(config_file=str(certs.home / "admin.yaml"))
    try:
        rbac = k8s.RbacAuthorizationV1Api(api)
        rbac.create_cluster_role(k8s.V1ClusterRole(metadata=k8s.V1ObjectMeta(name="configmap-reader"), rules=[
            k8s.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["get", "list"])]))  # fmt: skip
        rbac.create_cluster_role_binding(k8s.V1ClusterRoleBinding(
            metadata=k8s.V1ObjectMeta(name="team-a-reads-configmaps"),
            role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="configmap-reader"),
            subjects=[k8s.RbacV1Subject(api_group="rbac.authorization.k8s.io", kind="Group", name="team-a")],
        ))  # fmt: skip
    finally:
        api.close()
    status, body = certs.get("/api/v1/namespaces/default/configmaps", alice)
    assert status == 200, body  # through the group of her O
    assert certs.get("/api/v1/namespaces/default/configmaps", authority(certs).issue_client("bob", ()))[0] == 403


def test_kubeadm_admin_conf_works_with_the_official_client_kubectl_and_the_migrator(certs: CertCluster) -> None:
    """kubeadm's admin.conf: CN kubernetes-admin, O kubeadm:cluster-admins, no token."""
    cert = authority(certs).issue_client(KUBEADM_ADMIN, (KUBEADM_GROUP,))
    kubeconfig = certs.kubeconfig("kubeadm-admin", cert.kubeconfig_user())
    api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
    try:
        names = {ns.metadata.name for ns in k8s.CoreV1Api(api).list_namespace().items}
    finally:
        api.close()
    assert "kube-system" in names
    got = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "get", "namespaces", "-o", "name"],
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert "namespace/kube-system" in got.stdout.split(), got.stdout
    product = api_client_from_settings(Settings(kubeconfig=kubeconfig))
    try:
        assert "kube-system" in {ns["metadata"]["name"] for ns in iterate_items(product, NAMESPACES)}
    finally:
        product.close()


def test_a_resumed_tls_session_keeps_its_certificates_user(certs: CertCluster) -> None:
    """Issue 29: kubesim resumes TLS sessions (the session id context and tickets of its serving
    context). A resumed handshake carries no certificate: the user is the one of the session's,
    as Go's server keeps it; and a session opened without a certificate stays anonymous (401)."""
    alice = authority(certs).issue_client("alice-resumed", ("team-r",))
    pem = certs.home / "alice-resumed.pem"
    pem.write_bytes(alice.cert_pem + alice.key_pem)
    server = certs.cluster.server
    assert server.tls is not None
    for cert, expected in ((pem, 'User "alice-resumed" cannot get'), (None, "Unauthorized")):
        context = ssl.create_default_context(cadata=server.tls.ca_pem.decode())
        if cert is not None:
            context.load_cert_chain(cert)
        session: ssl.SSLSession | None = None
        for attempt in range(3):
            conn = http.client.HTTPSConnection(server.host, server.port, context=context)
            conn.sock = context.wrap_socket(socket.create_connection((server.host, server.port)),
                                            server_hostname=server.host, session=session)  # fmt: skip
            try:
                conn.request("GET", "/api/v1/namespaces/default")
                resp = conn.getresponse()
                body = json.loads(resp.read())
                assert conn.sock.session_reused == (attempt > 0), attempt
                session = conn.sock.session
            finally:
                conn.close()
            assert expected in body["message"], (attempt, body)
