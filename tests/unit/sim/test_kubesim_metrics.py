"""kubesim's /metrics, rendered and hashed (sim/kubesim/metrics.py), held to
tests/reference/apiserver-metrics-encryption-config.txt (a real v1.36.2)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from recorded import REFERENCE

from kubesim import encryption, metrics
from kubesim.__main__ import _encryption_files, parser
from kubesim.cluster import Cluster
from kubesim.server_config import EncryptionConfig, ServerConfig, admin_document

METRICS_REFERENCE = REFERENCE / "apiserver-metrics-encryption-config.txt"
#: The reference server's identity Lease name, and the hashes its /metrics reported.
REFERENCE_LEASE = "apiserver-wlv32tlttr4jl3gtroqexyxapa"
REFERENCE_ID_HASH = "sha256:73095bbbe8f317654631b5a70d7c53951e472e19c3daa5b71a50958a5e82991b"
REFERENCE_CONFIG_HASH = "sha256:571b1c486a34d3160af8a79ad1c08a159faf0e9409922f8f23d44404aabe7b48"

FILE = b"""apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
  - resources: [secrets]
    providers:
      - aescbc:
          keys:
            - {name: key1, secret: MTExMTExMTExMTExMTExMTExMTExMTExMTExMTExMTE=}
      - identity: {}
"""


def reference_lines() -> list[str]:
    """The exposition lines of the reference file (its own commentary dropped)."""
    return [
        line
        for line in METRICS_REFERENCE.read_text().splitlines()
        if line.startswith(("# HELP ", "# TYPE ", metrics.ENCRYPTION_CONFIG_INFO))
    ]


def families(text: bytes | str) -> dict[str, Any]:
    raw = text.decode() if isinstance(text, bytes) else text
    return {family.name: family for family in text_string_to_metric_families(raw)}


def config_sample(text: bytes) -> dict[str, str]:
    family = families(text)[metrics.ENCRYPTION_CONFIG_INFO]
    assert family.type == "gauge"
    [sample] = family.samples
    assert sample.value == 1
    return dict(sample.labels)


def test_id_hash_of_the_reference_lease() -> None:
    assert metrics.id_hash(REFERENCE_LEASE) == REFERENCE_ID_HASH
    [sample_line] = [line for line in reference_lines() if not line.startswith("#")]
    assert f'apiserver_id_hash="{REFERENCE_ID_HASH}"' in sample_line


def test_rendered_exactly_as_the_reference() -> None:
    """The reference server's lease name and file hash render the reference's three lines, byte for byte."""
    text = metrics.render(server_id=REFERENCE_LEASE, config_hash=REFERENCE_CONFIG_HASH, started_at=1.5).decode()
    assert text.splitlines()[:3] == reference_lines()
    assert text.endswith("\n")


def test_prometheus_client_reads_it() -> None:
    text = metrics.render(server_id="apiserver-x", config_hash="sha256:abc", started_at=1795683196.25)
    found = families(text)
    assert config_sample(text) == {"apiserver_id_hash": metrics.id_hash("apiserver-x"), "hash": "sha256:abc"}
    assert found[metrics.ENCRYPTION_CONFIG_INFO].documentation.startswith("[ALPHA] Information about the last")
    [start] = found["process_start_time_seconds"].samples
    assert start.value == 1795683196.25


def test_file_hash_is_over_the_bytes(tmp_path: Path) -> None:
    """As EncryptionFileContentHash: a comment alone (same meaning) gives another hash."""
    path = tmp_path / "enc.yaml"
    path.write_bytes(FILE)
    config = ServerConfig(server_id="apiserver-a", encryption=EncryptionConfig.from_file(path))
    expected = "sha256:" + hashlib.sha256(FILE).hexdigest()
    assert config.encryption.config_hash == expected
    assert config_sample(metrics.exposition(config, started_at=0.0)) == {
        "apiserver_id_hash": "sha256:" + hashlib.sha256(b"apiserver-a").hexdigest(),
        "hash": expected,
    }
    path.write_bytes(FILE + b"# the same configuration\n")
    assert EncryptionConfig.from_file(path).config_hash != expected


def test_admin_hash_is_stable() -> None:
    one = EncryptionConfig(resources={"secrets", "configmaps"}, keys=["key2", "key1"])
    two = EncryptionConfig(resources={"configmaps", "secrets"}, keys=["key2", "key1"])
    document = admin_document(["secrets", "configmaps"], ["key2", "key1"])
    assert one.config_hash == two.config_hash == "sha256:" + hashlib.sha256(document).hexdigest()
    assert one.config_hash.startswith("sha256:") and len(one.config_hash) == len("sha256:") + 64


@pytest.mark.parametrize(
    ("resources", "keys"),
    [
        ({"secrets"}, ["key1", "key2"]),  # another write key
        ({"secrets"}, ["key2"]),  # key1 no longer read
        ({"secrets"}, ["key2", "key1", "key3"]),  # one more read key
        ({"secrets", "configmaps"}, ["key2", "key1"]),  # one more resource
        (set(), ["key2", "key1"]),  # nothing encrypted
        ({"secrets"}, []),  # no key
    ],
)
def test_admin_hash_changes_with_any_setting(resources: set[str], keys: list[str]) -> None:
    base = EncryptionConfig(resources={"secrets"}, keys=["key2", "key1"])
    assert EncryptionConfig(resources=resources, keys=keys).config_hash != base.config_hash


@pytest.mark.parametrize(
    ("resources", "keys"), [({"secrets"}, ["key2", "key1"]), ({"secrets", "deployments.apps"}, ["k"]), (set(), ["a"])]
)
def test_admin_document_means_the_admin_settings(resources: set[str], keys: list[str]) -> None:
    """The stand-in is a valid file that writes and reads as the admin settings do."""
    admin = EncryptionConfig(resources=resources, keys=keys)
    parsed = encryption.parse(admin_document(resources, keys))
    assert parsed.hash == admin.config_hash
    for group_resource in ("secrets", "configmaps", "deployments.apps"):
        mine, theirs = admin.transformer(group_resource), parsed.transformer(group_resource)
        assert (mine.write_key, dict(mine.read_keys), mine.plaintext_readable) == (
            theirs.write_key,
            dict(theirs.read_keys),
            theirs.plaintext_readable,
        )


def test_the_switch_leaves_the_family_out(tmp_path: Path) -> None:
    path = tmp_path / "enc.yaml"
    path.write_bytes(FILE)
    for encryption_config in (EncryptionConfig(), EncryptionConfig.from_file(path)):
        config = ServerConfig(encryption=encryption_config, encryption_config_metric=False)
        text = metrics.exposition(config, started_at=2.0)
        assert metrics.ENCRYPTION_CONFIG_INFO.encode() not in text  # no HELP or TYPE either
        assert set(families(text)) == {"process_start_time_seconds"}
        config.encryption_config_metric = True
        assert metrics.ENCRYPTION_CONFIG_INFO in families(metrics.exposition(config, started_at=2.0))


def test_warmup_denial_is_worded_as_rbac_words_a_path() -> None:
    err = metrics.warmup_forbidden("alice")
    assert (err.code, err.body()["message"]) == (403, 'forbidden: User "alice" cannot get path "/metrics"')
    assert metrics.warmup_forbidden(None).body()["message"].startswith('forbidden: User "system:serviceaccount:')


def test_per_server_files_need_one_per_server() -> None:
    with pytest.raises(ValueError, match="2 files for 3 servers"):
        Cluster(servers=3, encryption_config=["a.yaml", "b.yaml"])


def test_cli() -> None:
    args = parser().parse_args(["admin", "--kubeconfig", "k", "metrics", "--no-encryption-config-info"])
    assert (args.command, args.encryption_config_info) == ("metrics", False)
    args = parser().parse_args(["admin", "--kubeconfig", "k", "metrics", "--encryption-config-info"])
    assert args.encryption_config_info is True
    serve = ["serve", "--kubeconfig", "k", "--servers", "2"]
    assert _encryption_files(parser().parse_args(serve).encryption_provider_config) is None
    one = parser().parse_args([*serve, "--encryption-provider-config", "a"])
    assert _encryption_files(one.encryption_provider_config) == "a"
    two = parser().parse_args([*serve, "--encryption-provider-config", "a", "--encryption-provider-config", "b"])
    assert _encryption_files(two.encryption_provider_config) == ["a", "b"]
