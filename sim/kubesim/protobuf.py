"""Reading the protobuf bodies kubectl's generators send.

`kubectl create secret generic`, `create configmap` and `create namespace` post
`application/vnd.kubernetes.protobuf` whatever the server prefers (the `-f`
forms send JSON). kube-apiserver accepts both; kubesim decodes the envelope
(`k8s\\x00` + `runtime.Unknown`) and the few simple kinds those generators
make, from their field numbers in k8s.io/api's generated.proto. Answers are
always JSON, which kubectl accepts.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from kubesim.errors import StatusError

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of every field of a message."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos : pos + length], pos + length
        elif wire == 1:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(data):
            raise ValueError(f"field {number} runs past the end of its message")
        yield number, wire, value


def _str(v: bytes) -> str:
    return v.decode()


def _map_entry(v: bytes, value_decoder: Callable[[bytes], Any]) -> tuple[str, Any]:
    key, value = "", value_decoder(b"")
    for n, _, x in fields(v):
        if n == 1:
            key = _str(x)
        elif n == 2:
            value = value_decoder(x)
    return key, value


def _time(v: bytes) -> str:
    seconds = 0
    for n, _, x in fields(v):
        if n == 1:
            seconds = x
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _owner_reference(v: bytes) -> dict[str, Any]:
    names = {1: "kind", 3: "name", 4: "uid", 5: "apiVersion"}
    out: dict[str, Any] = {}
    for n, _, x in fields(v):
        if n in names:
            out[names[n]] = _str(x)
        elif n == 6:
            out["controller"] = bool(x)
        elif n == 7:
            out["blockOwnerDeletion"] = bool(x)
    return out


def object_meta(v: bytes) -> dict[str, Any]:
    # Go's generated Marshal writes every scalar, empty or not; Go's JSON drops
    # the empty ones (omitempty), so a decoded "" or 0 must not reach the object.
    strings = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
    meta: dict[str, Any] = {}
    for n, _, x in fields(v):
        if n in strings:
            if x:
                meta[strings[n]] = _str(x)
        elif n == 7:
            if x:
                meta["generation"] = x
        elif n == 8:
            if any(tn == 1 and tv for tn, _, tv in fields(x)):
                meta["creationTimestamp"] = _time(x)
        elif n == 11:
            k, val = _map_entry(x, _str)
            meta.setdefault("labels", {})[k] = val
        elif n == 12:
            k, val = _map_entry(x, _str)
            meta.setdefault("annotations", {})[k] = val
        elif n == 13:
            meta.setdefault("ownerReferences", []).append(_owner_reference(x))
        elif n == 14:
            meta.setdefault("finalizers", []).append(_str(x))
    return meta


def _b64(v: bytes) -> str:
    return base64.b64encode(v).decode()


def _config_map(raw: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for n, _, x in fields(raw):
        if n == 1:
            obj["metadata"] = object_meta(x)
        elif n == 2:
            k, val = _map_entry(x, _str)
            obj.setdefault("data", {})[k] = val
        elif n == 3:
            k, val = _map_entry(x, _b64)
            obj.setdefault("binaryData", {})[k] = val
        elif n == 4:
            obj["immutable"] = bool(x)
    return obj


def _secret(raw: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for n, _, x in fields(raw):
        if n == 1:
            obj["metadata"] = object_meta(x)
        elif n == 2:
            k, val = _map_entry(x, _b64)
            obj.setdefault("data", {})[k] = val
        elif n == 3:
            if x:
                obj["type"] = _str(x)
        elif n == 4:
            k, val = _map_entry(x, _str)
            obj.setdefault("stringData", {})[k] = val
        elif n == 5:
            obj["immutable"] = bool(x)
    # stringData is write-only: the API server folds it into data.
    for k, val in obj.pop("stringData", {}).items():
        obj.setdefault("data", {})[k] = _b64(val.encode())
    return obj


def _namespace(raw: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for n, _, x in fields(raw):
        if n == 1:
            obj["metadata"] = object_meta(x)
        elif n == 2:
            finalizers = [_str(f) for fn, _, f in fields(x) if fn == 1]
            obj["spec"] = {"finalizers": finalizers} if finalizers else {}
    return obj


def _service_account(raw: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for n, _, x in fields(raw):
        if n == 1:
            obj["metadata"] = object_meta(x)
        elif n == 4:
            obj["automountServiceAccountToken"] = bool(x)
    return obj


_KINDS: dict[tuple[str, str], Callable[[bytes], dict[str, Any]]] = {
    ("v1", "ConfigMap"): _config_map,
    ("v1", "Secret"): _secret,
    ("v1", "Namespace"): _namespace,
    ("v1", "ServiceAccount"): _service_account,
}


def decode(body: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf-encoded object, or 415 naming what kubesim reads."""
    if not body.startswith(MAGIC):
        raise StatusError(400, "BadRequest", "protobuf body without the k8s envelope", details={})
    api_version = kind = ""
    raw = b""
    try:
        for n, _, x in fields(body[len(MAGIC) :]):
            if n == 1:
                for tn, _, tv in fields(x):
                    if tn == 1:
                        api_version = _str(tv)
                    elif tn == 2:
                        kind = _str(tv)
            elif n == 2:
                raw = x
        decoder = _KINDS.get((api_version, kind))
        if decoder is None:
            raise StatusError(
                415,
                "UnsupportedMediaType",
                f"kubesim reads protobuf only for {sorted(k for _, k in _KINDS)}, not {api_version}/{kind}: "
                "send JSON (kubectl create -f FILE does)",
                details={},
            )
        return {"apiVersion": api_version, "kind": kind, **decoder(raw)}
    except (ValueError, UnicodeDecodeError) as exc:
        raise StatusError(400, "BadRequest", f"malformed protobuf body: {exc}", details={}) from exc
