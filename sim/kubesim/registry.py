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

The class is composed by concept: resource types and the storage codec
(registry_core.py), GET and LIST (registry_reads.py), writes
(registry_writes.py, with admission in registry_admission.py) and WATCH
(registry_watch.py).
"""

from __future__ import annotations

from kubesim.errors import StatusError
from kubesim.registry_core import storage_group_resource
from kubesim.registry_reads import ListResult
from kubesim.registry_watch import RegistryWatch, WatchEvent
from kubesim.registry_writes import RegistryWrites

__all__ = ["DEFAULT_NAMESPACES", "ListResult", "Registry", "WatchEvent", "storage_group_resource"]

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


class Registry(RegistryWrites, RegistryWatch):
    """The REST storage of one simulated API server."""

    # ----- set-up ---------------------------------------------------------
    def ensure_default_namespaces(self) -> None:
        ns_type = next(rt for rt in self._builtins if rt.resource == "namespaces" and not rt.group)
        for name in DEFAULT_NAMESPACES:
            try:
                self.create(ns_type, "v1", None, {"metadata": {"name": name}}, manager="kube-apiserver")
            except StatusError as exc:
                if exc.code != 409:
                    raise
