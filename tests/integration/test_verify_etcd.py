"""`storage-migrator verify-etcd` against kubesim's real etcd, judged by reading etcd directly."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from kubesim.etcd import prefix_end
from storage_migrator.cli import main

SENTINEL = "verify-etcd-sentinel-7f3a9c"


@pytest.fixture
def core(kubesim: Any) -> Any:
    api = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    yield k8s.CoreV1Api(api)
    api.close()


def _etcd_key_names(kubesim: Any, prefix: str) -> tuple[Counter[str], int]:
    """What the test reads from etcd itself: values per encryption key name, and the total."""
    got = kubesim.etcd.range(prefix.encode(), prefix_end(prefix.encode()))
    names: Counter[str] = Counter()
    for kv in got.kvs:
        assert kv.value.startswith(b"k8s:enc:aescbc:v1:")
        names[kv.value.split(b":")[4].decode()] += 1
    return names, len(got.kvs)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["verify-etcd", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _secret(name: str, value: str = "v") -> Any:
    return k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=name), string_data={"data": value})


def test_counts_secrets_by_key_across_a_rotation(
    kubesim: Any, namespace: str, core: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(7):
        core.create_namespaced_secret(namespace, _secret(f"s{i}"))
    for i in range(3):
        core.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"c{i}")))
    kubesim.admin.set_encryption(["key2", "key1"])
    for i in range(3):  # rewritten under the new write key
        core.patch_namespaced_secret(f"s{i}", namespace, {"metadata": {"labels": {"rotated": "yes"}}})
    prefix = f"/registry/secrets/{namespace}/"
    names, total = _etcd_key_names(kubesim, prefix)
    assert names == {"key1": 4, "key2": 3} and total == 7

    code, out, err = _run(capsys, kubesim.cluster.etcd_url, prefix, "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["revision"] >= 1
    assert {k: v for k, v in doc.items() if k != "revision"} == {
        "prefix": prefix,
        "total": 7,
        "by_key": {"key1": 4, "key2": 3},
        "unencrypted": {},
        "unknown": 0,
    }

    # ConfigMaps are not encrypted in kubesim: counted by storage apiVersion.
    code, out, _ = _run(capsys, kubesim.cluster.etcd_url, f"/registry/configmaps/{namespace}/", "-o", "json")
    doc = json.loads(out)
    assert code == 0
    assert (doc["total"], doc["by_key"], doc["unencrypted"], doc["unknown"]) == (3, {}, {"v1": 3}, 0)

    # The table, like kubectl's.
    code, out, _ = _run(capsys, kubesim.cluster.etcd_url, prefix)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"7 values under {prefix} at etcd revision ")
    assert lines[1].split() == ["STORED", "AS", "KEY", "/", "API", "VERSION", "VALUES"]
    assert [line.split() for line in lines[2:]] == [["encrypted", "key1", "4"], ["encrypted", "key2", "3"]]

    # --expect-key: the verdict before removing key1; met only once every Secret is rewritten with key2.
    code, _, err = _run(capsys, kubesim.cluster.etcd_url, prefix, "-o", "json", "--expect-key", "key2")
    assert code == 1
    assert "4 of 7 values" in err and "key2" in err
    for i in range(3, 7):
        core.patch_namespaced_secret(f"s{i}", namespace, {"metadata": {"labels": {"rotated": "yes"}}})
    assert _etcd_key_names(kubesim, prefix) == ({"key2": 7}, 7)
    code, out, err = _run(capsys, kubesim.cluster.etcd_url, prefix, "--expect-key", "key2")
    assert code == 0, err
    code, _, err = _run(
        capsys, kubesim.cluster.etcd_url, f"/registry/secrets/{namespace}-none/", "--expect-key", "key2"
    )
    assert code == 1 and "no values" in err


def test_pages_at_one_revision(kubesim: Any, namespace: str, core: Any) -> None:
    """Pages of 2 over 5 Secrets, with a write after the first page: the count is the first page's snapshot."""
    from storage_migrator.rotation.etcd_scan import EtcdEndpoint, scan_prefix

    for i in range(5):
        core.create_namespaced_secret(namespace, _secret(f"p{i}"))
    prefix = f"/registry/secrets/{namespace}/"
    full = scan_prefix(EtcdEndpoint(kubesim.cluster.etcd_url), prefix, page_size=2)
    assert (full.tally.total, dict(full.tally.by_key)) == (5, {"key1": 5})
    core.create_namespaced_secret(namespace, _secret("p9"))
    assert scan_prefix(EtcdEndpoint(kubesim.cluster.etcd_url), prefix, page_size=2).tally.total == 6
    assert scan_prefix(EtcdEndpoint(kubesim.cluster.etcd_url), prefix, page_size=1).tally.total == 6


def test_never_prints_a_value(kubesim: Any, namespace: str, core: Any, capsys: pytest.CaptureFixture[str]) -> None:
    core.create_namespaced_secret(namespace, _secret("sentinel", SENTINEL))
    # An unencrypted Secret too, stored as JSON holding the sentinel in base64.
    kubesim.admin.set_encryption([], resources=[])
    core.create_namespaced_secret(namespace, _secret("plain", SENTINEL))
    prefix = f"/registry/secrets/{namespace}/"
    raw = kubesim.etcd.range(prefix.encode(), prefix_end(prefix.encode()))
    assert any(base64.b64encode(SENTINEL.encode()) in kv.value for kv in raw.kvs)  # the test would see a leak
    b64 = base64.b64encode(SENTINEL.encode()).decode()
    outputs = []
    for extra, expected in (([], 0), (["-o", "json"], 0), (["--expect-key", "key1"], 1)):
        code, out, err = _run(capsys, kubesim.cluster.etcd_url, prefix, *extra)
        assert code == expected, err
        outputs.append(out + err)
    proc = subprocess.run(
        [sys.executable, "-m", "storage_migrator.cli", "verify-etcd", kubesim.cluster.etcd_url, prefix, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["by_key"] == {"key1": 1}
    assert json.loads(proc.stdout)["unencrypted"] == {"v1": 1}
    outputs.append(proc.stdout + proc.stderr)
    for text in outputs:
        assert SENTINEL not in text and b64 not in text
        assert "sentinel" not in text and "plain" not in text  # nor the keys (object names)


def test_unreachable_endpoint_and_bad_tls(kubesim: Any, capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    from kubesim.etcd import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    code, out, err = _run(capsys, dead, "/registry/secrets/")
    assert code == 2 and out == ""
    assert f"cannot reach etcd at {dead}" in err and "https://10.0.0.1:2379" in err

    # https against a plain-text etcd: the TLS handshake fails.
    https = kubesim.cluster.etcd_url.replace("http://", "https://")
    code, _, err = _run(capsys, https, "/registry/secrets/")
    assert code == 2
    assert f"etcd at {https}" in err and "--cacert" in err

    code, _, err = _run(capsys, https, "/registry/secrets/", "--cacert", str(tmp_path / "missing.crt"))
    assert code == 2 and "cannot read --cacert" in err
    code, _, err = _run(capsys, https, "/registry/secrets/", "--cert", str(tmp_path / "c.crt"))
    assert code == 2 and "--cert and --key go together" in err
    code, _, err = _run(capsys, kubesim.cluster.etcd_url, "/registry/secrets/", "--cacert", str(tmp_path / "ca"))
    assert code == 2 and "plain http" in err


def _certs(tmp: Any) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files (a kubeadm-like etcd PKI)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    paths: dict[str, str] = {}

    def write(name: str, cert: Any, key: Any) -> None:
        (tmp / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (tmp / f"{name}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        paths[name] = str(tmp / f"{name}.crt")
        paths[f"{name}-key"] = str(tmp / f"{name}.key")

    def issue(cn: str, key: Any, issuer: Any, signer: Any, *, ca: bool, usage: Any = None) -> Any:
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if usage is not None:
            b = b.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
            b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        return b.sign(signer, hashes.SHA256())

    for ca_name in ("ca", "other-ca"):
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
        write(ca_name, issue(ca_name, key, name, key, ca=True), key)
        if ca_name == "ca":
            ca_key, ca_subject = key, name
    for leaf, usage in (("server", ExtendedKeyUsageOID.SERVER_AUTH), ("client", ExtendedKeyUsageOID.CLIENT_AUTH)):
        key = ec.generate_private_key(ec.SECP256R1())
        write(leaf, issue(leaf, key, ca_subject, ca_key, ca=False, usage=[usage]), key)
    return paths


@pytest.fixture
def tls_etcd(tmp_path: Any) -> Any:
    """An etcd of the test's own that serves TLS and requires client certificates, as kubeadm's does."""
    import time

    from kubesim.etcd import EtcdProcess, free_port

    pki = _certs(tmp_path)
    proc = EtcdProcess()
    port, peer = free_port(), f"http://127.0.0.1:{proc.peer_port}"
    url = f"https://127.0.0.1:{port}"
    args = [proc.binary, "--name", "tls", "--data-dir", str(tmp_path / "data"),
            "--listen-client-urls", url, "--advertise-client-urls", url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", f"tls={peer}",
            "--cert-file", pki["server"], "--key-file", pki["server-key"],
            "--trusted-ca-file", pki["ca"], "--client-cert-auth", "--log-level", "error", "--logger", "zap"]  # fmt: skip
    child = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import pyetcd

    def writer() -> Any:  # a fresh client per attempt: pyetcd marks a failed endpoint unusable for minutes
        return pyetcd.client(
            host="127.0.0.1",
            port=port,
            ca_cert=pki["ca"],
            cert_cert=pki["client"],
            cert_key=pki["client-key"],
            timeout=5,
        )

    try:
        deadline = time.monotonic() + 30
        while True:
            w = writer()
            try:
                w.put("/registry/secrets/default/a", b"k8s:enc:aesgcm:v1:key-b:" + SENTINEL.encode())
                break
            except Exception:
                if time.monotonic() > deadline or child.poll() is not None:
                    raise
                time.sleep(0.2)
            finally:
                w.close()
        w = writer()
        w.put("/registry/secrets/default/b", b"k8s:enc:aesgcm:v1:key-b:xyz")
        w.put("/registry/secrets/default/c", b"k8s:enc:aescbc:v1:key-a:xyz")
        w.close()
        yield url, pki
    finally:
        child.terminate()
        child.wait(timeout=10)
        proc.stop()


def test_tls_with_client_certificates(tls_etcd: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url, pki = tls_etcd
    tls = ["--cacert", pki["ca"], "--cert", pki["client"], "--key", pki["client-key"]]
    code, out, err = _run(capsys, url, "/registry/secrets/", "-o", "json", *tls)
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["total"], doc["by_key"], doc["unknown"]) == (3, {"key-a": 1, "key-b": 2}, 0)
    assert SENTINEL not in out + err

    # No client certificate: etcd (--client-cert-auth) refuses the handshake.
    code, out, err = _run(capsys, url, "/registry/secrets/", "--cacert", pki["ca"])
    assert code == 2 and out == ""
    assert f"TLS with etcd at {url} failed" in err and "--cert/--key" in err
    # The wrong CA: etcd's server certificate does not verify.
    wrong = ["--cacert", pki["other-ca"], "--cert", pki["client"], "--key", pki["client-key"]]
    code, out, err = _run(capsys, url, "/registry/secrets/", *wrong)
    assert code == 2 and out == ""
    assert f"TLS with etcd at {url} failed" in err and "--cacert" in err
