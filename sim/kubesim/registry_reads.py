"""The registry's read path: GET and LIST, paged as kube-apiserver pages them.

A LIST reads at one etcd revision and answers it as its resourceVersion; a
continue token carries that revision and the next key, and one whose revision
was compacted answers 410 (`list-expired-410.txt`; kubesim.registry's docstring).

A LIST that meets values it cannot read (a key the encryption configuration no
longer holds) answers as kube-apiserver v1.36 does (KEP-3926, beta and on by
default: `AllowUnsafeMalformedObjectDeletion`; apiserver storage/etcd3
`corruptObjErrAggregator`): it reads on, skipping them, then answers 500
`StorageReadError` naming each one's etcd key in `details.causes`, at most
`MAX_CORRUPT_CAUSES` of them and then a `FieldValueTooMany` cause (issue 39:
the object count of a loss).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubesim import codec
from kubesim.continue_tokens import decode_continue, encode_continue
from kubesim.errors import StatusError, expired, not_found
from kubesim.etcd import KV, Compacted, prefix_end
from kubesim.registry_core import RegistryCore, storage_group_resource
from kubesim.resources import ResourceType

#: kube-apiserver names at most this many unreadable objects in a LIST's error, then says "truncated".
MAX_CORRUPT_CAUSES = 100


def _store_read_error(rt: ResourceType, causes: list[dict[str, str]], *, truncated: bool) -> StatusError:
    """kube-apiserver's aggregatedStorageError.NewAPIStatusError: one cause per key it could not read."""
    if truncated:
        causes = [*causes, {"reason": "FieldValueTooMany", "message": "too many errors, the list is truncated"}]
    what = rt.resource if not rt.group else f"{rt.resource}.{rt.group}"
    return StatusError(500, "StorageReadError", f"failed to read one or more {what} from the storage",
                       details={"group": rt.group, "kind": rt.resource, "name": "list", "causes": causes})  # fmt: skip


@dataclass(frozen=True)
class ListResult:
    items: list[dict[str, Any]]
    resource_version: str
    continue_token: str | None
    remaining: int | None


class RegistryReads(RegistryCore):
    """GET and LIST over the core's types and codec."""

    def _read(self, rt: ResourceType, namespace: str | None, name: str) -> tuple[KV, codec.Stored]:
        kv, _ = self.etcd.get(rt.key(namespace, name))
        if kv is None:
            raise not_found(rt.resource, rt.group, name)
        return kv, self._decode(kv, storage_group_resource(rt))

    def get(self, rt: ResourceType, version: str, namespace: str | None, name: str) -> dict[str, Any]:
        kv, stored = self._read(rt, namespace, name)
        return self.served(rt, version, stored.obj, kv)

    def list(
        self,
        rt: ResourceType,
        version: str,
        namespace: str | None,
        *,
        limit: int = 0,
        continue_token: str | None = None,
        resource_version: str | None = None,
        resource_version_match: str | None = None,
        predicate: Callable[[dict[str, Any]], bool] | None = None,
    ) -> ListResult:
        prefix = rt.list_prefix(namespace)
        end = prefix_end(prefix)
        start = prefix
        revision = 0
        if continue_token:
            token_rv, token_start = decode_continue(continue_token)
            start = prefix + token_start.encode()
            revision = max(token_rv, 0)  # -1: inconsistent continue at the current revision
        elif resource_version and resource_version != "0" and resource_version_match == "Exact":
            revision = int(resource_version)
        items: list[dict[str, Any]] = []
        more = False
        read_rev = revision
        last_key: bytes | None = None
        remaining: int | None = None
        corrupt: list[dict[str, str]] = []
        while True:
            want = (limit - len(items)) if limit else 0
            try:
                result = self.etcd.range(start, end, limit=want, revision=read_rev)
            except Compacted:
                if continue_token:
                    raise expired(encode_continue(-1, start[len(prefix) :].decode())) from None
                raise StatusError(410, "Expired", f"too old resource version: {revision}", details={}) from None
            if read_rev == 0:
                read_rev = result.revision
            for kv in result.kvs:
                last_key = kv.key
                try:
                    obj = self.served(rt, version, self._decode(kv, storage_group_resource(rt)).obj, kv)
                except StatusError as exc:  # an unreadable value: named, skipped, not counted in the page
                    if len(corrupt) >= MAX_CORRUPT_CAUSES:
                        raise _store_read_error(rt, corrupt, truncated=True) from None
                    corrupt.append({"reason": "UnexpectedServerResponse", "field": kv.key.decode(),
                                    "message": f"StorageError: corrupt object, Key: {kv.key.decode()}, "
                                               f"AdditionalErrorMsg: {exc.message}"})  # fmt: skip
                    continue
                if predicate is None or predicate(obj):
                    items.append(obj)
            if not limit or not result.more:
                break
            if len(items) >= limit:
                more = True
                remaining = result.count - len(result.kvs) if predicate is None else None
                break
            assert last_key is not None
            start = last_key + b"\0"
        if corrupt:
            raise _store_read_error(rt, corrupt, truncated=False)
        token = None
        if more and last_key is not None:
            token = encode_continue(read_rev, last_key[len(prefix) :].decode() + "\0")
        return ListResult(items=items, resource_version=str(read_rev), continue_token=token, remaining=remaining)
