"""Decoding the protobuf bodies kubectl's generators send (sim/kubesim/protobuf.py).

The bodies are hand-encoded here with a tiny encoder: the `k8s\\x00` magic, then
a `runtime.Unknown` (1: TypeMeta{1: apiVersion, 2: kind}, 2: raw, 3:
contentEncoding, 4: contentType), the raw object laid out by the field numbers
of k8s.io/api's generated.proto. Kinds kubesim does not read answer 415.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubesim import protobuf
from kubesim.errors import StatusError


# ----- a tiny protobuf encoder ----------------------------------------------
def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def ld(number: int, payload: bytes | str) -> bytes:
    """A length-delimited field (strings, bytes, messages, map entries)."""
    data = payload.encode() if isinstance(payload, str) else payload
    return tag(number, 2) + varint(len(data)) + data


def vi(number: int, value: int) -> bytes:
    return tag(number, 0) + varint(value)


def entry(number: int, key: str, value: bytes | str) -> bytes:
    return ld(number, ld(1, key) + ld(2, value))


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = ld(1, api_version) + ld(2, kind)
    return protobuf.MAGIC + ld(1, type_meta) + ld(2, raw) + ld(3, "") + ld(4, "")


def object_meta(name: str, *, namespace: str = "", extra: bytes = b"") -> bytes:
    # Go's generated Marshal writes every string (empty or not) and the zero
    # creationTimestamp as an empty Time message; JSON leaves them out.
    return ld(1, name) + ld(2, "") + ld(3, namespace) + ld(5, "") + ld(6, "") + ld(8, vi(1, 0) + vi(2, 0)) + extra


# ----- the encoder itself -----------------------------------------------------
@pytest.mark.parametrize(("n", "encoded"), [(0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x80\x01"),
                                            (300, b"\xac\x02"), (2**32, b"\x80\x80\x80\x80\x10")])  # fmt: skip
def test_varint_encoder(n: int, encoded: bytes) -> None:
    assert varint(n) == encoded
    assert list(protobuf.fields(vi(1, n))) == [(1, 0, n)]


# ----- decoding ---------------------------------------------------------------
def test_configmap() -> None:
    meta = object_meta(
        "cm1",
        namespace="default",
        extra=entry(11, "app", "web") + entry(12, "note", "hi") + ld(14, "example.com/f") + vi(7, 3),
    )
    raw = ld(1, meta) + entry(2, "k", "v") + entry(2, "k2", "") + entry(3, "bin", b"\x00\x01\xff") + vi(4, 1)
    assert protobuf.decode(envelope("v1", "ConfigMap", raw)) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "cm1",
            "namespace": "default",
            "labels": {"app": "web"},
            "annotations": {"note": "hi"},
            "finalizers": ["example.com/f"],
            "generation": 3,
        },
        "data": {"k": "v", "k2": ""},
        "binaryData": {"bin": base64.b64encode(b"\x00\x01\xff").decode()},
        "immutable": True,
    }


def test_secret_folds_string_data_into_data() -> None:
    """`kubectl create secret generic --from-literal` sends data as bytes; the API
    server answers them base64-encoded, and folds write-only stringData into data."""
    raw = ld(1, object_meta("s1")) + entry(2, "password", b"\x00s3cr3t") + ld(3, "Opaque") + entry(4, "user", "admin")
    assert protobuf.decode(envelope("v1", "Secret", raw)) == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s1"},
        "data": {
            "password": base64.b64encode(b"\x00s3cr3t").decode(),
            "user": base64.b64encode(b"admin").decode(),
        },
        "type": "Opaque",
    }


def test_secret_with_empty_type_and_immutable_false() -> None:
    raw = ld(1, object_meta("s2")) + ld(3, "") + vi(5, 0)
    assert protobuf.decode(envelope("v1", "Secret", raw)) == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s2"},
        "immutable": False,
    }


def test_creation_timestamp_and_owner_reference() -> None:
    owner = ld(1, "Deployment") + ld(3, "web") + ld(4, "uid-1") + ld(5, "apps/v1") + vi(6, 1) + vi(7, 0)
    meta = ld(1, "cm2") + ld(8, vi(1, 1_700_000_000)) + ld(13, owner)
    doc = protobuf.decode(envelope("v1", "ConfigMap", ld(1, meta)))
    assert doc["metadata"] == {
        "name": "cm2",
        "creationTimestamp": "2023-11-14T22:13:20Z",
        "ownerReferences": [
            {"kind": "Deployment", "name": "web", "uid": "uid-1", "apiVersion": "apps/v1", "controller": True,
             "blockOwnerDeletion": False}
        ],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "expected"),
    [(ld(1, "kubernetes"), {"finalizers": ["kubernetes"]}), (b"", {})],
)
def test_namespace(spec: bytes, expected: dict[str, Any]) -> None:
    doc = protobuf.decode(envelope("v1", "Namespace", ld(1, object_meta("ns1")) + ld(2, spec)))
    assert doc == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns1"}, "spec": expected}


def test_service_account() -> None:
    doc = protobuf.decode(envelope("v1", "ServiceAccount", ld(1, object_meta("sa1", namespace="ns")) + vi(4, 1)))
    assert doc == {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "sa1", "namespace": "ns"},
        "automountServiceAccountToken": True,
    }


def test_unknown_fields_are_skipped() -> None:
    fixed64 = tag(9, 1) + b"\x00" * 8
    fixed32 = tag(10, 5) + b"\x00" * 4
    raw = ld(1, object_meta("cm3")) + fixed64 + fixed32 + ld(99, "ignored") + entry(2, "k", "v")
    doc = protobuf.decode(envelope("v1", "ConfigMap", raw))
    assert doc["data"] == {"k": "v"}


@given(
    st.dictionaries(
        st.text(st.characters(exclude_categories=["Cs"])), st.text(st.characters(exclude_categories=["Cs"]))
    )
)
def test_configmap_data_round_trip(data: dict[str, str]) -> None:
    raw = ld(1, object_meta("cm")) + b"".join(entry(2, k, v) for k, v in data.items())
    doc = protobuf.decode(envelope("v1", "ConfigMap", raw))
    assert doc.get("data", {}) == data


@pytest.mark.parametrize(
    ("api_version", "kind"),
    [("apps/v1", "Deployment"), ("v1", "Pod"), ("v2", "ConfigMap"), ("", "")],
)
def test_unsupported_kind_is_415(api_version: str, kind: str) -> None:
    with pytest.raises(StatusError) as info:
        protobuf.decode(envelope(api_version, kind, ld(1, object_meta("x"))))
    err = info.value
    assert (err.code, err.reason) == (415, "UnsupportedMediaType")
    assert f"{api_version}/{kind}" in err.message
    assert err.body()["code"] == 415


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b'{"kind": "ConfigMap"}',  # JSON sent as protobuf
        ld(1, ld(1, "v1") + ld(2, "ConfigMap")),  # no magic
        protobuf.MAGIC + b"\x0a",  # a field key, then nothing
        protobuf.MAGIC + b"\x0a\x80",  # a truncated length varint
        protobuf.MAGIC + tag(1, 3),  # wire type 3 (groups) is not read
        envelope("v1", "ConfigMap", ld(1, b"\x0a\xff\xff")),  # name of bad length, truncated varint
        envelope("v1", "ConfigMap", ld(1, ld(1, b"\xff\xfe"))),  # a name that is not UTF-8
        envelope("v1", "ConfigMap", b"\x12\x10\x0a\x01k"),  # a data entry cut short (16 bytes announced)
    ],
)
def test_malformed_body_is_400(body: bytes) -> None:
    with pytest.raises(StatusError) as info:
        protobuf.decode(body)
    assert (info.value.code, info.value.reason) == (400, "BadRequest")
