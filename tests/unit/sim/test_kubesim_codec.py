"""kubesim's etcd value codec (sim/kubesim/codec.py), without etcd.

The rules held here come from reference/etcd-values.md (Secrets stored as
`k8s:enc:aescbc:v1:key1:` + ciphertext) and DESIGN 6 (a no-op update is written
only when the encoded bytes would change, so the bytes ignore resourceVersion).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubesim import codec

SENTINEL = "codec-sentinel-value"

CONFIGMAP: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "cm", "namespace": "default", "resourceVersion": "42", "labels": {"a": "b"}},
    "data": {"k": SENTINEL, "ü": "ß ✓"},
}

json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(st.characters(exclude_categories=["Cs"]))
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(st.characters(exclude_categories=["Cs"]), max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
objects = st.fixed_dictionaries(
    {
        "apiVersion": st.sampled_from(["v1", "apps/v1", "bars.example.com/v2"]),
        "kind": st.sampled_from(["ConfigMap", "Secret", "Widget"]),
        "metadata": st.fixed_dictionaries(
            {"name": st.from_regex(r"[a-z0-9]{1,10}", fullmatch=True)},
            optional={
                "resourceVersion": st.integers(1, 10**9).map(str),
                "labels": st.dictionaries(st.text(), st.text()),
            },
        ),
    },
    optional={"data": st.dictionaries(st.text(), st.text()), "spec": json_values},
)


def without_rv(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    return {**obj, "metadata": meta}


@pytest.mark.parametrize("write_key", [None, "key1", "key-2_b"])
def test_round_trip(write_key: str | None) -> None:
    value, plaintext = codec.encode(CONFIGMAP, write_key=write_key)
    stored = codec.decode(value, read_keys=["key1", "key-2_b"])
    assert stored.obj == without_rv(CONFIGMAP)
    assert stored.api_version == "v1"
    assert stored.key_name == write_key
    assert stored.plaintext == plaintext


@given(objects, st.sampled_from([None, "key1"]))
def test_round_trip_property(obj: dict[str, Any], write_key: str | None) -> None:
    value, _ = codec.encode(obj, write_key=write_key)
    stored = codec.decode(value, read_keys=["key1"])
    assert stored.obj == without_rv(obj)
    assert stored.api_version == obj["apiVersion"]


def test_encrypted_value_has_the_aescbc_prefix_and_no_plaintext() -> None:
    """reference/etcd-values.md: `k8s:enc:aescbc:v1:key1:` + ciphertext."""
    value, plaintext = codec.encode(CONFIGMAP, write_key="key1")
    assert value.startswith(b"k8s:enc:aescbc:v1:key1:")
    assert SENTINEL.encode() not in value
    assert SENTINEL.encode() in plaintext
    body = value[len(b"k8s:enc:aescbc:v1:key1:") :]
    assert len(body) % 16 == 0  # IV + CBC blocks
    assert len(body) > len(plaintext)


def test_clear_value_is_the_plaintext_json() -> None:
    value, plaintext = codec.encode(CONFIGMAP, write_key=None)
    assert value == plaintext
    assert json.loads(value)["apiVersion"] == "v1"


def test_each_encryption_draws_a_fresh_iv() -> None:
    first, _ = codec.encode(CONFIGMAP, write_key="key1")
    second, _ = codec.encode(CONFIGMAP, write_key="key1")
    assert first != second
    assert codec.decode(first, read_keys=["key1"]).obj == codec.decode(second, read_keys=["key1"]).obj


@pytest.mark.parametrize("read_keys", [[], ["key2"], ["key2", "key3"]])
def test_unknown_key_is_a_decode_error(read_keys: list[str]) -> None:
    value, _ = codec.encode(CONFIGMAP, write_key="key1")
    with pytest.raises(codec.DecodeError, match="key1"):
        codec.decode(value, read_keys=read_keys)


def test_old_key_still_reads_after_rotation() -> None:
    value, _ = codec.encode(CONFIGMAP, write_key="key1")
    assert codec.decode(value, read_keys=["key2", "key1"]).key_name == "key1"


@pytest.mark.parametrize(
    "value",
    [
        b"k8s:enc:secretbox:v1:key1:" + b"\0" * 32,  # another provider
        b"k8s:enc:aescbc:v2:key1:" + b"\0" * 32,  # another prefix version
        b"k8s:enc:aescbc",  # truncated prefix
        b"k8s:enc:aescbc:v1:key1:" + b"\0" * 20,  # ciphertext not whole blocks
        b"k8s:enc:aescbc:v1:key1:" + b"\0" * 32,  # bad padding
        b"not json at all",
        b"[1, 2, 3]",  # JSON, but not an object
    ],
)
def test_unreadable_values_are_decode_errors(value: bytes) -> None:
    """codec.DecodeError: "a stored value cannot be read (unknown key, corrupt bytes)"."""
    with pytest.raises(codec.DecodeError):
        codec.decode(value, read_keys=["key1"])


def test_tampered_ciphertext_is_a_decode_error() -> None:
    value, _ = codec.encode(CONFIGMAP, write_key="key1")
    # Flipping a byte of the second-last block flips the same byte of the last plaintext
    # block: the padding byte, which then is never valid.
    tampered = value[:-17] + bytes([value[-17] ^ 0xFF]) + value[-16:]
    with pytest.raises(codec.DecodeError):
        codec.decode(tampered, read_keys=["key1"])


def test_canonical_json_ignores_resource_version() -> None:
    """DESIGN 6: the no-op rule compares encoded bytes; etcd's mod_revision stands
    for resourceVersion, so it is not part of them."""
    other_rv = {**CONFIGMAP, "metadata": {**CONFIGMAP["metadata"], "resourceVersion": "43"}}
    no_rv = without_rv(CONFIGMAP)
    assert codec.canonical_json(CONFIGMAP) == codec.canonical_json(other_rv) == codec.canonical_json(no_rv)
    assert b"resourceVersion" not in codec.canonical_json(CONFIGMAP)
    assert CONFIGMAP["metadata"]["resourceVersion"] == "42"  # the input is left alone


@pytest.mark.parametrize(
    "change",
    [
        {"data": {"k": "other"}},
        {"apiVersion": "v2"},
        {"metadata": {**CONFIGMAP["metadata"], "labels": {"a": "c"}}},
    ],
)
def test_canonical_json_sees_every_other_change(change: dict[str, Any]) -> None:
    assert codec.canonical_json({**CONFIGMAP, **change}) != codec.canonical_json(CONFIGMAP)


def test_canonical_json_is_independent_of_key_order() -> None:
    reordered = dict(reversed(list(CONFIGMAP.items())))
    reordered["metadata"] = dict(reversed(list(CONFIGMAP["metadata"].items())))
    assert codec.canonical_json(reordered) == codec.canonical_json(CONFIGMAP)
    assert codec.canonical_json(CONFIGMAP).startswith(b'{"apiVersion":"v1","data":')


@given(objects)
def test_canonical_json_property(obj: dict[str, Any]) -> None:
    assert codec.canonical_json(obj) == codec.canonical_json(without_rv(obj))
    assert json.loads(codec.canonical_json(obj)) == without_rv(obj)
