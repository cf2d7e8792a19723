"""kubesim's `--encryption-provider-config` parser (sim/kubesim/encryption.py), without etcd.

The rules and messages are those of k8s.io/apiserver's validation_encryption.go;
each bad file must be refused with a message naming the field.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
import yaml

from kubesim import codec, encryption

K32 = base64.b64encode(bytes(range(32))).decode()
K16 = base64.b64encode(bytes(range(16))).decode()


def doc(*entries: dict[str, Any], **top: Any) -> str:
    body = {"apiVersion": encryption.API_VERSION, "kind": encryption.KIND, "resources": list(entries)}
    return yaml.safe_dump({**body, **top})


def aescbc(*keys: tuple[str, str]) -> dict[str, Any]:
    return {"aescbc": {"keys": [{"name": n, "secret": s} for n, s in keys]}}


IDENTITY: dict[str, Any] = {"identity": {}}
GOOD = doc({"resources": ["secrets", "configmaps"], "providers": [aescbc(("key1", K32), ("key2", K16)), IDENTITY]})


def test_good_file_write_key_read_keys_and_identity() -> None:
    config = encryption.parse(GOOD)
    t = config.transformer("secrets")
    assert (t.write_key, t.write_secret) == ("key1", bytes(range(32)))
    assert dict(t.read_keys) == {"key1": bytes(range(32)), "key2": bytes(range(16))}
    assert t.plaintext_readable
    assert config.transformer("configmaps").write_key == "key1"
    assert config.hash.startswith("sha256:")


def test_identity_first_writes_plaintext_and_reads_both() -> None:
    t = encryption.parse(doc({"resources": ["secrets"], "providers": [IDENTITY, aescbc(("key1", K32))]})).transformer(
        "secrets"
    )
    assert t.write_key is None and t.plaintext_readable and list(t.read_keys) == ["key1"]


def test_unlisted_resource_is_plaintext_and_reads_no_key() -> None:
    t = encryption.parse(GOOD).transformer("deployments.apps")
    assert (t.write_key, dict(t.read_keys), t.plaintext_readable) == (None, {}, True)


def test_wildcards_match_after_exact_names() -> None:
    config = encryption.parse(
        doc(
            {"resources": ["secrets"], "providers": [aescbc(("s", K32))]},
            {"resources": ["*.apps"], "providers": [aescbc(("apps", K32))]},
            {"resources": ["*."], "providers": [aescbc(("core", K32))]},
            {"resources": ["*.*"], "providers": [IDENTITY]},
        )
    )
    assert config.transformer("secrets").write_key == "s"
    assert config.transformer("deployments.apps").write_key == "apps"
    assert config.transformer("configmaps").write_key == "core"
    assert config.transformer("widgets.example.com").write_key is None


def test_configured_secret_is_the_aes_key() -> None:
    """The file's secret encrypts, not kubesim's name-derived one."""
    t = encryption.parse(GOOD).transformer("secrets")
    value, _ = codec.encode({"kind": "Secret"}, write_key=t.write_key, write_secret=t.write_secret)
    assert value.startswith(b"k8s:enc:aescbc:v1:key1:")
    assert codec.decode(value, read_keys=t.read_keys).obj == {"kind": "Secret"}
    with pytest.raises(codec.DecodeError):
        codec.decode(value, read_keys=["key1"])  # the derived secret does not open it


def test_plaintext_unreadable_without_identity() -> None:
    t = encryption.parse(doc({"resources": ["secrets"], "providers": [aescbc(("key1", K32))]})).transformer("secrets")
    plain, _ = codec.encode({"kind": "Secret"}, write_key=None)
    with pytest.raises(codec.DecodeError, match="no matching prefix found"):
        codec.decode(plain, read_keys=t.read_keys, plaintext_readable=t.plaintext_readable)


BAD = [
    ("missing kind", yaml.safe_dump({"apiVersion": encryption.API_VERSION, "resources": []}), "kind: Invalid value"),
    ("wrong apiVersion", doc({"resources": ["secrets"], "providers": [IDENTITY]}, apiVersion="v1"), "apiVersion"),
    ("empty file", "", "empty"),
    ("no resources", doc(), "resources: Required value"),
    ("no providers", doc({"resources": ["secrets"], "providers": []}), r"resources\[0\]\.providers: Required"),
    (
        "bad base64",
        doc({"resources": ["secrets"], "providers": [aescbc(("key1", "not base64!"))]}),
        r"resources\[0\]\.providers\[0\]\.aescbc\.keys\[0\]\.secret: .*secrets must be base64 encoded",
    ),
    (
        "wrong length",
        doc({"resources": ["secrets"], "providers": [aescbc(("key1", base64.b64encode(b"x" * 31).decode()))]}),
        r"keys\[0\]\.secret: .*got 31, expected one of \[16, 24, 32\]",
    ),
    (
        "duplicate names",
        doc({"resources": ["secrets"], "providers": [aescbc(("key1", K32), ("key1", K16))]}),
        r"keys\[1\]\.name: Duplicate value: 'key1'",
    ),
    (
        "duplicate names across providers",
        doc({"resources": ["secrets"], "providers": [aescbc(("key1", K32)), aescbc(("key1", K16))]}),
        r"providers\[1\]\.aescbc\.keys\[0\]\.name: Duplicate value",
    ),
    (
        "unknown provider",
        doc({"resources": ["secrets"], "providers": [{"rot13": {}}]}),
        r"providers\[0\]: .*unknown field\(s\) \['rot13'\]",
    ),
    (
        "unsupported provider",
        doc({"resources": ["secrets"], "providers": [{"aesgcm": {"keys": []}}]}),
        r"providers\[0\]\.aesgcm: Unsupported value: .*use aescbc",
    ),
    (
        "two providers in one element",
        doc({"resources": ["secrets"], "providers": [{**aescbc(("key1", K32)), **IDENTITY}]}),
        "more than one provider specified in a single element",
    ),
    ("no keys", doc({"resources": ["secrets"], "providers": [aescbc()]}), r"aescbc\.keys: Required value"),
    (
        "key without name",
        doc({"resources": ["secrets"], "providers": [aescbc(("", K32))]}),
        r"keys\[0\]\.name: Required value",
    ),
    ("star alone", doc({"resources": ["*"], "providers": [IDENTITY]}), r"resources\[0\]\.resources\[0\]: .*use '\*\.'"),
    ("capitals", doc({"resources": ["Secrets"], "providers": [IDENTITY]}), "capital letters"),
    ("events group", doc({"resources": ["events.events.k8s.io"], "providers": [IDENTITY]}), "Use 'events' instead"),
    ("resource across groups", doc({"resources": ["secrets.*"], "providers": [IDENTITY]}), "across groups"),
    ("overlap", doc({"resources": ["secrets", "*."], "providers": [IDENTITY]}), "overlapping resources"),
    ("duplicate resource", doc({"resources": ["secrets", "secrets"], "providers": [IDENTITY]}), "multiple times"),
    (
        "masked by an earlier wildcard",
        doc(
            {"resources": ["*.*"], "providers": [IDENTITY]},
            {"resources": ["secrets"], "providers": [aescbc(("key1", K32))]},
        ),
        "resource 'secrets' is masked by earlier rule '\\*\\.\\*'",
    ),
]


@pytest.mark.parametrize(("case", "text", "message"), BAD, ids=[case for case, _, _ in BAD])
def test_bad_files_are_refused_naming_the_field(case: str, text: str, message: str) -> None:
    with pytest.raises(encryption.ConfigError, match=message):
        encryption.parse(text)


def test_load_names_the_file(tmp_path: Any) -> None:
    path = tmp_path / "enc.yaml"
    path.write_text(doc({"resources": ["secrets"], "providers": [aescbc(("key1", "AAAA"))]}))
    with pytest.raises(encryption.ConfigError, match=f"{path}: .*got 3, expected one of"):
        encryption.load(path)
    with pytest.raises(encryption.ConfigError, match="error reading"):
        encryption.load(tmp_path / "missing.yaml")
