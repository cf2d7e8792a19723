"""What every path of the registry stands on: the resource types a server
serves, and the codec between an object as served and as stored in etcd.

Apart from reads, writes and watches (registry_reads.py, registry_writes.py,
registry_watch.py) because all three need it; `kubesim.registry.Registry` is
the whole (its docstring gives the semantics held to kube-apiserver).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

from kubesim import codec
from kubesim.crds import crd_established
from kubesim.errors import internal, resource_not_found
from kubesim.etcd import KV, EtcdStore, prefix_end
from kubesim.resources import ResourceType, builtin_resources, resource_from_crd
from kubesim.server_config import ServerConfig

CRD_PREFIX = b"/registry/apiextensions.k8s.io/customresourcedefinitions/"
# How stale the CRD cache may be (a real API server also takes a moment to serve a new CRD).
_CRD_RECHECK_SECONDS = 0.25


def storage_group_resource(rt: ResourceType) -> str:
    """The group-resource a type's objects are stored under (shared by events)."""
    res = rt.storage_resource or rt.resource
    return f"{res}.{rt.stored_group}" if rt.stored_group else res


class RegistryCore:
    """Resource types (built-ins as configured, CRDs as etcd holds them) and the storage codec."""

    def __init__(self, etcd: EtcdStore, config: ServerConfig | None = None) -> None:
        self.etcd = etcd
        self.config = config or ServerConfig()
        self.lock = threading.RLock()
        self._builtins = builtin_resources()
        self._builtin_types: tuple[tuple[object, ...], list[ResourceType]] | None = None
        self._crd_types: dict[tuple[str, str], ResourceType] = {}
        self._crd_revision = -1
        self._crd_checked_at = 0.0

    # ----- resource types -------------------------------------------------
    def _config_signature(self) -> tuple[object, ...]:
        """What the built-in types depend on: the gates, storage versions and verbs set."""
        cfg = self.config
        return (
            frozenset(cfg.feature_gates),
            tuple(cfg.storage_versions.items()),
            tuple((k, tuple(v)) for k, v in cfg.verbs.items()),
        )

    def builtin_types(self) -> list[ResourceType]:
        """The built-ins served, as configured (gates, storage versions, verbs).

        Asked for by every request (the lookup of its resource): built again only when
        the configuration differs from the last time (issue 29: rebuilding them took a
        twentieth of kubesim's CPU for a GET once every storage version was set)."""
        signature = self._config_signature()
        cached = self._builtin_types
        if cached is None or cached[0] != signature:
            cached = (signature, self._build_builtin_types())
            self._builtin_types = cached
        return list(cached[1])

    def _build_builtin_types(self) -> list[ResourceType]:
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
