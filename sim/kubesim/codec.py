"""How kubesim turns an object into the bytes it keeps in etcd, and back.

kube-apiserver encodes an object in the resource's storage version, then passes
the bytes through the encryption transformer of that resource (reference/
etcd-values.md). kubesim stores JSON instead of the protobuf envelope (the
reference README allows it: the prefix and the `apiVersion` are what tests read)
and encrypts with real AES-CBC under a `k8s:enc:aescbc:v1:<key>:` prefix.

The JSON is canonical (sorted keys, no spaces, no `resourceVersion`, which
etcd's mod_revision stands for), so "would the encoded bytes differ?" (the no-op
rule, DESIGN 6) is a plain byte comparison.

Keys set through the admin API get a secret derived from their name; keys of an
`--encryption-provider-config` file (sim/kubesim/encryption.py) bring their own,
passed as `read_keys={name: secret}` and `write_secret`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

ENCRYPTED_PREFIX = b"k8s:enc:"
AESCBC = "aescbc"


class DecodeError(Exception):
    """A stored value cannot be read (unknown key, corrupt bytes)."""


@dataclass(frozen=True)
class Stored:
    """A decoded etcd value: the object and how it was stored."""

    obj: dict[str, Any]
    api_version: str
    key_name: str | None  # None: stored in the clear
    plaintext: bytes


@functools.lru_cache(maxsize=64)
def derived_secret(key_name: str) -> bytes:
    # A deterministic 256-bit key per name: the simulator needs real ciphertext
    # and a key name in the prefix, not key management.
    return hashlib.sha256(b"kubesim-aescbc:" + key_name.encode()).digest()


def encrypt(plaintext: bytes, key_name: str, secret: bytes | None = None) -> bytes:
    iv = os.urandom(16)
    padder = padding.PKCS7(128).padder()
    padded = padder.update(plaintext) + padder.finalize()
    aes = algorithms.AES(secret if secret is not None else derived_secret(key_name))
    encryptor = Cipher(aes, modes.CBC(iv)).encryptor()
    body = encryptor.update(padded) + encryptor.finalize()
    return f"k8s:enc:{AESCBC}:v1:{key_name}:".encode() + iv + body


def decrypt(value: bytes, read_keys: Sequence[str] | Mapping[str, bytes]) -> tuple[bytes, str]:
    """`read_keys`: key names (secrets derived from them) or {name: secret}."""
    header, sep, rest = value[len(ENCRYPTED_PREFIX) :].partition(b":")
    # value = k8s:enc:<provider>:v1:<key>:<iv><ciphertext>
    provider = header.decode(errors="replace")
    version, sep2, rest = rest.partition(b":")
    key_name_b, sep3, payload = rest.partition(b":")
    if not (sep and sep2 and sep3) or provider != AESCBC or version != b"v1":
        raise DecodeError(f"unsupported encryption prefix {value[:40]!r}")
    key_name = key_name_b.decode()
    if key_name not in read_keys:
        raise DecodeError(f"no read key named {key_name!r}: the value cannot be decrypted")
    iv, body = payload[:16], payload[16:]
    try:
        secret = read_keys[key_name] if isinstance(read_keys, Mapping) else derived_secret(key_name)
        decryptor = Cipher(algorithms.AES(secret), modes.CBC(iv)).decryptor()
        padded = decryptor.update(body) + decryptor.finalize()
        unpadder = padding.PKCS7(128).unpadder()
        return unpadder.update(padded) + unpadder.finalize(), key_name
    except ValueError as exc:  # short IV, partial block, bad padding: corrupt bytes
        raise DecodeError(f"the value under key {key_name!r} cannot be decrypted: {exc}") from exc


def canonical_json(obj: dict[str, Any]) -> bytes:
    """The bytes of `obj` without its resourceVersion, in one canonical form."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "resourceVersion" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}}
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def encode(obj: dict[str, Any], *, write_key: str | None, write_secret: bytes | None = None) -> tuple[bytes, bytes]:
    """(the etcd value, its plaintext) for an object already in its storage version."""
    plaintext = canonical_json(obj)
    if write_key is None:
        return plaintext, plaintext
    return encrypt(plaintext, write_key, write_secret), plaintext


def decode(value: bytes, *, read_keys: Sequence[str] | Mapping[str, bytes], plaintext_readable: bool = True) -> Stored:
    """`plaintext_readable=False`: the resource has no `identity` provider, so a value
    in the clear is refused, as kube-apiserver's prefix transformers refuse it."""
    key_name: str | None = None
    plaintext = value
    if value.startswith(ENCRYPTED_PREFIX):
        plaintext, key_name = decrypt(value, read_keys)
    elif not plaintext_readable:
        raise DecodeError(
            "no matching prefix found: the value is stored in plaintext and the resource has no identity provider"
        )
    try:
        obj = json.loads(plaintext)
    except ValueError as exc:
        raise DecodeError(f"stored value is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise DecodeError("stored value is not a JSON object")
    return Stored(obj=obj, api_version=str(obj.get("apiVersion", "")), key_name=key_name, plaintext=plaintext)
