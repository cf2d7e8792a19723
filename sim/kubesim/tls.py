"""kubesim's PKI: a self-signed CA, the serving certificate of its API servers,
client certificates, and the client-side TLS contexts that trust the CA.

Design decision: kube-apiserver serves HTTPS only, so kubesim does too by
default (plain HTTP only when asked: `Cluster(insecure_http=True)`, `serve
--insecure-http`), and `serve --cert-dir` keeps the PKI across restarts as
kube-apiserver's flag does. One CA per process, generated the first time a cluster
starts, signs one serving certificate for `127.0.0.1` and `localhost` (every
kubesim server listens there, on a port of its own, so one certificate serves
them all). Keeping it per process lets test and bench helpers trust "kubesim's
CA" from a bare URL, as `Admin(url)` does; a `kubesim serve` process has its
own, written into its kubeconfig as `certificate-authority-data`. The same CA
is the client CA (kube-apiserver's `--client-ca-file`, as kubeadm sets it up):
`issue_client` signs certificates whose CN is the user and whose O values are
its groups.

Keys are ECDSA P-256: cheap to generate at start, and what the client's CPU
pays per handshake is close to a real cluster's (connections are kept alive).
"""

from __future__ import annotations

import base64
import datetime
import http.client
import ipaddress
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Authority", "ClientCertificate", "client_context", "connection", "shared_authority"]

_VALIDITY = datetime.timedelta(days=365)
_NOW = datetime.datetime.now(datetime.UTC)
#: What `--cert-dir` holds (kube-apiserver writes apiserver.crt/.key there; kubesim adds its CA).
_FILES = ("ca.crt", "ca.key", "apiserver.crt", "apiserver.key")


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: x509.Name, public_key: ec.EllipticCurvePublicKey, issuer: x509.Name, *, expired: bool = False
) -> x509.CertificateBuilder:
    start = _NOW - (2 * _VALIDITY if expired else datetime.timedelta(minutes=5))
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + _VALIDITY)
    )


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class ClientCertificate:
    """A client certificate and its key, PEM, as a kubeconfig's `client-certificate-data` holds them."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)

    def kubeconfig_user(self) -> dict[str, str]:
        """The `user` entry of a kubeconfig (kubeadm's admin.conf has this shape)."""
        return {
            "client-certificate-data": base64.b64encode(self.cert_pem).decode(),
            "client-key-data": base64.b64encode(self.key_pem).decode(),
        }


class Authority:
    """A CA, and the serving certificate it signed for 127.0.0.1 and localhost."""

    def __init__(
        self,
        *,
        ca_key: ec.EllipticCurvePrivateKey,
        ca_cert: x509.Certificate,
        serving_key: ec.EllipticCurvePrivateKey,
        serving_cert: x509.Certificate,
    ) -> None:
        self.ca_key, self.ca_cert = ca_key, ca_cert
        self.serving_key, self.serving_cert = serving_key, serving_cert
        self.ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
        self._client_context: ssl.SSLContext | None = None

    @classmethod
    def generate(cls, common_name: str = "kubesim-ca") -> Authority:
        """A new CA, and a serving certificate for 127.0.0.1 and localhost signed by it."""
        ca_key = ec.generate_private_key(ec.SECP256R1())
        subject = _name(common_name)
        usage = x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False,
        )  # fmt: skip
        ca_cert = (
            _builder(subject, ca_key.public_key(), subject)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(usage, critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        serving_key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        serving_cert = (
            _builder(_name("kube-apiserver"), serving_key.public_key(), subject)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return cls(ca_key=ca_key, ca_cert=ca_cert, serving_key=serving_key, serving_cert=serving_cert)

    @classmethod
    def in_directory(cls, cert_dir: Path | str) -> Authority:
        """kube-apiserver's `--cert-dir`: the certificates found there, or new ones written there.

        A restarted `kubesim serve` given the same directory keeps its CA, so the
        kubeconfigs and clients of before the restart still trust it."""
        d = Path(cert_dir)
        if all((d / f).exists() for f in _FILES):
            keys = [serialization.load_pem_private_key((d / f).read_bytes(), None) for f in ("ca.key", "apiserver.key")]
            if not all(isinstance(k, ec.EllipticCurvePrivateKey) for k in keys):
                raise ValueError(f"{d}: kubesim's keys are ECDSA P-256")
            certs = [x509.load_pem_x509_certificate((d / f).read_bytes()) for f in ("ca.crt", "apiserver.crt")]
            return cls(ca_key=keys[0], ca_cert=certs[0], serving_key=keys[1], serving_cert=certs[1])  # type: ignore[arg-type]
        authority = cls.generate()
        d.mkdir(parents=True, exist_ok=True)
        for name, data in (
            ("ca.crt", authority.ca_pem),
            ("ca.key", _pem(authority.ca_key)),
            ("apiserver.crt", authority.serving_cert.public_bytes(serialization.Encoding.PEM)),
            ("apiserver.key", _pem(authority.serving_key)),
        ):
            path = d / name
            path.write_bytes(data)
            path.chmod(0o600)
        return authority

    @property
    def ca_data(self) -> str:
        """The CA as a kubeconfig's `certificate-authority-data` (base64 of the PEM)."""
        return base64.b64encode(self.ca_pem).decode()

    def issue_client(
        self, user: str, groups: tuple[str, ...] = (), *, client_auth: bool = True, valid: bool = True
    ) -> ClientCertificate:
        """A client certificate: CN `user`, one O per group (what kube-apiserver's x509
        authenticator maps to the user and its groups). `client_auth=False` leaves out the
        clientAuth extended key usage, `valid=False` makes it expired: both are refused."""
        key = ec.generate_private_key(ec.SECP256R1())
        builder = _builder(_name(user, groups), key.public_key(), self.ca_cert.subject, expired=not valid)
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client_auth else ExtendedKeyUsageOID.SERVER_AUTH
        cert = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False).sign(self.ca_key, hashes.SHA256())
        return ClientCertificate(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_pem(key))

    def client_context(self) -> ssl.SSLContext:
        """A client context that trusts this CA (built once; contexts are thread-safe)."""
        if self._client_context is None:
            self._client_context = client_context(self.ca_pem)
        return self._client_context


_shared: Authority | None = None
_shared_lock = threading.Lock()


def shared_authority() -> Authority:
    """This process's kubesim CA, generated on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Authority.generate()
        return _shared


def client_context(ca_pem: bytes | None = None) -> ssl.SSLContext:
    """A verifying client context for kubesim: trusts `ca_pem`, or this process's CA."""
    if ca_pem is None:
        return shared_authority().client_context()
    return ssl.create_default_context(cadata=ca_pem.decode())


def connection(url: str, *, timeout: float = 30.0, ca_pem: bytes | None = None) -> http.client.HTTPConnection:
    """An HTTP(S) connection to the kubesim server of `url`, verifying its certificate."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port
    if parts.scheme == "http":
        return http.client.HTTPConnection(host, port, timeout=timeout)
    return http.client.HTTPSConnection(host, port, timeout=timeout, context=client_context(ca_pem))
