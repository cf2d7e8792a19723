"""The objects of every resource, kept in etcd as kube-apiserver keeps them.

One `Registry` per simulated API server. Several registries may share one etcd
(an HA cluster): each has its own `ServerConfig` (storage versions and
encryption keys: what an upgrade changes), while CRDs live in etcd and are
shared, as on a real cluster.

Semantics held to kube-apiserver (DESIGN 6, reference/):
- resourceVersion is etcd's mod_revision; a LIST's is the revision it read at;
- every write is a compare-and-swap on mod_revision (optimistic concurrency);
- an update that changes nothing is written only when the encoded bytes would
  differ (another storage version) or the value is under a key other than the
  current write key; otherwise it answers the old resourceVersion (the no-op
  rule, `patch-noop-same-rv.json`);
- continue tokens are base64url of `{"v":"meta.k8s.io/v1","rv":N,"start":...}`;
  a token whose revision was compacted answers 410 `Expired` with an
  inconsistent token (`rv: -1`, `list-expired-410.txt`).
"""

from __future__ import annotations

import base64
import copy
import random
import re
import string
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from kubesim import codec
from kubesim.continue_tokens import decode_continue, encode_continue
from kubesim.crds import admit_custom_resource, crd_established, crd_status, validate_crd
from kubesim.errors import (
    StatusError,
    already_exists,
    bad_request,
    conflict,
    expired,
    internal,
    invalid,
    not_found,
    resource_not_found,
)
from kubesim.etcd import KV, Compacted, EtcdStore, prefix_end
from kubesim.managed_fields import managed_fields_entry, now_rfc3339
from kubesim.patching import PatchError, apply_patch
from kubesim.resources import ResourceType, builtin_resources, resource_from_crd
from kubesim.server_config import ServerConfig

CRD_PREFIX = b"/registry/apiextensions.k8s.io/customresourcedefinitions/"
NAMESPACE_PREFIX = b"/registry/namespaces/"
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_UPDATE_ATTEMPTS = 16
# How stale the CRD cache may be (a real API server also takes a moment to serve a new CRD).
_CRD_RECHECK_SECONDS = 0.25


def storage_group_resource(rt: ResourceType) -> str:
    """The group-resource a type's objects are stored under (shared by events)."""
    res = rt.storage_resource or rt.resource
    return f"{res}.{rt.stored_group}" if rt.stored_group else res


def _content(obj: dict[str, Any]) -> dict[str, Any]:
    """What counts as a change for `generation` (spec and the like, not metadata or status)."""
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}


def _without_volatile(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in ("resourceVersion", "managedFields")}
    return {**obj, "metadata": meta}


@dataclass(frozen=True)
class ListResult:
    items: list[dict[str, Any]]
    resource_version: str
    continue_token: str | None
    remaining: int | None


@dataclass(frozen=True)
class WatchEvent:
    type: str
    obj: dict[str, Any]


class Registry:
    """The REST storage of one simulated API server."""

    def __init__(self, etcd: EtcdStore, config: ServerConfig | None = None) -> None:
        self.etcd = etcd
        self.config = config or ServerConfig()
        self.lock = threading.RLock()
        self._builtins = builtin_resources()
        self._crd_types: dict[tuple[str, str], ResourceType] = {}
        self._crd_revision = -1
        self._crd_checked_at = 0.0

    # ----- resource types -------------------------------------------------
    def builtin_types(self) -> list[ResourceType]:
        out = []
        for rt in self._builtins:
            if rt.feature_gate is not None and rt.feature_gate not in self.config.feature_gates:
                continue
            version = self.config.storage_versions.get(storage_group_resource(rt))
            verbs = self.config.verbs.get(storage_group_resource(rt))
            if version or verbs is not None:
                rt = replace(
                    rt, storage_version=version or rt.storage_version, verbs=rt.verbs if verbs is None else verbs
                )
            out.append(rt)
        return out

    def refresh_crds(self, *, force: bool = False) -> None:
        """Re-read CRDs now and then (another server may have written one)."""
        if not force and time.monotonic() - self._crd_checked_at < _CRD_RECHECK_SECONDS:
            return
        self._crd_checked_at = time.monotonic()
        result = self.etcd.range(CRD_PREFIX, prefix_end(CRD_PREFIX))
        signature = hash(tuple((kv.key, kv.mod_revision) for kv in result.kvs))
        if signature == self._crd_revision:
            return
        types: dict[tuple[str, str], ResourceType] = {}
        for kv in result.kvs:
            crd = self._decode(kv, "customresourcedefinitions.apiextensions.k8s.io").obj
            rt = resource_from_crd(crd)
            if rt is not None and crd_established(crd):
                types[(rt.group, rt.resource)] = rt
        with self.lock:
            self._crd_types = types
            self._crd_revision = signature

    def resource_types(self) -> list[ResourceType]:
        self.refresh_crds()
        return self.builtin_types() + list(self._crd_types.values())

    def lookup(self, group: str, version: str, resource: str) -> ResourceType:
        for rt in self.resource_types():
            if rt.group == group and rt.resource == resource and version in rt.served_versions:
                return rt
        raise resource_not_found()

    # ----- encoding -------------------------------------------------------
    def _decode(self, kv: KV, group_resource: str) -> codec.Stored:
        t = self.config.encryption.transformer(group_resource)
        try:
            return codec.decode(kv.value, read_keys=t.read_keys, plaintext_readable=t.plaintext_readable)
        except codec.DecodeError as exc:
            raise internal(f"unable to transform key {kv.key.decode()!r} of {group_resource}: {exc}") from exc

    def _encode(self, rt: ResourceType, obj: dict[str, Any]) -> tuple[bytes, bytes]:
        stored = self.to_storage(rt, obj)
        t = self.config.encryption.transformer(storage_group_resource(rt))
        return codec.encode(stored, write_key=t.write_key, write_secret=t.write_secret)

    def to_storage(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        # Conversion is an apiVersion rewrite (no webhooks, no field renames).
        stored = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        meta = {k: v for k, v in (stored.get("metadata") or {}).items() if k != "resourceVersion"}
        return {
            "apiVersion": rt.stored_api_version(rt.storage_version),
            "kind": rt.stored_kind,
            **{**stored, "metadata": meta},
        }

    def served(self, rt: ResourceType, version: str, stored: dict[str, Any], kv: KV | int) -> dict[str, Any]:
        rv = kv if isinstance(kv, int) else kv.mod_revision
        obj = {k: v for k, v in stored.items() if k not in ("apiVersion", "kind")}
        meta = dict(obj.get("metadata") or {})
        meta["resourceVersion"] = str(rv)
        obj["metadata"] = meta
        return {"apiVersion": rt.group_version(version), "kind": rt.kind, **obj}

    # ----- reads ----------------------------------------------------------
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
                obj = self.served(rt, version, self._decode(kv, storage_group_resource(rt)).obj, kv)
                last_key = kv.key
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
        token = None
        if more and last_key is not None:
            token = encode_continue(read_rev, last_key[len(prefix) :].decode() + "\0")
        return ListResult(items=items, resource_version=str(read_rev), continue_token=token, remaining=remaining)

    # ----- writes ---------------------------------------------------------
    def _check_namespace(self, rt: ResourceType, namespace: str | None) -> None:
        if not rt.namespaced:
            return
        if not namespace:
            raise bad_request("the server could not find the requested resource: a namespace is required")
        kv, _ = self.etcd.get(NAMESPACE_PREFIX + namespace.encode())
        if kv is None:
            raise not_found("namespaces", "", namespace)

    def _validate_name(self, rt: ResourceType, name: str) -> None:
        pattern = _LABEL_RE if rt.resource == "namespaces" else _NAME_RE
        limit = 63 if rt.resource == "namespaces" else 253
        if not name:
            raise invalid(
                rt.kind, rt.group, name, [("metadata.name", "Required value: name or generateName is required")]
            )
        if rt.group == "rbac.authorization.k8s.io":
            # RBAC names are path segments (ValidateRBACName): `system:discovery` is valid.
            bad = f"may not be '{name}'" if name in (".", "..") else None
            bad = bad or next((f"may not contain '{c}'" for c in ("/", "%") if c in name), None)
            if bad:
                raise invalid(rt.kind, rt.group, name, [("metadata.name", f'Invalid value: "{name}": {bad}')])
            return
        if len(name) > limit or not pattern.match(name):
            raise invalid(
                rt.kind,
                rt.group,
                name,
                [
                    (
                        "metadata.name",
                        f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case '
                        "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
                    )
                ],
            )

    def _check_body(self, rt: ResourceType, version: str, body: Any, namespace: str | None) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise bad_request("the body of the request was in an unknown format")
        expected = rt.group_version(version)
        api_version = body.get("apiVersion")
        if api_version and api_version != expected:
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version ({expected})"
            )
        kind = body.get("kind")
        if kind and kind != rt.kind:
            raise bad_request(f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})")
        meta = body.get("metadata")
        if meta is not None and not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        body_ns = (meta or {}).get("namespace")
        if rt.namespaced and body_ns and namespace and body_ns != namespace:
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        if meta:
            # ObjectMeta's maps and lists are omitempty: removing the last label leaves no `labels: {}`.
            for empty in [k for k in ("labels", "annotations", "finalizers", "ownerReferences") if k in meta]:
                if not meta[empty]:
                    del meta[empty]
        return body

    def create(
        self,
        rt: ResourceType,
        version: str,
        namespace: str | None,
        body: Any,
        *,
        manager: str = "kubesim",
        dry_run: bool = False,
    ) -> dict[str, Any]:
        body = self._check_body(rt, version, body, namespace)
        obj = copy.deepcopy(body)
        obj["apiVersion"] = rt.group_version(version)
        obj["kind"] = rt.kind
        meta = obj.setdefault("metadata", {})
        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            name = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        self._validate_name(rt, name)
        meta["name"] = name
        if rt.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        self._check_namespace(rt, namespace)
        for volatile in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(volatile, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        if rt.has_generation:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        if "status" in rt.subresources and rt.resource != "customresourcedefinitions":
            obj.pop("status", None)
        obj = self._prepare_for_create(rt, obj)
        meta = obj["metadata"]
        meta["managedFields"] = [managed_fields_entry(obj, manager=manager, api_version=obj["apiVersion"])]
        value, _ = self._encode(rt, obj)
        if dry_run:
            # DryRunnableStorage.Create: an existing name is refused as on a real create; the
            # answer is the object as it would be stored, without a resourceVersion (none yet).
            if self.etcd.get(rt.key(namespace, name))[0] is not None:
                raise already_exists(rt.resource, rt.group, name)
            would_be = self.served(rt, version, self.to_storage(rt, obj), 0)
            del would_be["metadata"]["resourceVersion"]
            return would_be
        rev = self.etcd.create(rt.key(namespace, name), value)
        if rev is None:
            raise already_exists(rt.resource, rt.group, name)
        self._after_write(rt)
        return self.served(rt, version, self.to_storage(rt, obj), rev)

    def _prepare_for_create(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        if rt.resource == "namespaces" and not rt.group:
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj["status"] = {"phase": "Active"}
        if rt.resource == "secrets" and not rt.group:
            _merge_string_data(obj)
            if not obj.get("type"):
                obj["type"] = "Opaque"  # SetDefaults_Secret (kubectl create secret generic sends none)
        if rt.resource == "customresourcedefinitions":
            validate_crd(obj)
            obj["status"] = crd_status(obj, None)
        if rt.is_custom:
            obj = self._admit_custom(rt, obj, None)
        return obj

    def _prepare_for_update(self, rt: ResourceType, new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
        if rt.resource == "secrets" and not rt.group:
            _merge_string_data(new)
            if not new.get("type"):
                new["type"] = "Opaque"  # defaulted on every write, as on create
        if rt.resource == "customresourcedefinitions":
            validate_crd(new, old)
            new["status"] = crd_status(new, old.get("status") or {}, requested=new.get("status"))
        if rt.is_custom:
            new = self._admit_custom(rt, new, old)
        return new

    def _admit_custom(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        # Pruned and validated against the schema of the version being written (crds.py).
        version = obj["apiVersion"].rpartition("/")[2]
        return admit_custom_resource(rt.kind, rt.group, obj, rt.crd_schemas.get(version) or {}, old)

    def _after_write(self, rt: ResourceType) -> None:
        if rt.resource == "customresourcedefinitions":
            self.refresh_crds(force=True)

    def update(
        self,
        rt: ResourceType,
        version: str,
        namespace: str | None,
        name: str,
        mutate: Callable[[dict[str, Any]], Any],
        *,
        subresource: str | None = None,
        manager: str = "kubesim",
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Read, let `mutate` produce the new object from the served current one, write with CAS.

        `mutate` raises on a failed precondition; it is called again when another
        writer won the race (GuaranteedUpdate), so a patch without a
        resourceVersion is re-applied to the newer object.
        """
        for _ in range(_UPDATE_ATTEMPTS):
            kv, stored = self._read(rt, namespace, name)
            current = self.served(rt, version, stored.obj, kv)
            proposed = mutate(copy.deepcopy(current))
            proposed = self._check_body(rt, version, proposed, namespace)
            new = self._merge_update(rt, version, current, proposed, subresource, name)
            self._fix_managed_fields(new, current, manager)
            value, plaintext = self._encode(rt, new)
            stale_key = stored.key_name != self.config.encryption.write_key(storage_group_resource(rt))
            if plaintext == stored.plaintext and not stale_key:
                return current  # the no-op rule: nothing would change in etcd
            if dry_run:
                return self.served(rt, version, self.to_storage(rt, new), kv)
            rev = self.etcd.update(rt.key(namespace, name), value, mod_revision=kv.mod_revision)
            if rev is not None:
                self._after_write(rt)
                return self.served(rt, version, self.to_storage(rt, new), rev)
        raise StatusError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {rt.group_resource} "{name}": too many concurrent writers',
        )

    def _merge_update(
        self,
        rt: ResourceType,
        version: str,
        current: dict[str, Any],
        proposed: dict[str, Any],
        subresource: str | None,
        name: str,
    ) -> dict[str, Any]:
        proposed_meta = proposed.get("metadata") or {}
        if proposed_meta.get("name") not in (None, "", name):
            raise bad_request(
                f"the name of the object ({proposed_meta.get('name')}) does not match the name on the URL ({name})"
            )
        rv = proposed_meta.get("resourceVersion")
        if rv not in (None, "") and str(rv) != current["metadata"]["resourceVersion"]:
            raise conflict(rt.resource, rt.group, name)
        cur_meta = current["metadata"]
        uid = proposed_meta.get("uid")
        if uid not in (None, "") and uid != cur_meta.get("uid"):
            # kube-apiserver treats a uid in the body as a precondition (the object was re-created).
            raise StatusError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {rt.group_resource} "{name}": Precondition failed: '
                f"UID in precondition: {uid}, UID in object meta: {cur_meta.get('uid')}",
                details={"name": name, **({"group": rt.group} if rt.group else {}), "kind": rt.resource},
            )
        if subresource == "status":
            new = copy.deepcopy(current)
            if "status" in proposed:
                new["status"] = proposed["status"]
            else:
                new.pop("status", None)
            if rt.resource == "customresourcedefinitions" or rt.is_custom:
                new = self._prepare_for_update(rt, new, current)
            return new
        new = copy.deepcopy(proposed)
        new["apiVersion"] = rt.group_version(version)
        new["kind"] = rt.kind
        meta = dict(proposed_meta)
        for immutable in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "generation"):
            if immutable in cur_meta:
                meta[immutable] = cur_meta[immutable]
            else:
                meta.pop(immutable, None)
        new["metadata"] = meta
        if "status" in rt.subresources and rt.resource != "customresourcedefinitions":
            # The main resource ignores status when a status subresource exists.
            if "status" in current:
                new["status"] = current["status"]
            else:
                new.pop("status", None)
        new = self._prepare_for_update(rt, new, current)
        if rt.has_generation and _content(new) != _content(current):
            meta["generation"] = int(cur_meta.get("generation", 1)) + 1
        return new

    def _fix_managed_fields(self, new: dict[str, Any], current: dict[str, Any], manager: str) -> None:
        meta = new["metadata"]
        old_entries = current["metadata"].get("managedFields")
        if "managedFields" not in meta and old_entries is not None:
            meta["managedFields"] = old_entries
        if _without_volatile(new) == _without_volatile(current):
            meta["managedFields"] = old_entries  # nothing changed: keep the timestamps as they were
            if old_entries is None:
                meta.pop("managedFields", None)
            return
        entries = [e for e in (meta.get("managedFields") or []) if e.get("manager") != manager]
        entries.append(managed_fields_entry(new, manager=manager, api_version=new["apiVersion"]))
        meta["managedFields"] = entries

    def patch(
        self,
        rt: ResourceType,
        version: str,
        namespace: str | None,
        name: str,
        content_type: str,
        patch: Any,
        *,
        subresource: str | None = None,
        manager: str = "kubesim",
        dry_run: bool = False,
    ) -> dict[str, Any]:
        def mutate(current: dict[str, Any]) -> Any:
            try:
                result = apply_patch(content_type, current, patch)
            except PatchError as exc:
                raise StatusError(422, "Invalid", str(exc), details={}) from exc
            if not isinstance(result, dict):
                raise bad_request("the patch does not produce an object")
            # A patch that names a resourceVersion is a precondition on it.
            patched_rv = (result.get("metadata") or {}).get("resourceVersion")
            if patched_rv is None:
                result.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
            return result

        return self.update(
            rt, version, namespace, name, mutate, subresource=subresource, manager=manager, dry_run=dry_run
        )

    def delete(
        self,
        rt: ResourceType,
        version: str,
        namespace: str | None,
        name: str,
        *,
        preconditions: dict[str, Any] | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        pre = preconditions or {}
        while True:
            kv, stored = self._read(rt, namespace, name)
            current = self.served(rt, version, stored.obj, kv)
            if pre.get("resourceVersion") and str(pre["resourceVersion"]) != current["metadata"]["resourceVersion"]:
                raise conflict(rt.resource, rt.group, name)
            if pre.get("uid") and pre["uid"] != current["metadata"].get("uid"):
                raise conflict(rt.resource, rt.group, name)
            if dry_run or self.etcd.delete(rt.key(namespace, name), mod_revision=kv.mod_revision) is not None:
                break
            # kube-apiserver's etcd3 store (conditionalDelete) re-reads and retries when the
            # object changed between its read and its delete: a DELETE without preconditions
            # never answers 409 for a concurrent write; with them, the fresh object is checked.
        if not dry_run:
            if rt.resource == "namespaces" and not rt.group:
                self._delete_namespace_contents(name)
            if rt.resource == "customresourcedefinitions":
                self._delete_custom_resources(stored.obj)
            self._after_write(rt)
        return current

    def _delete_custom_resources(self, crd: dict[str, Any]) -> None:
        # The CRD finalizer's work, done at once: a CRD's objects go with it.
        crd_type = resource_from_crd(crd)
        if crd_type is None:
            return
        prefix = crd_type.list_prefix(None)
        for kv in self.etcd.range(prefix, prefix_end(prefix), keys_only=True).kvs:
            self.etcd.delete(kv.key, mod_revision=kv.mod_revision)

    def _delete_namespace_contents(self, namespace: str) -> None:
        # The namespace controller's work, done at once (no Terminating phase).
        seen: set[bytes] = set()
        for rt in self.resource_types():
            if not rt.namespaced or rt.virtual:
                continue
            prefix = rt.list_prefix(namespace)
            if prefix in seen:
                continue
            seen.add(prefix)
            for kv in self.etcd.range(prefix, prefix_end(prefix), keys_only=True).kvs:
                self.etcd.delete(kv.key, mod_revision=kv.mod_revision)

    # ----- watch ----------------------------------------------------------
    def watch(
        self,
        rt: ResourceType,
        version: str,
        namespace: str | None,
        *,
        resource_version: str | None,
        predicate: Callable[[dict[str, Any]], bool],
        send_initial: bool,
    ) -> tuple[Iterator[WatchEvent | None], Callable[[], None]]:
        """Events from `resource_version` on; None items are keep-alive ticks."""
        prefix = rt.list_prefix(namespace)
        initial: list[dict[str, Any]] = []
        if send_initial or resource_version in (None, "", "0"):
            listed = self.list(rt, version, namespace, predicate=predicate)
            initial = listed.items
            start = int(listed.resource_version) + 1
        else:
            assert resource_version is not None
            start = int(resource_version) + 1
        events, cancel = self.etcd.watch(prefix, start_revision=start)
        gr = storage_group_resource(rt)

        def stream() -> Iterator[WatchEvent | None]:
            for obj in initial:
                yield WatchEvent("ADDED", obj)
            if send_initial:
                bookmark = {
                    "apiVersion": rt.group_version(version),
                    "kind": rt.kind,
                    "metadata": {
                        "resourceVersion": str(start - 1),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                }
                yield WatchEvent("BOOKMARK", bookmark)
            for batch in events:
                if isinstance(batch, Compacted):
                    yield WatchEvent(
                        "ERROR",
                        StatusError(410, "Expired", f"too old resource version: {start - 1}", details={}).body(),
                    )
                    return
                if isinstance(batch, Exception):
                    return
                if not batch:
                    yield None
                    continue
                for ev in batch:
                    if ev.type == "DELETE":
                        if ev.prev is None:
                            continue
                        obj = self.served(rt, version, self._decode(ev.prev, gr).obj, ev.kv.mod_revision)
                        if predicate(obj):
                            yield WatchEvent("DELETED", obj)
                        continue
                    obj = self.served(rt, version, self._decode(ev.kv, gr).obj, ev.kv)
                    now_match = predicate(obj)
                    was_match = False
                    if ev.prev is not None:
                        prev = self.served(rt, version, self._decode(ev.prev, gr).obj, ev.prev)
                        was_match = predicate(prev)
                    if now_match:
                        yield WatchEvent("MODIFIED" if ev.prev is not None and was_match else "ADDED", obj)
                    elif was_match:
                        yield WatchEvent("DELETED", obj)

        return stream(), cancel

    # ----- set-up ---------------------------------------------------------
    def ensure_default_namespaces(self) -> None:
        ns_type = next(rt for rt in self._builtins if rt.resource == "namespaces" and not rt.group)
        for name in DEFAULT_NAMESPACES:
            try:
                self.create(ns_type, "v1", None, {"metadata": {"name": name}}, manager="kube-apiserver")
            except StatusError as exc:
                if exc.code != 409:
                    raise


def _merge_string_data(secret: dict[str, Any]) -> None:
    """A Secret's `stringData` is write-only: merged into `data` (base64), overriding, never stored.

    As the v1 -> internal conversion of kube-apiserver does.
    """
    string_data = secret.pop("stringData", None)
    if not isinstance(string_data, dict) or not string_data:
        return
    data = dict(secret.get("data") or {})
    for key, value in string_data.items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    secret["data"] = data
