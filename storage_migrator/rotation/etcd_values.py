"""What an etcd value written by kube-apiserver says about how it is stored.

Design decision: the operator's last check before removing an old encryption
key (DESIGN 4.8) reads etcd itself, so it must recognise every value
kube-apiserver writes (reference/etcd-values.md) from its first bytes alone,
without decrypting anything and without generated protobuf classes:

- `k8s:enc:<provider>:v1:<key>:` + ciphertext (aescbc, aesgcm, secretbox, kms
  v1), `k8s:enc:kms:v2:<key>:` (kms v2): counted by key name;
- `k8s\\x00` + a `runtime.Unknown` protobuf message (built-in resources): its
  TypeMeta's apiVersion is the storage version;
- JSON (custom resources): the top-level `apiVersion` is the storage version.

Anything else is `Unknown`, with a reason that is a fixed string: a reason
never quotes the value (DESIGN 8: these are Secrets).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

__all__ = [
    "Classification",
    "Encrypted",
    "Tally",
    "Unencrypted",
    "Unknown",
    "classify",
]

ENCRYPTED_MAGIC = b"k8s:enc:"
PROTOBUF_MAGIC = b"k8s\x00"

# Providers that write `k8s:enc:<provider>:<version>:<key>:`, with the versions
# kube-apiserver uses for each (the identity provider writes plain values).
_PREFIX_VERSIONS: dict[str, frozenset[str]] = {
    "aescbc": frozenset({"v1"}),
    "aesgcm": frozenset({"v1"}),
    "secretbox": frozenset({"v1"}),
    "kms": frozenset({"v1", "v2"}),
}
# A key name is printable ASCII without ':' (the prefix separator); a longer
# "name" means the bytes after the version are not a prefix at all.
_MAX_KEY_NAME = 256
_MAX_API_VERSION = 256


@dataclass(frozen=True)
class Encrypted:
    provider: str  # aescbc, aesgcm, secretbox, kms
    version: str  # of the prefix: v1, or v2 for kms v2
    key: str  # the key name of the EncryptionConfiguration


@dataclass(frozen=True)
class Unencrypted:
    api_version: str  # the storage version, e.g. "v1", "apps/v1", "bars.example.com/v2"
    kind: str  # "" when the value does not say
    encoding: str  # "protobuf" or "json"


@dataclass(frozen=True)
class Unknown:
    reason: str  # a fixed description, never bytes of the value


Classification = Encrypted | Unencrypted | Unknown


class _Truncated(Exception):
    pass


def classify(value: bytes) -> Classification:
    """How `value` is stored; never raises, never keeps or quotes the value."""
    if not value:
        return Unknown("empty value")
    if value.startswith(ENCRYPTED_MAGIC):
        return _encrypted(value)
    if value.startswith(PROTOBUF_MAGIC):
        return _protobuf(value)
    return _json(value)


def _encrypted(value: bytes) -> Classification:
    # k8s:enc:<provider>:<version>:<key>:<ciphertext>; the ciphertext may hold ':'.
    parts = value[len(ENCRYPTED_MAGIC) :].split(b":", 3)
    if len(parts) < 4:
        return Unknown("malformed encryption prefix")
    provider_b, version_b, key_b, _ciphertext = parts
    provider = provider_b.decode("ascii", errors="replace")
    version = version_b.decode("ascii", errors="replace")
    if version not in _PREFIX_VERSIONS.get(provider, frozenset()):
        return Unknown("unrecognised encryption provider or prefix version")
    if not key_b or len(key_b) > _MAX_KEY_NAME or not all(0x21 <= b <= 0x7E for b in key_b):
        return Unknown("malformed encryption key name")
    return Encrypted(provider=provider, version=version, key=key_b.decode("ascii"))


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise _Truncated
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 64:
            raise ValueError("varint longer than 10 bytes")


def _fields(buf: bytes) -> list[tuple[int, int, bytes | int]]:
    """(field number, wire type, payload) of every field of a protobuf message.

    Only the wire format: varint (0), 64-bit (1), length-delimited (2) and
    32-bit (5); groups (3, 4) are not used by Kubernetes and mean garbage.
    """
    out: list[tuple[int, int, bytes | int]] = []
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire == 0:
            v, pos = _varint(buf, pos)
            out.append((number, wire, v))
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if pos + size > len(buf):
                raise _Truncated
            out.append((number, wire, buf[pos : pos + size]))
            pos += size
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise _Truncated
            out.append((number, wire, buf[pos : pos + length]))
            pos += length
        else:
            raise ValueError(f"wire type {wire}")
    return out


def _string_field(fields: list[tuple[int, int, bytes | int]], number: int) -> str | None:
    found: str | None = None
    for n, wire, payload in fields:
        if n == number:
            if wire != 2 or not isinstance(payload, bytes):
                raise ValueError("not a string field")
            found = payload.decode("utf-8")  # the last one wins, as in protobuf
    return found


def _protobuf(value: bytes) -> Classification:
    # k8s\x00 + runtime.Unknown{1: TypeMeta{1: apiVersion, 2: kind}, 2: raw,
    # 3: contentEncoding, 4: contentType} (apimachinery runtime/serializer/protobuf).
    try:
        unknown = _fields(value[len(PROTOBUF_MAGIC) :])
        type_meta = [p for n, w, p in unknown if n == 1 and w == 2 and isinstance(p, bytes)]
        if not type_meta:
            return Unknown("protobuf envelope without TypeMeta")
        meta = _fields(type_meta[-1])
        api_version = _string_field(meta, 1)
        kind = _string_field(meta, 2) or ""
    except _Truncated:
        return Unknown("truncated protobuf envelope")
    except (ValueError, UnicodeDecodeError):
        return Unknown("malformed protobuf envelope")
    if not api_version or len(api_version) > _MAX_API_VERSION:
        return Unknown("protobuf envelope without apiVersion")
    return Unencrypted(api_version=api_version, kind=kind, encoding="protobuf")


def _json(value: bytes) -> Classification:
    if value.lstrip()[:1] != b"{":
        return Unknown("not encrypted, protobuf or JSON")
    try:
        obj = json.loads(value)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return Unknown("malformed JSON")
    api_version = obj.get("apiVersion") if isinstance(obj, dict) else None
    if not isinstance(api_version, str) or not api_version or len(api_version) > _MAX_API_VERSION:
        return Unknown("JSON without apiVersion")
    kind = obj.get("kind")
    return Unencrypted(api_version=api_version, kind=kind if isinstance(kind, str) else "", encoding="json")


@dataclass
class Tally:
    """Counts of classified values: by key name, by storage apiVersion, unknown by reason."""

    total: int = 0
    by_key: Counter[str] = field(default_factory=Counter)
    unencrypted: Counter[str] = field(default_factory=Counter)
    unknown_reasons: Counter[str] = field(default_factory=Counter)

    def add(self, c: Classification) -> None:
        self.total += 1
        if isinstance(c, Encrypted):
            self.by_key[c.key] += 1
        elif isinstance(c, Unencrypted):
            self.unencrypted[c.api_version] += 1
        else:
            self.unknown_reasons[c.reason] += 1

    @property
    def unknown(self) -> int:
        return sum(self.unknown_reasons.values())

    def not_under(self, key: str) -> int:
        """How many values are not encrypted with `key` (the verdict before removing an old key)."""
        return self.total - self.by_key.get(key, 0)
