"""kubesim's PKI (sim/kubesim/tls.py) and its x509 authenticator (sim/kubesim/authn.py), without a server."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID

from kubesim.authn import AUTHENTICATED_GROUP, CertificateAuthenticator, UserInfo
from kubesim.tls import Authority


def cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def test_cert_dir_keeps_the_same_ca_and_serving_certificate(tmp_path: Path) -> None:
    first = Authority.in_directory(tmp_path / "pki")
    again = Authority.in_directory(tmp_path / "pki")
    assert again.ca_pem == first.ca_pem and again.serving_cert == first.serving_cert
    assert Authority.in_directory(tmp_path / "other").ca_pem != first.ca_pem
    assert oct((tmp_path / "pki" / "ca.key").stat().st_mode & 0o777) == "0o600"


def test_serving_certificate_names_loopback_and_localhost() -> None:
    authority = Authority.generate()
    sans = authority.serving_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    authority.serving_cert.verify_directly_issued_by(authority.ca_cert)


def test_user_is_the_cn_groups_the_o_values() -> None:
    authority = Authority.generate()
    authn = CertificateAuthenticator(authority.ca_cert)
    issued = cert(authority.issue_client("kubernetes-admin", ("kubeadm:cluster-admins", "team-a")).cert_pem)
    assert authn.authenticate([issued]) == UserInfo(
        name="kubernetes-admin", uid="", groups=("kubeadm:cluster-admins", "team-a", AUTHENTICATED_GROUP)
    )
    assert issued.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kubernetes-admin"


def test_what_does_not_verify_authenticates_no_one() -> None:
    authority = Authority.generate()
    authn = CertificateAuthenticator(authority.ca_cert)
    stranger = Authority.generate("someone-else").issue_client("kubernetes-admin", ("system:masters",))
    expired = authority.issue_client("kubernetes-admin", (), valid=False)
    server_only = authority.issue_client("kubernetes-admin", (), client_auth=False)
    for refused in (stranger, expired, server_only):
        assert authn.authenticate([cert(refused.cert_pem)]) is None
    assert authn.authenticate([]) is None
