"""The etcd value classifier, on envelopes built byte by byte from the protobuf wire format."""

from __future__ import annotations

import pytest

from storage_migrator.rotation.etcd_values import Encrypted, Tally, Unencrypted, Unknown, classify


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def envelope(api_version: str, kind: str, raw: bytes = b"\x0a\x02\x0a\x00") -> bytes:
    """k8s\\x00 + runtime.Unknown{typeMeta: {apiVersion, kind}, raw, contentEncoding: "", contentType: ""}."""
    type_meta = _len_field(1, api_version.encode()) + _len_field(2, kind.encode())
    unknown = _len_field(1, type_meta) + _len_field(2, raw) + _len_field(3, b"") + _len_field(4, b"")
    return b"k8s\x00" + unknown


# The ConfigMap envelope of reference/etcd-values.md, first bytes as kube-apiserver v1.36 wrote them.
REFERENCE_CONFIGMAP_HEAD = b"k8s\x00\n\x0f\n\x02v1\x12\tConfigMap"

CIPHERTEXT = bytes(range(256)) + b":with:colons"  # ciphertext may hold any byte, ':' included

CASES: list[tuple[str, bytes, object]] = [
    ("json custom resource", b'{"apiVersion":"bars.example.com/v2","kind":"Widget","metadata":{"name":"w"}}',
     Unencrypted("bars.example.com/v2", "Widget", "json")),
    ("json with spaces", b' {"kind": "Widget", "apiVersion": "bars.example.com/v1"}\n',
     Unencrypted("bars.example.com/v1", "Widget", "json")),
    ("protobuf v1 ConfigMap", envelope("v1", "ConfigMap"), Unencrypted("v1", "ConfigMap", "protobuf")),
    ("protobuf apps/v1 Deployment", envelope("apps/v1", "Deployment", raw=b"\x0a" * 300),
     Unencrypted("apps/v1", "Deployment", "protobuf")),
    ("reference ConfigMap bytes", REFERENCE_CONFIGMAP_HEAD[:4] + _len_field(1, REFERENCE_CONFIGMAP_HEAD[6:]),
     Unencrypted("v1", "ConfigMap", "protobuf")),
    ("aescbc", b"k8s:enc:aescbc:v1:key1:" + CIPHERTEXT, Encrypted("aescbc", "v1", "key1")),
    ("aesgcm, key name with - and _", b"k8s:enc:aesgcm:v1:key-2_new:" + CIPHERTEXT,
     Encrypted("aesgcm", "v1", "key-2_new")),
    ("secretbox", b"k8s:enc:secretbox:v1:sb_1:" + CIPHERTEXT, Encrypted("secretbox", "v1", "sb_1")),
    ("kms v1", b"k8s:enc:kms:v1:vault-kms:" + CIPHERTEXT, Encrypted("kms", "v1", "vault-kms")),
    ("kms v2, name with - and _", b"k8s:enc:kms:v2:my-kms_provider:" + CIPHERTEXT,
     Encrypted("kms", "v2", "my-kms_provider")),
    ("encrypted, empty ciphertext", b"k8s:enc:aescbc:v1:key1:", Encrypted("aescbc", "v1", "key1")),
    ("aescbc with v2 prefix", b"k8s:enc:aescbc:v2:key1:" + CIPHERTEXT,
     Unknown("unrecognised encryption provider or prefix version")),
    ("unknown provider", b"k8s:enc:rot13:v1:key1:abc", Unknown("unrecognised encryption provider or prefix version")),
    ("prefix cut before the key name ends", b"k8s:enc:aescbc:v1:key1", Unknown("malformed encryption prefix")),
    ("empty key name", b"k8s:enc:aescbc:v1::" + CIPHERTEXT, Unknown("malformed encryption key name")),
    ("binary key name", b"k8s:enc:aesgcm:v1:\x00\xff:" + CIPHERTEXT, Unknown("malformed encryption key name")),
    ("truncated envelope", envelope("v1", "ConfigMap")[:-6], Unknown("truncated protobuf envelope")),
    ("envelope cut inside TypeMeta", envelope("apps/v1", "Deployment")[:9], Unknown("truncated protobuf envelope")),
    ("magic only", b"k8s\x00", Unknown("protobuf envelope without TypeMeta")),
    ("envelope without apiVersion", b"k8s\x00" + _len_field(1, _len_field(2, b"ConfigMap")),
     Unknown("protobuf envelope without apiVersion")),
    ("envelope with a group wire type", b"k8s\x00\x0b\x0c", Unknown("malformed protobuf envelope")),
    ("envelope with non-UTF-8 apiVersion", b"k8s\x00" + _len_field(1, _len_field(1, b"\xff\xfe")),
     Unknown("malformed protobuf envelope")),
    ("garbage", b"\x8f\x02\xffnot a value", Unknown("not encrypted, protobuf or JSON")),
    ("broken JSON", b'{"apiVersion": "v1"', Unknown("malformed JSON")),
    ("deeply nested JSON", b'{"a":' * 100_000, Unknown("malformed JSON")),
    ("JSON without apiVersion", b'{"kind":"Widget"}', Unknown("JSON without apiVersion")),
    ("JSON apiVersion not a string", b'{"apiVersion":2}', Unknown("JSON without apiVersion")),
    ("empty", b"", Unknown("empty value")),
]  # fmt: skip


@pytest.mark.parametrize(("value", "expected"), [(v, e) for _, v, e in CASES], ids=[c[0] for c in CASES])
def test_classify(value: bytes, expected: object) -> None:
    assert classify(value) == expected


def test_reference_envelope_head_is_what_the_test_builder_writes() -> None:
    # Our hand-built envelope starts with the very bytes kube-apiserver wrote (reference/etcd-values.md).
    assert envelope("v1", "ConfigMap").startswith(REFERENCE_CONFIGMAP_HEAD)


def test_unknown_reasons_never_quote_the_value() -> None:
    secret = b"s3cr3t-sentinel"
    for value in (b"k8s:enc:aescbc:v1:" + secret, b"k8s\x00" + secret, b"{" + secret, secret):
        result = classify(value)
        assert isinstance(result, Unknown)
        assert "s3cr3t" not in repr(result)


def test_tally_counts_by_key_by_api_version_and_unknown() -> None:
    tally = Tally()
    for value in [
        b"k8s:enc:aescbc:v1:key1:x",
        b"k8s:enc:aescbc:v1:key2:x",
        b"k8s:enc:kms:v2:key2:x",
        envelope("v1", "ConfigMap"),
        b'{"apiVersion":"v1"}',
        envelope("apps/v1", "Deployment"),
        b"",
        b"garbage",
    ]:
        tally.add(classify(value))
    assert tally.total == 8
    assert dict(tally.by_key) == {"key1": 1, "key2": 2}
    assert dict(tally.unencrypted) == {"v1": 2, "apps/v1": 1}
    assert tally.unknown == 2
    assert tally.not_under("key2") == 6
    assert tally.not_under("key3") == 8
