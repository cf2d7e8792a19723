"""The registry's write path: create, update (and patch, an update), delete,
each a compare-and-swap on etcd's mod_revision (optimistic concurrency).

The etcd side of a write (the no-op rule, the GuaranteedUpdate retry, dry runs,
what a delete takes with it); what the body must be and what the server makes
of it is admission (registry_admission.py). kubesim.registry's docstring gives
the semantics held to kube-apiserver.
"""

from __future__ import annotations

import copy
import random
import string
import uuid
from collections.abc import Callable
from typing import Any

from kubesim.admission_policies import admit, policies_written
from kubesim.errors import StatusError, already_exists, bad_request, conflict, not_found
from kubesim.etcd import prefix_end
from kubesim.managed_fields import fix_managed_fields, managed_fields_entry, now_rfc3339
from kubesim.patching import PatchError, apply_patch
from kubesim.registry_admission import check_body, merge_update, prepare_for_create, validate_name
from kubesim.registry_core import storage_group_resource
from kubesim.registry_reads import RegistryReads
from kubesim.resources import ResourceType, resource_from_crd

NAMESPACE_PREFIX = b"/registry/namespaces/"
_UPDATE_ATTEMPTS = 16


class RegistryWrites(RegistryReads):
    """Writes, reading the current object through the read path."""

    def _check_namespace(self, rt: ResourceType, namespace: str | None) -> None:
        if not rt.namespaced:
            return
        if not namespace:
            raise bad_request("the server could not find the requested resource: a namespace is required")
        kv, _ = self.etcd.get(NAMESPACE_PREFIX + namespace.encode())
        if kv is None:
            raise not_found("namespaces", "", namespace)

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
        body = check_body(rt, version, body, namespace)
        obj = copy.deepcopy(body)
        obj["apiVersion"] = rt.group_version(version)
        obj["kind"] = rt.kind
        meta = obj.setdefault("metadata", {})
        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            name = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        validate_name(rt, name)
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
        obj = prepare_for_create(rt, obj)
        admit(self, rt, version, namespace, obj, None, "CREATE", dry_run=dry_run)  # ValidatingAdmissionPolicies
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

    def _after_write(self, rt: ResourceType) -> None:
        if rt.resource == "customresourcedefinitions":
            self.refresh_crds(force=True)
        policies_written(self, rt)

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
            proposed = check_body(rt, version, proposed, namespace)
            new = merge_update(rt, version, current, proposed, subresource, name)
            admit(self, rt, version, namespace, new, current, "UPDATE", subresource=subresource, dry_run=dry_run)
            fix_managed_fields(new, current, manager, subresource)
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
